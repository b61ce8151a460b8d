"""Pretraining here: a vocabulary from the training texts, a masked-LM run, a checkpoint.

The checkpoint is what `train --model DIR` takes. The texts are the suite's shared text
folder (tests/tiny_text_model.py): every test text holds a word no training text has, so a
vocabulary built from the training split must not know it. The pretraining run is a few
steps of a 1-layer, 16-wide encoder.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_text_model import SEQ, TEST_ONLY_WORD, prepared_texts  # noqa: E402

from ampflow.errors import ConfigError  # noqa: E402
from ampflow.modeling.pretrain import PretrainConfig, initial_checkpoint, pretrain_mlm  # noqa: E402
from ampflow.modeling.wordpiece_vocab import (  # noqa: E402
    SPECIAL,
    VocabularyConfig,
    build_wordpiece_vocabulary,
)

TINY = PretrainConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                      max_sequence_length=SEQ, vocabulary=VocabularyConfig(size=120),
                      epochs=2, batch_size=8, steps_per_epoch=2, max_predictions=4, seed=1)
TEXTS = ["The film was good.", "The films were great!", "A naïve film, badly played.",
         "Films, films: playing, played, plays."]


@pytest.fixture(scope="module")
def train_texts(tmp_path_factory) -> list[str]:
    from ampflow.data import load_texts

    return load_texts(prepared_texts(tmp_path_factory), "train")[0]


@pytest.fixture(scope="module")
def pretrained(train_texts, tmp_path_factory) -> Path:
    """The tiny pretraining's checkpoint dir, run once for the module's two readers of it."""
    return pretrain_mlm(train_texts, tmp_path_factory.mktemp("pretrain") / "pretrained", TINY)


def test_the_vocabulary_is_bert_shaped_and_covers_every_training_word():
    from ampflow.modeling.wordpiece import WordPieceTokenizer

    vocabulary = build_wordpiece_vocabulary(TEXTS, VocabularyConfig(size=60, min_count=2))
    assert tuple(vocabulary[:5]) == SPECIAL and len(vocabulary) == len(set(vocabulary))
    assert len(vocabulary) <= 60
    assert {"film", "films", "the", ",", "##s"} <= set(vocabulary)  # frequent words, a tail
    assert "naïve" not in vocabulary and "i" in vocabulary  # lower-cased, accents stripped
    tokenizer = WordPieceTokenizer(vocabulary, do_lower_case=True, sequence_length=32)
    ids = tokenizer(TEXTS)["token_ids"].numpy()
    assert not (ids == vocabulary.index("[UNK]")).any()
    assert vocabulary == build_wordpiece_vocabulary(TEXTS, VocabularyConfig(size=60))


def test_a_size_too_small_for_the_characters_is_one_line():
    with pytest.raises(ConfigError, match="size must hold the special tokens and every "
                                          "character of the texts twice"):
        build_wordpiece_vocabulary(["abcdefghijklmnop"], VocabularyConfig(size=20))


@pytest.mark.slow  # its fixture pretrains an encoder: ~9 s
def test_a_tiny_pretraining_writes_a_checkpoint_train_takes(pretrained, tmp_path):
    from ampflow.modeling.bert import load_hf_bert
    from ampflow.modeling.models import make_text_model
    from ampflow.modeling.user_model import parse_model_spec

    directory = pretrained
    report = json.loads((directory / "pretraining.json").read_text())
    assert len(report["masked_lm_loss_per_epoch"]) == 2
    assert all(np.isfinite(report["masked_lm_loss_per_epoch"]))
    vocabulary = (directory / "vocab.txt").read_text().split("\n")[:-1]
    assert TEST_ONLY_WORD not in vocabulary  # built from the training split only
    encoder, checkpoint = load_hf_bert(directory)
    initial = load_hf_bert(initial_checkpoint(vocabulary, tmp_path / "initial", TINY,
                                              seed=TINY.seed))[0]
    moved = [w.path for w, w0 in zip(encoder.weights, initial.weights, strict=True)
             if not np.array_equal(np.asarray(w), np.asarray(w0))]
    assert "embeddings/word_embeddings/embeddings" in moved  # trained, from the same start
    assert "pooler/kernel" not in moved  # the masked-LM objective does not reach the pooler

    spec = parse_model_spec(str(directory), ("bert_tiny",))
    model = make_text_model(spec, SEQ, len(vocabulary), 3, policy="float32").model
    for mine, theirs in zip(model.get_layer("encoder").weights, encoder.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs), err_msg=mine.path)
    assert checkpoint.do_lower_case and checkpoint.config.max_position_embeddings == SEQ


@pytest.mark.slow  # a real `ampflow train` through the CLI: tens of seconds on a busy host
def test_train_fine_tunes_the_pretrained_checkpoint(pretrained, tmp_path_factory, tmp_path):
    from ampflow.cli import main

    directory = pretrained
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["train", "--data-dir", str(prepared_texts(tmp_path_factory)),
                     "--output-dir", str(tmp_path / "model"), "--model", str(directory),
                     "--precision", "float32", "--epochs", "1", "--steps-per-epoch", "2",
                     "--batch-size", "8", "--max-sequence-length", str(SEQ)])
    assert code == 0, out.getvalue()
    assert ((tmp_path / "model" / "vocab.txt").read_text()
            == (directory / "vocab.txt").read_text())
