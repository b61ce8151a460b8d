"""Step 1: data preparation with tensorflow-datasets (any catalog name, or the offline default).

The names below are imported on first use (PEP 562), not with the package: the input pipeline
imports TensorFlow, and `ampflow --help` must not pay for that (it builds every command's
parser, which imports this package's config).
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what editors and type checkers see; at run time __getattr__ imports them
    from ampflow.components.prepare_data.config import (
        OFFLINE_DATASETS,
        OFFLINE_DEFAULT,
        PrepareDataConfig,
    )
    from ampflow.components.prepare_data.input_pipeline import (
        load_arrays,
        load_split,
        make_input_pipeline,
    )
    from ampflow.components.prepare_data.step import (
        PreparedData,
        load_dataset_info,
        run_prepare_data,
    )
    from ampflow.components.prepare_data.text_input import (
        load_text_split,
        load_texts,
        make_text_pipeline,
    )

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
    "load_text_split": "text_input",
    "load_texts": "text_input",
    "make_text_pipeline": "text_input",
}

__all__ = [
    "OFFLINE_DATASETS",
    "OFFLINE_DEFAULT",
    "PrepareDataConfig",
    "PreparedData",
    "load_arrays",
    "load_dataset_info",
    "load_split",
    "load_text_split",
    "load_texts",
    "make_input_pipeline",
    "make_text_pipeline",
    "run_prepare_data",
]


def __getattr__(name: str):
    """Import the submodule that defines `name` when it is first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
