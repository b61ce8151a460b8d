"""Step 1: data preparation with tensorflow-datasets (any catalog name, or the offline default).

The names below are imported on first use (PEP 562), not with the package: `ampflow --help`
must not pay for the step's imports. Reading a prepared dataset is the data library's
(`ampflow.data`), which every later step imports instead of this step.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what editors and type checkers see; at run time __getattr__ imports them
    from ampflow.components.prepare_data.config import (
        OFFLINE_DATASETS,
        OFFLINE_DEFAULT,
        PrepareDataConfig,
    )
    from ampflow.components.prepare_data.step import PreparedData, run_prepare_data

_EXPORTS = {
    "OFFLINE_DATASETS": "config",
    "OFFLINE_DEFAULT": "config",
    "PrepareDataConfig": "config",
    "PreparedData": "step",
    "run_prepare_data": "step",
}

__all__ = [
    "OFFLINE_DATASETS",
    "OFFLINE_DEFAULT",
    "PrepareDataConfig",
    "PreparedData",
    "run_prepare_data",
]


def __getattr__(name: str):
    """Import the submodule that defines `name` when it is first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
