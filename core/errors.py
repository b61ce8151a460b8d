"""The one small error hierarchy of ampflow.

Every error a user can cause (a wrong flag, an unknown dataset, a corrupt model dir, a failed
gate) is an `AmpflowError`. The CLI turns it into one clear line and a non-zero exit, with no
traceback; library callers can catch the precise subclass. Messages say what was expected and
what was received, in the Keras style.
"""


class AmpflowError(Exception):
    """Base class of every error ampflow raises on purpose."""

    exit_code = 1


class ConfigError(AmpflowError, ValueError):
    """A configuration value or CLI flag is invalid; raised before any compute starts."""

    exit_code = 2


class DatasetError(AmpflowError):
    """A dataset cannot be found, downloaded or read."""


class ModelLoadError(AmpflowError):
    """A model directory or file is missing, incomplete or corrupt."""


class TrainingDivergedError(AmpflowError):
    """Training stopped because the loss or the loss scale went bad (see the loss-scale guard)."""


class GateFailedError(AmpflowError):
    """A quality gate (FP32 parity, export parity, a TFLite variant) did not pass."""


class ExportError(AmpflowError):
    """A SavedModel could not be written or failed its post-export check."""


class ConversionError(AmpflowError):
    """A TFLite conversion failed; the message names the op, the reason and the fix."""


class ServingError(AmpflowError):
    """The model server or the gRPC client failed."""


class DeployError(AmpflowError):
    """A deployment could not be made or did not become healthy."""


class PipelineError(AmpflowError):
    """Compiling, running or submitting the Kubeflow pipeline failed."""
