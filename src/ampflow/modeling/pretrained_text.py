"""A pretrained BERT checkpoint as a text model of the pipeline: its tokenizer and classifier.

`--model DIR` (a Hugging Face directory or a keras-hub preset) trains, evaluates, exports and
converts like a built-in text model because both halves keep the text contract every step
shares: `CheckpointTokenizer` is `tokenizer.TextTokenizer`'s interface over the checkpoint's own
WordPiece (its vocabulary, casing, [CLS]/[SEP]/[PAD]; core TF ops, so it runs in `tf.data` and
inside `serving_default`), saved beside the model as `vocab.txt` + `tokenizer.json` (kind
`wordpiece`); `checkpoint_classifier` takes the text models' one input, int32 `token_ids`
`[batch, L]`, and ends in the float32 head (`heads.py`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import keras

from ampflow.errors import ConfigError
from ampflow.modeling.tokenizer import TOKENIZER_FILE, VOCAB_FILE

WORDPIECE_KIND = "wordpiece"
_FORMAT = 1


@dataclass(frozen=True)
class CheckpointTokenizerConfig:
    """What `tokenizer.json` records of a checkpoint's tokenizer (beside `vocab.txt`)."""

    max_sequence_length: int
    vocabulary_size: int
    do_lower_case: bool


class CheckpointTokenizer:
    """The checkpoint's WordPiece behind the text tokenizer's interface (`tokenize`, `save`)."""

    kind = WORDPIECE_KIND

    def __init__(self, vocabulary: list[str], *, do_lower_case: bool, sequence_length: int):
        from ampflow.modeling.wordpiece import WordPieceTokenizer

        self._vocabulary = list(vocabulary)
        self.config = CheckpointTokenizerConfig(sequence_length, len(self._vocabulary),
                                                bool(do_lower_case))
        self.wordpiece = WordPieceTokenizer(self._vocabulary, do_lower_case=do_lower_case,
                                            sequence_length=sequence_length)
        self.layer = self.wordpiece  # what a SavedModel tracks for the vocabulary's tables

    @property
    def sequence_length(self) -> int:
        """L, the ids' last dimension, [CLS] and [SEP] included."""
        return self.config.max_sequence_length

    @property
    def vocabulary(self) -> list[str]:
        """The checkpoint's tokens by id."""
        return list(self._vocabulary)

    @property
    def vocabulary_size(self) -> int:
        """The embedding table's rows: every id of the checkpoint's vocabulary."""
        return len(self._vocabulary)

    @property
    def pad_id(self) -> int:
        return self.wordpiece.pad_id

    def __call__(self, texts):
        return self.tokenize(texts)

    def tokenize(self, texts):
        """`tf.string` `[batch]` (or scalar) → int32 ids `[batch, L]` (or `[L]`): [CLS] … [SEP]."""
        return self.wordpiece(texts)["token_ids"]

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `vocab.txt` (the checkpoint's, one token a line) and `tokenizer.json`."""
        from ampflow.files import ensure_writable_dir, write_json_atomic

        directory = ensure_writable_dir(directory, "tokenizer directory")
        path = directory / VOCAB_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("\n".join(self._vocabulary) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        write_json_atomic(directory / TOKENIZER_FILE, {
            "format": _FORMAT, "kind": WORDPIECE_KIND,
            "max_sequence_length": self.sequence_length,
            "vocabulary_size": self.vocabulary_size, "vocabulary_in_use": self.vocabulary_size,
            "do_lower_case": self.config.do_lower_case, "padding_id": self.pad_id,
            "vocabulary_file": VOCAB_FILE, "library": "ampflow.modeling.wordpiece"})
        return path


def read_checkpoint_for(directory, max_sequence_length: int):
    """The checkpoint in `directory`; one line if `max_sequence_length` is past its table.

    Past `max_position_embeddings` the encoder has no position to embed.
    """
    from ampflow.errors import ModelConfigError
    from ampflow.modeling.hf_bert import CONFIG_FILE
    from ampflow.modeling.pretrained import read_pretrained_bert

    checkpoint = read_pretrained_bert(directory)
    limit = checkpoint.config.max_position_embeddings
    if max_sequence_length > limit:
        raise ModelConfigError(
            f"max_sequence_length must be at most {limit}, the max_position_embeddings of "
            f"{checkpoint.directory / CONFIG_FILE}. Received: "
            f"max_sequence_length={max_sequence_length}")
    return checkpoint


def checkpoint_text_tokenizer(checkpoint, sequence_length: int) -> CheckpointTokenizer:
    """The tokenizer `checkpoint` was pretrained with, at `sequence_length` (its table's limit)."""
    from ampflow.modeling.wordpiece import checkpoint_tokenizer

    checkpoint_tokenizer(checkpoint, sequence_length)  # the position table's one-line refusal
    return CheckpointTokenizer(list(checkpoint.vocabulary),
                               do_lower_case=checkpoint.do_lower_case,
                               sequence_length=sequence_length)


def load_checkpoint_tokenizer(directory: Path, settings: dict) -> CheckpointTokenizer:
    """A `CheckpointTokenizer` from what `save` wrote; a ConfigError naming what is wrong."""
    vocab_path = directory / VOCAB_FILE
    vocabulary = vocab_path.read_text(encoding="utf-8").split("\n")
    if vocabulary and vocabulary[-1] == "":
        vocabulary.pop()
    expected = settings.get("vocabulary_in_use")
    if len(vocabulary) != expected:
        raise ConfigError(f"{vocab_path} does not match {TOKENIZER_FILE}: expected {expected} "
                          f"tokens. Received: {len(vocabulary)}")
    try:
        return CheckpointTokenizer(vocabulary, do_lower_case=bool(settings["do_lower_case"]),
                                   sequence_length=int(settings["max_sequence_length"]))
    except KeyError as e:
        raise ConfigError(f"{directory / TOKENIZER_FILE} lacks {e}: "
                          f"{json.dumps(settings)[:200]}") from e


@keras.saving.register_keras_serializable(package="ampflow")
class SegmentZeros(keras.layers.Layer):
    """`token_ids` → int32 zeros of its shape: one sentence, segment 0, as BERT pretrained it."""

    def call(self, token_ids):
        return keras.ops.zeros_like(token_ids, dtype="int32")

    def compute_output_spec(self, token_ids):
        return keras.KerasTensor(token_ids.shape, dtype="int32")


def checkpoint_classifier(checkpoint, sequence_length: int, num_classes: int) -> keras.Model:
    """`token_ids` int32 `[batch, L]` → float32 probabilities, every tensor assigned.

    The encoder, [CLS]'s pooled output, dropout, then the float32 head, under the current policy.
    """
    from ampflow.modeling.bert import assign_hf_weights, bert_encoder
    from ampflow.modeling.classifier import _check
    from ampflow.modeling.heads import float32_head
    from ampflow.modeling.text_models import TOKEN_IDS_INPUT

    _check(checkpoint, num_classes, sequence_length)
    encoder = bert_encoder(checkpoint.config, pad_id=checkpoint.pad_id, name="encoder")
    assign_hf_weights(encoder, checkpoint)
    token_ids = keras.Input((sequence_length,), dtype="int32", name=TOKEN_IDS_INPUT)
    segments = SegmentZeros(name="segment_ids")(token_ids)
    pooled = encoder({"token_ids": token_ids, "segment_ids": segments})["pooled_output"]
    pooled = keras.layers.Dropout(checkpoint.config.hidden_dropout_prob,
                                  name="head_dropout")(pooled)
    return keras.Model(token_ids, float32_head(pooled, num_classes), name="bert_checkpoint")
