"""The layers of ampflow's text encoders, written for mixed precision and for full_int8 TFLite.

AMP: the attention softmax runs in float32 on both of Keras's attention paths
(`Float32SoftmaxAttention`), masks use values the compute dtype holds, LayerNorm computes in
float32, and the padding mask comes from the ids (0 = padding). full_int8: a padded position's
score is put `MASK_PENALTY` below the row's lowest score by arithmetic (a -1e9 select would
stretch the scores' shared int8 scale until every score quantized to 0), and the mean pooling's
weights are a softmax of that penalty (no run-time DIV). In float32 both give Keras's numbers
to within e^-MASK_PENALTY per padded position. Each rule and its measurement:
docs/explanation/design-notes.md, "text_layers.py", and docs/how-to/text-models.md.
"""

from __future__ import annotations

import keras
from keras import ops

from ampflow.modeling.tokenizer import PADDING_ID

# How far below the row's lowest score a padded position's is put before the softmax: its
# weight is then at most e^-30 (1e-13) of any token's, whatever the scores, so even 4096 of them
# change no float32 probability. Bounded, so an int8 quantization of the penalised scores
# keeps their resolution: their range grows by 30, not by 1e9 (docs/how-to/text-models.md).
MASK_PENALTY = 30.0


def penalised(scores, mask):
    """float32 `scores` where `mask` (bool) keeps them; elsewhere their row's min - penalty.

    By multiplying and adding, never selecting (see the module's docstring). The softmax of
    the result, set to 0 where the mask masks, is the masked softmax: a row the mask leaves
    empty gives zeros, as Keras's `Softmax` does.
    """
    scores = ops.cast(scores, "float32")
    keep = ops.cast(mask, "float32")
    floor = ops.min(scores, axis=-1, keepdims=True) - MASK_PENALTY
    return scores * keep + floor * (1.0 - keep)


@keras.saving.register_keras_serializable(package="ampflow")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding + learned position embedding (BERT's, without segment embeddings)."""

    def __init__(self, vocabulary_size: int, sequence_length: int, hidden_size: int,
                 initializer_range: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = int(vocabulary_size)
        self.sequence_length = int(sequence_length)
        self.hidden_size = int(hidden_size)
        self.initializer_range = float(initializer_range)
        init = keras.initializers.TruncatedNormal(stddev=self.initializer_range)
        self.token_embedding = keras.layers.Embedding(
            self.vocabulary_size, self.hidden_size, embeddings_initializer=init,
            dtype=self.dtype_policy, name="token_embedding")
        self.position_embedding = keras.layers.Embedding(
            self.sequence_length, self.hidden_size, embeddings_initializer=init,
            dtype=self.dtype_policy, name="position_embedding")

    def build(self, input_shape):
        self.token_embedding.build(input_shape)
        self.position_embedding.build((self.sequence_length,))

    def call(self, token_ids):
        positions = ops.arange(ops.shape(token_ids)[-1], dtype="int32")
        return self.token_embedding(token_ids) + self.position_embedding(positions)[None]

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.hidden_size)

    def get_config(self):
        return {**super().get_config(), "vocabulary_size": self.vocabulary_size,
                "sequence_length": self.sequence_length, "hidden_size": self.hidden_size,
                "initializer_range": self.initializer_range}


@keras.saving.register_keras_serializable(package="ampflow")
class AttentionMaskFromIds(keras.layers.Layer):
    """Token ids `[batch, seq]` → the boolean attention mask `[batch, 1, seq]` (key is a token).

    Broadcast over the query positions: every position attends to the tokens only, never to
    padding (id 0).
    """

    def call(self, token_ids):
        return ops.expand_dims(ops.not_equal(token_ids, PADDING_ID), axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1, input_shape[-1])

    def compute_output_spec(self, token_ids):
        return keras.KerasTensor(self.compute_output_shape(token_ids.shape), dtype="bool")


@keras.saving.register_keras_serializable(package="ampflow")
class Float32SoftmaxAttention(keras.layers.MultiHeadAttention):
    """`MultiHeadAttention` whose softmax of the attention scores runs in float32 on every path.

    Same weights, config and results as Keras's layer under float32; under a mixed policy the
    projections and both products stay in the compute dtype and only the softmax (with its
    mask) is float32: the scores are cast up on the way in, the probabilities back down.
    """

    def _build_attention(self, rank):
        super()._build_attention(rank)
        self._softmax = keras.layers.Softmax(axis=self._softmax.axis, dtype="float32",
                                             name="softmax_float32")

    def _masked_softmax(self, attention_scores, attention_mask=None):
        if attention_mask is None:
            probabilities = self._softmax(attention_scores)
        else:  # Keras's mask expansion, then the penalty added (int8-friendly)
            axis = -len(self._attention_axes) * 2 - 1
            for _ in range(len(attention_scores.shape) - len(attention_mask.shape)):
                attention_mask = ops.expand_dims(attention_mask, axis=axis)
            attention_mask = ops.cast(attention_mask, "bool")
            probabilities = ops.where(
                attention_mask, self._softmax(penalised(attention_scores, attention_mask)), 0.0)
        return ops.cast(probabilities, self.compute_dtype)


@keras.saving.register_keras_serializable(package="ampflow")
class MaskedMeanPooling(keras.layers.Layer):
    """The mean of the token vectors over the tokens only (padding left out): `[batch, hidden]`.

    Each vector is weighted by 1/count before the sum, so the sum never exceeds the vectors'
    own size, whatever the sequence length, in float16 too. The weights are the masked softmax
    of zeros (1/count for each token, computed in float32), not mask / count: no division at
    run time, which full_int8 TFLite cannot always do (module docstring). An all-padding text
    (an empty string) pools to zeros, not NaN.
    """

    def call(self, inputs):
        hidden, token_ids = inputs
        mask = ops.not_equal(token_ids, PADDING_ID)
        weights = ops.where(mask, ops.softmax(penalised(ops.zeros(ops.shape(token_ids)), mask),
                                              axis=-1), 0.0)
        return ops.sum(hidden * ops.expand_dims(ops.cast(weights, hidden.dtype), -1), axis=1)

    def compute_output_shape(self, input_shape):
        hidden_shape, _ = input_shape
        return (hidden_shape[0], hidden_shape[-1])
