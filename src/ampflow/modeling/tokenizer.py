"""The text tokenizer: raw strings → int32 token ids `[batch, max_sequence_length]`, 0 = padding.

Keras `TextVectorization`: its ops are core TensorFlow ops, so the same layer runs in
`tf.data.map`, in a traced signature and in a SavedModel that TF Serving loads (keras-hub's
WordPiece needs tensorflow-text). Fitted on the training split only. The contract every text
step shares (`tokenize`, `padding_mask`, `save`/`load_tokenizer`) and why this tokenizer:
docs/explanation/design-notes.md, "tokenizer.py".
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.errors import ConfigError

VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
PADDING_ID = 0
OOV_TOKEN = "[UNK]"
OOV_ID = 1
STANDARDIZE = "lower_and_strip_punctuation"
# Padding and [UNK] are in every vocabulary: below 3 no word would be kept.
MIN_VOCABULARY_SIZE = 3
# BERT's own position table; longer sequences cost attention memory quadratically.
MAX_SEQUENCE_LENGTH = 4096
_FORMAT = 1  # tokenizer.json's version, for later readers


@dataclass(frozen=True)
class TokenizerConfig:
    """How text becomes token ids: the sequence length and how many words are kept.

    The fields' defaults and help are the CLI's (one declaration per fact): a step that takes
    text reads them from here.
    """

    max_sequence_length: int = field(default=128, metadata={
        "help": "Tokens per text: longer texts are cut, shorter ones padded with 0 (BERT's "
                "fine-tuning default is 128; attention costs grow with its square)."})
    vocabulary_size: int = field(default=20_000, metadata={
        "help": "Most frequent words of the training split kept in the vocabulary, padding and "
                "[UNK] included; the rest read as [UNK]. A split with fewer distinct words "
                "keeps them all."})

    def __post_init__(self) -> None:
        for name, value, low, high in (
                ("max_sequence_length", self.max_sequence_length, 1, MAX_SEQUENCE_LENGTH),
                ("vocabulary_size", self.vocabulary_size, MIN_VOCABULARY_SIZE, None)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low or (
                    high is not None and value > high):
                bound = f"between {low} and {high}" if high else f">= {low}"
                raise ConfigError(f"{name} must be an integer {bound}. Received: "
                                  f"{name}={value!r}")


class TextTokenizer:
    """A fitted `TextVectorization` and its settings: tokenize, mask, save, reload."""

    def __init__(self, layer, config: TokenizerConfig):
        self.layer = layer
        self.config = config

    @property
    def sequence_length(self) -> int:
        """L, the ids' last dimension."""
        return self.config.max_sequence_length

    @property
    def vocabulary(self) -> list[str]:
        """The tokens by id: `''` (padding), `[UNK]`, then the words, most frequent first."""
        return [str(token) for token in self.layer.get_vocabulary()]

    @property
    def vocabulary_size(self) -> int:
        """Ids in use (the model's embedding rows): at most `config.vocabulary_size`."""
        return int(self.layer.vocabulary_size())

    def __call__(self, texts):
        return self.tokenize(texts)

    def tokenize(self, texts):
        """`tf.string` `[batch]` (or scalar) → `int32` ids `[batch, L]` (or `[L]`).

        Plain TensorFlow ops: works eagerly, inside `tf.data.Dataset.map` and in a traced
        `tf.function` / SavedModel signature. A scalar is tokenized as a batch of one:
        TextVectorization pads a scalar's ids only when it holds a word (an empty scalar
        gives `[0]`, which breaks a `tf.data` element's fixed shape).
        """
        import tensorflow as tf

        texts = tf.convert_to_tensor(texts, tf.string)
        if texts.shape.rank == 0:
            return tf.cast(self.layer(texts[tf.newaxis]), tf.int32)[0]
        return tf.cast(self.layer(texts), tf.int32)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `vocab.txt` and `tokenizer.json` into `directory` (each atomically)."""
        from ampflow.files import ensure_writable_dir, write_json_atomic

        directory = ensure_writable_dir(directory, "tokenizer directory")
        vocabulary = self.vocabulary
        broken = [t for t in vocabulary if "\n" in t or "\r" in t]
        if broken:  # whitespace splitting never makes one; a changed split could
            raise ValueError(f"tokens with a line break cannot be written one per line: "
                             f"{broken[:3]}")
        path = directory / VOCAB_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        write_json_atomic(directory / TOKENIZER_FILE, {
            "format": _FORMAT, **asdict(self.config), "vocabulary_in_use": len(vocabulary),
            "standardize": STANDARDIZE, "split": "whitespace", "padding_id": PADDING_ID,
            "oov_token": OOV_TOKEN, "oov_id": OOV_ID, "vocabulary_file": VOCAB_FILE,
            "library": "keras.layers.TextVectorization"})
        return path


def padding_mask(token_ids):
    """1 where `token_ids` holds a token, 0 where it holds padding (int32, the same shape)."""
    import tensorflow as tf

    return tf.cast(tf.not_equal(token_ids, PADDING_ID), tf.int32)


def _vectorizer(config: TokenizerConfig, vocabulary: list[str] | None = None):
    import keras

    return keras.layers.TextVectorization(
        max_tokens=config.vocabulary_size, standardize=STANDARDIZE, split="whitespace",
        output_mode="int", output_sequence_length=config.max_sequence_length,
        vocabulary=vocabulary, name="text_vectorization")


def fit_tokenizer(texts: Any, config: TokenizerConfig | None = None) -> TextTokenizer:
    """Fit the vocabulary on `texts`: the TRAINING split's texts only.

    `texts` is a `tf.data.Dataset` of scalar or batched `tf.string`, or an iterable of `str`.
    A split without a single word is a ConfigError (there is nothing to learn a vocabulary of).
    """
    import tensorflow as tf

    config = config or TokenizerConfig()
    if isinstance(texts, tf.data.Dataset):
        dataset = texts if len(texts.element_spec.shape) else texts.batch(1024)
    else:
        texts = [t if isinstance(t, str) else _decoded(t) for t in _as_list(texts)]
        dataset = tf.data.Dataset.from_tensor_slices(tf.constant(texts, tf.string)
                                                     if texts else tf.zeros([0], tf.string))
        dataset = dataset.batch(1024)
    layer = _vectorizer(config)
    layer.adapt(dataset)
    if len(layer.get_vocabulary()) <= 2:
        raise ConfigError("the training texts hold no word to build a vocabulary from (empty, "
                          "or nothing but punctuation and spaces). Received: no token besides "
                          "padding and [UNK]")
    return TextTokenizer(layer, config)


def _as_list(texts: Iterable) -> list:
    if isinstance(texts, (str, bytes)):
        raise ConfigError("texts must be many texts (a list or a tf.data.Dataset), not one "
                          f"string. Received: {type(texts).__name__}")
    return list(texts)


def _decoded(text) -> str:
    if isinstance(text, bytes):
        return text.decode("utf-8")
    raise ConfigError(f"texts must be str or UTF-8 bytes. Received: {type(text).__name__}")


def load_tokenizer(directory: str | os.PathLike) -> TextTokenizer:
    """The tokenizer `TextTokenizer.save` wrote into `directory`; a ConfigError if incomplete."""
    directory = Path(directory)
    settings_path, vocab_path = directory / TOKENIZER_FILE, directory / VOCAB_FILE
    missing = [p.name for p in (settings_path, vocab_path) if not p.is_file()]
    if missing:
        raise ConfigError(f"{directory} holds no saved tokenizer: {', '.join(missing)} "
                          "missing (the train step writes both beside the model)")
    try:
        settings = json.loads(settings_path.read_text(encoding="utf-8"))
        vocabulary = vocab_path.read_text(encoding="utf-8").split("\n")
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{directory}'s tokenizer files are corrupt: {e}") from e
    if settings.get("kind") == "wordpiece":  # a pretrained checkpoint's own (pretrained_text.py)
        return load_checkpoint_tokenizer(directory, settings)
    if vocabulary and vocabulary[-1] == "":
        vocabulary.pop()  # the file's final newline
    expected = settings.get("vocabulary_in_use")
    if vocabulary[:2] != ["", OOV_TOKEN] or len(vocabulary) != expected:
        raise ConfigError(f"{vocab_path} does not match {TOKENIZER_FILE}: expected "
                          f"{expected} tokens starting with padding ('') and {OOV_TOKEN}. "
                          f"Received: {len(vocabulary)} tokens starting {vocabulary[:2]}")
    config = TokenizerConfig(max_sequence_length=settings["max_sequence_length"],
                             vocabulary_size=settings["vocabulary_size"])
    return TextTokenizer(_vectorizer(config, vocabulary), config)


def token_ids(tokenizer, texts: list[str]) -> np.ndarray:
    """int32 ids [N, L] of `texts`, by the tokenizer's own ops (the vocabulary's rule)."""
    return np.asarray(tokenizer.tokenize(np.asarray(texts, dtype=object)), dtype=np.int32)


# ---- a pretrained checkpoint's own WordPiece, behind the same interface ----------------------

WORDPIECE_KIND = "wordpiece"


@dataclass(frozen=True)
class CheckpointTokenizerConfig:
    """What `tokenizer.json` records of a checkpoint's tokenizer (beside `vocab.txt`)."""

    max_sequence_length: int
    vocabulary_size: int
    do_lower_case: bool


