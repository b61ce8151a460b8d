"""run_pretrain: the training split's texts → a masked-LM checkpoint in the Hugging Face layout.

Everything that can be refused is refused before TensorFlow trains a step: a folder that is not
a prepared dataset, a dataset of images (modalities.py), an output folder that exists (the
writer stages the checkpoint beside it and renames it into place, so a failed run leaves
nothing behind).
"""

from __future__ import annotations

import json

from ampflow.components.pretrain.config import (
    PretrainResult,
    PretrainStepConfig,
    vocabulary_named,
)
from ampflow.components.pretrain.modalities import check_corpus
from ampflow.errors import ConfigError


def run_pretrain(config: PretrainStepConfig) -> PretrainResult:
    """Pretrain on `config.data_dir`'s training texts and write `config.output_dir`."""
    from ampflow.data import load_dataset_info, load_texts
    from ampflow.modeling.pretrain import REPORT_FILE, pretrain_mlm

    check_corpus(load_dataset_info(config.data_dir), config.data_dir)  # before all else
    if config.output_dir.exists():
        raise ConfigError(f"output_dir {config.output_dir} exists: a checkpoint is written to "
                          "a new folder only, so nothing is overwritten. Choose another, or "
                          "remove it.")
    texts, _ = load_texts(config.data_dir, "train")  # never the test split
    try:
        directory = pretrain_mlm(texts, config.output_dir, config.library_config())
    except ConfigError as e:  # e.g. a vocabulary too small for the corpus's characters
        raise vocabulary_named(e) from e
    return PretrainResult(directory, json.loads((directory / REPORT_FILE).read_text()))
