"""The one small error hierarchy of ampflow.

Every error a user can cause (a wrong flag, an unknown dataset, a corrupt model dir, a failed
gate) is an `AmpflowError`. The CLI turns it into one clear line and a non-zero exit, with no
traceback; library callers can catch the precise subclass. Messages say what was expected and
what was received, in the Keras style.

The exit code is the error's class, one rule for every command:
- **2, usage or configuration**: the command was asked for something it cannot do, found
  before the work starts: a bad or unknown flag, a value out of range, a path that names no
  usable input (a missing data dir, an image folder with no or one class, a missing eval dir,
  a dir that is not a published model). `ConfigError` and its subclasses; argparse's own
  errors exit 2 too.
- **1, the run failed**: the work started and did not succeed: a failed gate, a diverged run,
  a file found corrupt while reading it, a server that does not answer, a disk that fills up.
- 130 on Ctrl-C and 141 when the reader of stdout went away (`ampflow ... | head -1`), as a
  shell reports a command ended by SIGINT or SIGPIPE.
"""


class AmpflowError(Exception):
    """Base class of every error ampflow raises on purpose."""

    exit_code = 1


class ConfigError(AmpflowError, ValueError):
    """A configuration value or CLI flag is invalid; raised before any compute starts."""

    exit_code = 2


class DatasetError(AmpflowError):
    """A dataset cannot be found, downloaded or read."""


class DatasetConfigError(DatasetError, ConfigError):
    """A dataset flag names no usable dataset (a configuration error: exit 2).

    A dir that was never prepared, a folder with no class sub-folders, one class or no
    readable image.
    """

    exit_code = 2


class ModelLoadError(AmpflowError):
    """A model directory or file is missing, incomplete or corrupt."""


class ModelConfigError(ModelLoadError, ConfigError):
    """A model flag names no model (a configuration error: exit 2; one found corrupt stays 1).

    A dir that is not a published model or holds no version, a missing eval dir.
    """

    exit_code = 2


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
