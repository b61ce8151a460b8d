"""The prepared dataset's contract: `dataset_info.json`, read by every step after prepare-data.

prepare-data writes it last (so a reader never sees a dataset whose metadata is missing); its
keys are listed in docs/ARTIFACTS.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ampflow.errors import DatasetError
from ampflow.files import read_json

DATASET_INFO_FILE = "dataset_info.json"


def load_dataset_info(prepared_dir: str | os.PathLike) -> dict[str, Any]:
    """Read `dataset_info.json` from a prepared dir; a missing one is a clear DatasetError."""
    path = Path(prepared_dir) / DATASET_INFO_FILE
    if not path.is_file():  # a flag that names no dataset: a configuration error (exit 2)
        from ampflow.errors import DatasetConfigError

        raise DatasetConfigError(
            f"{prepared_dir} is not a prepared dataset: expected {DATASET_INFO_FILE} in it "
            "(run `ampflow prepare-data` first)."
        )
    try:
        return read_json(path)
    except ValueError as e:
        raise DatasetError(f"{path} is corrupt: {e}") from e