class CheckpointTokenizer:
    """The checkpoint's WordPiece behind the text tokenizer's interface (`tokenize`, `save`).

    Made from a checkpoint just read, it keeps it (`checkpoint`): the model a run builds takes
    its encoder from that same read, so ids and embedding rows cannot come from two reads of
    a directory that changed between them, and train reads it once. Loaded back from a model
    dir, it has none (the model dir holds the trained weights).
    """

    kind = WORDPIECE_KIND

    def __init__(self, vocabulary: list[str], *, do_lower_case: bool, sequence_length: int,
                 checkpoint=None):
        from ampflow.modeling.wordpiece import WordPieceTokenizer

        self.checkpoint = checkpoint  # an HfBertCheckpoint, or None
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


def checkpoint_text_tokenizer(checkpoint, sequence_length: int) -> CheckpointTokenizer:
    """The tokenizer `checkpoint` was pretrained with, at `sequence_length` (its table's limit)."""
    from ampflow.modeling.wordpiece import checkpoint_tokenizer

    checkpoint_tokenizer(checkpoint, sequence_length)  # the position table's one-line refusal
    return CheckpointTokenizer(list(checkpoint.vocabulary),
                               do_lower_case=checkpoint.do_lower_case,
                               sequence_length=sequence_length, checkpoint=checkpoint)


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
