"""Step 2: mixed-precision training with XLA, loss-scale telemetry and resumable checkpoints.

The names below are imported on first use (PEP 562), not with the package, so that building
the CLI parser (which reads `TrainConfig`) imports no TensorFlow or Keras. The model dir it
publishes is read back through `ampflow.artifacts.model_dir`, the models it builds live in
`ampflow.modeling`. The package's modules by role are mapped in docs/development.md.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what editors and type checkers see; at run time __getattr__ imports them
    from ampflow.components.train.config import TrainConfig
    from ampflow.components.train.step import TrainResult, run_train

_EXPORTS = {
    "TrainConfig": "config",
    "TrainResult": "step",
    "run_train": "step",
}

__all__ = ["TrainConfig", "TrainResult", "run_train"]


def __getattr__(name: str):
    """Import the submodule that defines `name` when it is first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
