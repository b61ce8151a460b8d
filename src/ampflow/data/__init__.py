"""The data library beneath the steps: the prepared dataset's contract and its readers.

prepare-data writes a prepared dir; train, evaluate, export, convert and deploy read it through
this package only (no step imports another). The readers import TensorFlow, so the names below
are imported on first use (PEP 562): `ampflow --help` must not pay for it.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what editors and type checkers see; at run time __getattr__ imports them
    from ampflow.data.dataset_info import DATASET_INFO_FILE, load_dataset_info
    from ampflow.data.input_pipeline import load_arrays, load_split, make_input_pipeline
    from ampflow.data.text_input import load_text_split, load_texts, make_text_pipeline

_EXPORTS = {
    "DATASET_INFO_FILE": "dataset_info",
    "load_dataset_info": "dataset_info",
    "load_arrays": "input_pipeline",
    "load_split": "input_pipeline",
    "make_input_pipeline": "input_pipeline",
    "load_text_split": "text_input",
    "load_texts": "text_input",
    "make_text_pipeline": "text_input",
}

__all__ = [
    "DATASET_INFO_FILE",
    "load_arrays",
    "load_dataset_info",
    "load_split",
    "load_text_split",
    "load_texts",
    "make_input_pipeline",
    "make_text_pipeline",
]


def __getattr__(name: str):
    """Import the submodule that defines `name` when it is first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
