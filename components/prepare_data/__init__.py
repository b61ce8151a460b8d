"""Step 1: data preparation with tensorflow-datasets (any catalog name, or the offline default).

The names below are imported on first use (PEP 562), not with the package: the input pipeline
imports TensorFlow, and `ampflow --help` must not pay for that (it builds every command's
parser, which imports this package's config).
"""

import importlib

_EXPORTS = {
    "load_arrays": "input_pipeline",
    "load_split": "input_pipeline",
    "make_input_pipeline": "input_pipeline",
    "OFFLINE_DATASETS": "config",
    "OFFLINE_DEFAULT": "config",
    "PrepareDataConfig": "config",
    "PreparedData": "step",
    "load_dataset_info": "step",
    "run_prepare_data": "step",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import the submodule that defines `name` when it is first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
