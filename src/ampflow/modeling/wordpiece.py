"""BERT's tokenizer in core TensorFlow ops: raw sentences in, `token_ids`/`segment_ids` out.

Core ops only (checked against `tf.raw_ops` in the tests), so a SavedModel that tokenizes in
its signature loads in any TF Serving, where tensorflow-text's ops may be missing. It runs
eagerly, in `tf.data.Dataset.map` and in a traced `tf.function`, and computes what Hugging
Face's `BertWordPieceTokenizer` computes (BasicTokenizer, greedy longest-match WordPiece,
`[CLS] … [SEP]`, `[PAD]`), except that a special token written in a sentence stays text, so a
client cannot forge the structure. How, and why that way: docs/explanation/design-notes.md,
"wordpiece.py".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from ampflow.errors import ConfigError, ModelConfigError
from ampflow.modeling.hf_bert import CONFIG_FILE, HfBertCheckpoint
from ampflow.modeling.wordpiece_table import CJK, MAPPED, REMOVE, SPACE, normalization_table

CONTINUATION = "##"
MAX_CHARS_PER_WORD = 100


class WordPieceTokenizer(tf.Module):
    """`tokenizer(texts)` → `{"token_ids", "segment_ids"}`, int32 `[batch, sequence_length]`."""

    def __init__(self, vocabulary: Sequence[str], *, do_lower_case: bool, sequence_length: int,
                 max_chars_per_word: int = MAX_CHARS_PER_WORD, name: str = "wordpiece"):
        super().__init__(name=name)
        if not isinstance(sequence_length, int) or sequence_length < 2:
            raise ConfigError("sequence_length must be an integer >= 2 ([CLS] and [SEP]). "
                              f"Received: sequence_length={sequence_length!r}")
        ids = {token: i for i, token in enumerate(vocabulary)}  # a repeated token: its last id
        missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]") if t not in ids]
        if missing:
            raise ConfigError(f"The vocabulary must hold [PAD], [UNK], [CLS] and [SEP]. "
                              f"Received: a vocabulary of {len(vocabulary)} without {missing}")
        self.sequence_length, self.do_lower_case = sequence_length, bool(do_lower_case)
        self.max_chars_per_word = int(max_chars_per_word)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id = (
            ids[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]"))
        self.longest_piece = max(len(t.removeprefix(CONTINUATION)) for t in ids)
        self._vocabulary = _static_table(list(ids), list(ids.values()), -1)
        table = normalization_table(self.do_lower_case)
        self._boundaries = tf.constant(table.boundaries)
        self._classes = tf.constant(table.classes)
        self._mapped = _static_table(list(table.mapped), list(table.mapped.values()), "",
                                     key_dtype=tf.int64)

    def __call__(self, texts) -> dict[str, tf.Tensor]:
        """Raw UTF-8 sentences `[batch]` → BERT's inputs, `[batch, sequence_length]` each.

        One sentence (a scalar: `tf.data.Dataset.map` before `batch`) → `[sequence_length]`.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        if texts.shape.rank == 0:
            return {k: v[0] for k, v in self(texts[None]).items()}
        pieces = self.tokenize(texts)[:, :self.sequence_length - 2]
        batch = pieces.nrows()
        cls = tf.fill([batch, 1], self.cls_id)
        sep = tf.fill([batch, 1], self.sep_id)
        packed = tf.concat([cls, pieces, sep], axis=1)
        token_ids = packed.to_tensor(self.pad_id, shape=[None, self.sequence_length])
        return {"token_ids": token_ids, "segment_ids": tf.zeros_like(token_ids)}

    def tokenize(self, texts) -> tf.RaggedTensor:
        """Raw sentences `[batch]` → their WordPiece ids `[batch, (pieces)]`, no [CLS]/[SEP]."""
        words = tf.strings.split(self.normalize(texts))
        pieces = self._wordpieces(words.flat_values)
        return tf.RaggedTensor.from_row_lengths(pieces, words.row_lengths()).merge_dims(1, 2)

    def normalize(self, texts) -> tf.Tensor:
        """BERT's BasicTokenizer: each sentence with its words separated by spaces."""
        texts = tf.convert_to_tensor(texts, tf.string)
        codepoints = tf.strings.unicode_decode(texts, "UTF-8", errors="replace")
        flat = codepoints.flat_values
        run = tf.searchsorted(self._boundaries, flat, side="right") - 1
        kind = tf.gather(self._classes, run)
        chars = tf.strings.unicode_encode(flat[:, None], "UTF-8")
        out = tf.where(kind == MAPPED, self._mapped.lookup(tf.cast(flat, tf.int64)), chars)
        out = tf.where(kind == REMOVE, "", tf.where(kind == SPACE, " ", out))
        out = tf.where(kind == CJK, tf.strings.join([" ", chars, " "]), out)  # else: itself
        return tf.strings.reduce_join(codepoints.with_flat_values(out), axis=-1)

    def _wordpieces(self, words: tf.Tensor) -> tf.RaggedTensor:
        """Words `[n]` → their pieces' ids `[n, (pieces)]`: greedy longest match first."""
        lengths = tf.strings.length(words, unit="UTF8_CHAR")
        width = tf.minimum(tf.reduce_max(tf.concat([lengths, [1]], 0)), self.max_chars_per_word)
        best_length, best_id = self._longest_matches(words, lengths, width)
        # the chain of starts: 0, then start + the longest match there (stuck where none);
        # starts[:, k] is the k-th piece's start
        positions = tf.range(width + 1)
        step = tf.concat([best_length, tf.zeros_like(best_length[:, :1])], axis=1)
        jump = tf.minimum(positions[None] + step, tf.minimum(lengths, width)[:, None])
        starts = _chain_from_zero(jump, width, self.max_chars_per_word)
        in_word = starts < lengths[:, None]
        found = tf.gather(best_length, tf.minimum(starts, width - 1), batch_dims=1) > 0
        ids = tf.gather(best_id, tf.minimum(starts, width - 1), batch_dims=1)
        unknown = (tf.reduce_any(in_word & ~found, axis=1)
                   | (lengths > self.max_chars_per_word))
        count = tf.where(unknown, 1, tf.reduce_sum(tf.cast(in_word, tf.int32), axis=1))
        ids = tf.where(unknown[:, None], self.unk_id, ids)
        return tf.RaggedTensor.from_tensor(ids, lengths=count)

    def _longest_matches(self, words, lengths, width):
        """For each word and start, the longest vocabulary piece there: `[n, width]` each.

        Its length in characters (0 for none) and its id.
        """
        n = tf.shape(words)[0]
        longest = min(self.longest_piece, self.max_chars_per_word)
        start = tf.range(width)[None, :, None]
        size = tf.range(1, longest + 1)[None, None, :]
        shape = tf.stack([n, width, longest])
        candidates = tf.strings.substr(tf.broadcast_to(words[:, None, None], shape),
                                       tf.broadcast_to(tf.minimum(start, lengths[:, None, None]),
                                                       shape),
                                       tf.broadcast_to(size, shape), unit="UTF8_CHAR")
        keys = tf.where(tf.broadcast_to(start > 0, shape),
                        tf.strings.join([CONTINUATION, candidates]), candidates)
        fits = tf.broadcast_to(start + size, shape) <= lengths[:, None, None]
        ids = tf.where(fits, tf.cast(self._vocabulary.lookup(keys), tf.int32), -1)
        length = tf.reduce_max(tf.where(ids >= 0, tf.broadcast_to(size, shape), 0), axis=2)
        best = tf.gather(ids, tf.maximum(length - 1, 0), batch_dims=2)
        return length, best


