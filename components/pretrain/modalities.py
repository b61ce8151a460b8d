"""pretrain's side of the modality seam: a masked-LM corpus is texts, so images are refused.

The one place this step looks at a dataset's modality (tests/test_architecture.py keeps
image/text choices inside the seam's modules).
"""

from __future__ import annotations

import os
from typing import Any

from ampflow.data.modality import is_text
from ampflow.errors import DatasetConfigError


def check_corpus(info: dict[str, Any], data_dir: str | os.PathLike) -> None:
    """One line, exit 2, when the prepared dataset in `data_dir` is not one of texts."""
    if not is_text(info):
        raise DatasetConfigError(
            f"{data_dir} holds {info.get('modality', 'image')}s, not texts: masked-LM "
            "pretraining needs a text dataset (prepare-data --text-folder, --text-file or a "
            "TFDS text dataset).")
