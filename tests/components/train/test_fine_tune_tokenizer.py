"""A fine-tune (`--model some.keras`) on text reuses the tokenizer saved beside the model, and
warns only about the flags the user passed that it therefore does not use.

It warned `not --max-sequence-length 128 / --vocabulary-size 20000` on every fine-tune of a
model trained at another length, flags the user never typed (issue 46). A real tokenizer,
fitted and saved as train saves it; nothing trains.
"""

from __future__ import annotations

import logging

import pytest

from ampflow.components.train import TrainConfig
from ampflow.components.train.run.build import text_tokenizer
from ampflow.modeling.tokenizer import TokenizerConfig, fit_tokenizer

TEXT = {"modality": "text"}


@pytest.fixture(scope="module")
def saved_model_dir(tmp_path_factory):
    """A folder as train leaves it for a text model: its tokenizer at sequence length 16."""
    folder = tmp_path_factory.mktemp("tuned-from")
    texts = ["a superb film", "a dreadful film", "an odd story about a city"]
    fit_tokenizer(texts, TokenizerConfig(max_sequence_length=16, vocabulary_size=50)).save(folder)
    return folder


def _reused(saved_model_dir, tmp_path, caplog, **flags):
    config = TrainConfig(data_dir=tmp_path, output_dir=tmp_path / "out",
                         model=str(saved_model_dir / "model.keras"), **flags)
    with caplog.at_level(logging.INFO, logger="ampflow.components.train.run.build"):
        tokenizer = text_tokenizer(config, TEXT)
    assert tokenizer.sequence_length == 16  # the model's own, whatever the flags say
    return [r for r in caplog.records if "its own tokenizer" in r.getMessage()]


def test_a_fine_tune_without_text_flags_says_so_without_a_warning(saved_model_dir, tmp_path,
                                                                  caplog):
    (record,) = _reused(saved_model_dir, tmp_path, caplog)
    assert record.levelno == logging.INFO
    assert "sequence length 16" in record.getMessage() and "--" not in record.getMessage()


def test_a_fine_tune_warns_about_the_flag_given_and_only_that_one(saved_model_dir, tmp_path,
                                                                   caplog):
    (record,) = _reused(saved_model_dir, tmp_path, caplog, max_sequence_length=64)
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith(", not --max-sequence-length 64")


def test_a_flag_equal_to_the_saved_setting_is_no_warning(saved_model_dir, tmp_path, caplog):
    (record,) = _reused(saved_model_dir, tmp_path, caplog, max_sequence_length=16)
    assert record.levelno == logging.INFO
