"""BERT's masked-language-model objective: the masking rule and the prediction head.

The masking rule (the BERT paper, section 3.1 and appendix A.1; Hugging Face's
`DataCollatorForLanguageModeling`): each token that is not a special token (`[PAD]`, `[CLS]`,
`[SEP]`, ...) is chosen with probability 15 %, independently; a chosen token is replaced by
`[MASK]` 80 % of the time, by a random token 10 % of the time and left as it is 10 % of the
time, and only chosen positions carry a label (the original id) and a loss weight. The random
replacement is drawn from the non-special tokens (Hugging Face draws from the whole vocabulary,
special tokens included; a `[CLS]` in mid-sentence teaches nothing). Masks are drawn anew for
every epoch (RoBERTa's dynamic masking) from a seeded NumPy generator.

The head is BERT's `cls.predictions`: a Dense + GELU + LayerNorm transform of each position's
output, then logits against the word-embedding table itself (tied weights) plus a bias. The
loss is computed only at the chosen positions, gathered to `[batch, max_predictions]` as
BERT's own `masked_lm_positions` are, so the vocabulary-wide softmax is paid for 15 % of the
tokens, not all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
from keras import ops

IGNORED = -100  # the label of a position that was not chosen (Hugging Face's ignore index)


@dataclass(frozen=True)
class MaskedBatch:
    """A masked batch: the inputs, and for each position its label (IGNORED where not chosen)."""

    token_ids: np.ndarray  # int32 [batch, length], what the encoder sees
    labels: np.ndarray  # int32 [batch, length], the original id where chosen, else IGNORED


def mask_tokens(token_ids: np.ndarray, rng: np.random.Generator, *, special_ids,
                mask_id: int, vocab_size: int, rate: float = 0.15,
                max_predictions: int | None = None) -> MaskedBatch:
    """BERT's rule on `token_ids` `[batch, length]` (see the module docstring).

    With `max_predictions`, a sequence keeps only its first `max_predictions` chosen positions
    (the rest stay as they were, unlabelled), so every altered position carries a label.
    """
    token_ids = np.asarray(token_ids, np.int32)
    special = np.isin(token_ids, np.asarray(list(special_ids), np.int32))
    chosen = (rng.random(token_ids.shape) < rate) & ~special
    if max_predictions is not None:
        chosen &= np.cumsum(chosen, axis=1) <= max_predictions
    action = rng.random(token_ids.shape)
    ordinary = np.setdiff1d(np.arange(vocab_size, dtype=np.int32), list(special_ids))
    random_ids = ordinary[rng.integers(0, len(ordinary), token_ids.shape)]
    masked = np.where(chosen & (action < 0.8), mask_id, token_ids)
    masked = np.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, masked)
    labels = np.where(chosen, token_ids, IGNORED).astype(np.int32)
    return MaskedBatch(masked.astype(np.int32), labels)


def gather_predictions(labels: np.ndarray, max_predictions: int) -> tuple[np.ndarray, ...]:
    """Labels `[batch, length]` → BERT's `(positions, ids, weights)`, `[batch, P]` each.

    The chosen positions in order, padded with position 0, id 0 and weight 0.
    """
    batch = labels.shape[0]
    positions = np.zeros((batch, max_predictions), np.int32)
    ids = np.zeros((batch, max_predictions), np.int32)
    weights = np.zeros((batch, max_predictions), np.float32)
    for row in range(batch):
        where = np.flatnonzero(labels[row] != IGNORED)[:max_predictions]
        positions[row, :len(where)] = where
        ids[row, :len(where)] = labels[row, where]
        weights[row, :len(where)] = 1.0
    return positions, ids, weights


@keras.saving.register_keras_serializable(package="ampflow")
class MaskedLmHead(keras.layers.Layer):
    """BERT's `cls.predictions`: transform, LayerNorm, logits on the tied embedding table."""

    def __init__(self, hidden_size: int, vocab_size: int, layer_norm_eps: float = 1e-12,
                 approximate_gelu: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size, self.vocab_size = int(hidden_size), int(vocab_size)
        self.layer_norm_eps, self.approximate_gelu = float(layer_norm_eps), bool(approximate_gelu)
        self.transform = keras.layers.Dense(self.hidden_size, name="transform")
        self.layer_norm = keras.layers.LayerNormalization(epsilon=self.layer_norm_eps,
                                                          name="layer_norm")

    def build(self, input_shape):
        self.transform.build((None, None, self.hidden_size))
        self.layer_norm.build((None, None, self.hidden_size))
        self.output_bias = self.add_weight(shape=(self.vocab_size,), initializer="zeros",
                                           name="output_bias")

    def call(self, hidden, table):
        """`hidden` `[batch, P, hidden]`, `table` `[vocab, hidden]` → float32 logits."""
        x = keras.activations.gelu(self.transform(hidden), approximate=self.approximate_gelu)
        x = self.layer_norm(x)
        logits = ops.matmul(x, ops.transpose(ops.cast(table, x.dtype)))
        return ops.cast(logits, "float32") + self.output_bias

    def get_config(self):
        return {**super().get_config(), "hidden_size": self.hidden_size,
                "vocab_size": self.vocab_size, "layer_norm_eps": self.layer_norm_eps,
                "approximate_gelu": self.approximate_gelu}


class MaskedLmModel(keras.Model):
    """The encoder + the head: `{token_ids, segment_ids, positions}` → logits `[batch, P, V]`."""

    def __init__(self, encoder: keras.Model, config, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.head = MaskedLmHead(config.hidden_size, config.vocab_size, config.layer_norm_eps,
                                 config.approximate_gelu, name="masked_lm")

    def call(self, inputs, training=False):
        sequence = self.encoder({"token_ids": inputs["token_ids"],
                                 "segment_ids": inputs["segment_ids"]},
                                training=training)["sequence_output"]
        chosen = ops.take_along_axis(sequence, ops.expand_dims(inputs["positions"], -1), axis=1)
        table = self.encoder.get_layer("embeddings").word_embeddings.embeddings
        return self.head(chosen, table)
