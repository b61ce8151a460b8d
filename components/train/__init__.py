"""Step 2: mixed-precision training with XLA, loss-scale telemetry and resumable checkpoints.

The names below are imported on first use (PEP 562), not with the package, so that building
the CLI parser (which reads `TrainConfig`) imports no TensorFlow or Keras. `load_trained_model`
registers the custom layers (`layers.py`) itself before it loads a model; `load_trained` also
gives a text model's tokenizer (the model dir's contract: `artifacts.py`). The package's
modules by role are mapped in docs/development.md ("train/ by role").
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what editors and type checkers see; at run time __getattr__ imports them
    from ampflow.components.train.artifacts import TrainedModel, load_trained, load_trained_model
    from ampflow.components.train.config import TrainConfig
    from ampflow.components.train.step import TrainResult, run_train

_EXPORTS = {
    "TrainConfig": "config",
    "TrainResult": "step",
    "TrainedModel": "artifacts",
    "load_trained": "artifacts",
    "load_trained_model": "artifacts",
    "run_train": "step",
}

__all__ = ["TrainConfig", "TrainResult", "TrainedModel", "load_trained", "load_trained_model",
           "run_train"]


def __getattr__(name: str):
    """Import the submodule that defines `name` when it is first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