def checkpoint_tokenizer(checkpoint: HfBertCheckpoint, sequence_length: int) -> WordPieceTokenizer:
    """The tokenizer a checkpoint was pretrained with: its vocabulary and casing.

    `sequence_length` counts [CLS] and [SEP] and is at most the checkpoint's position table
    (`max_position_embeddings`): past it the encoder has no position to embed.
    """
    limit = checkpoint.config.max_position_embeddings
    if isinstance(sequence_length, int) and sequence_length > limit:
        raise ModelConfigError(
            f"sequence_length must be at most {limit}, the max_position_embeddings of "
            f"{checkpoint.directory / CONFIG_FILE}. Received: sequence_length={sequence_length}")
    return WordPieceTokenizer(checkpoint.vocabulary, do_lower_case=checkpoint.do_lower_case,
                              sequence_length=sequence_length)


def _chain_from_zero(jump: tf.Tensor, width, max_chars: int) -> tf.Tensor:
    """`[n, width]`: position k is jumpᵏ(0), by pointer doubling (7 bits for 100 characters)."""
    k = tf.range(width)
    positions = tf.zeros_like(jump[:, :1]) + tf.zeros_like(k)[None]
    power = jump
    for bit in range(max(1, int(np.ceil(np.log2(max_chars + 1))))):
        moved = tf.gather(power, positions, batch_dims=1)
        taken = tf.bitwise.bitwise_and(tf.bitwise.right_shift(k, bit), 1) == 1
        positions = tf.where(taken[None], moved, positions)
        power = tf.gather(power, power, batch_dims=1)
    return positions


def _static_table(keys: list, values: list, default, key_dtype=tf.string):
    """A static hash table (core ops: HashTableV2, LookupTableImportV2, LookupTableFindV2).

    Its integers are int64: TFLite's builtin hash table takes string→int64 and int64→string
    only, and the tables travel into a text SavedModel that convert turns into TFLite.
    """
    value_dtype = tf.string if isinstance(default, str) else tf.int64
    initializer = tf.lookup.KeyValueTensorInitializer(
        tf.constant(keys, key_dtype), tf.constant(values, value_dtype))
    return tf.lookup.StaticHashTable(initializer, default_value=default)
