"""A Keras 3 BERT encoder of exactly BERT's computation, and `load_hf_bert` to fill it.

It computes what Hugging Face's `BertModel` computes (embeddings, post-LN layers with erf GELU,
or its tanh form for `hidden_act: gelu_new` as keras-hub computes it, the tanh pooler), built
under the global dtype policy with the text models' AMP rules: the attention softmax and its
padding mask in float32, LayerNorm in float32, every variable float32, so the checkpoint's
weights are assigned bit for bit. It takes `{"token_ids", "segment_ids"}` and gives
`{"sequence_output", "pooled_output"}`; the mask comes from the padding id. The computation,
step by step: docs/explanation/design-notes.md, "bert.py".
"""

from __future__ import annotations

import math
import os

import keras
import numpy as np
from keras import ops

from ampflow.errors import ModelLoadError
from ampflow.modeling.hf_bert import BertConfig, HfBertCheckpoint, read_hf_bert

MASKED_SCORE = -1e9  # added in float32 only: a padding key's probability underflows to 0
INPUT_NAMES = ("token_ids", "segment_ids")
OUTPUT_NAMES = ("sequence_output", "pooled_output")


@keras.saving.register_keras_serializable(package="ampflow")
class BertPaddingMask(keras.layers.Layer):
    """Token ids `[batch, seq]` → `[batch, seq]` booleans, True where a token is (not `[PAD]`)."""

    def __init__(self, pad_id: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.pad_id = int(pad_id)

    def call(self, token_ids):
        return ops.not_equal(token_ids, self.pad_id)

    def compute_output_spec(self, token_ids):
        return keras.KerasTensor(token_ids.shape, dtype="bool")

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package="ampflow")
class BertEmbeddings(keras.layers.Layer):
    """Word + position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size: int, max_position_embeddings: int, type_vocab_size: int,
                 hidden_size: int, layer_norm_eps: float = 1e-12, dropout: float = 0.0,
                 **kwargs):
        super().__init__(**kwargs)
        self.sizes = (int(vocab_size), int(max_position_embeddings), int(type_vocab_size))
        self.hidden_size, self.layer_norm_eps = int(hidden_size), float(layer_norm_eps)
        self.rate = float(dropout)
        self.word_embeddings, self.position_embeddings, self.token_type_embeddings = (
            keras.layers.Embedding(rows, self.hidden_size, dtype=self.dtype_policy, name=name)
            for rows, name in zip(self.sizes, ("word_embeddings", "position_embeddings",
                                               "token_type_embeddings"), strict=True))
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_eps, dtype=self.dtype_policy, name="layer_norm")
        self.dropout = keras.layers.Dropout(self.rate, dtype=self.dtype_policy)

    def build(self, input_shape):
        for table in (self.word_embeddings, self.position_embeddings,
                      self.token_type_embeddings):
            table.build(input_shape[0])
        self.layer_norm.build((*input_shape[0], self.hidden_size))

    def call(self, inputs, training=None):
        token_ids, segment_ids = inputs
        positions = ops.arange(ops.shape(token_ids)[-1], dtype="int32")
        summed = (self.word_embeddings(token_ids) + self.position_embeddings(positions)[None]
                  + self.token_type_embeddings(segment_ids))
        return self.dropout(self.layer_norm(summed), training=training)

    def compute_output_shape(self, input_shape):
        return (*input_shape[0], self.hidden_size)

    def get_config(self):
        vocab, positions, types = self.sizes
        return {**super().get_config(), "vocab_size": vocab,
                "max_position_embeddings": positions, "type_vocab_size": types,
                "hidden_size": self.hidden_size, "layer_norm_eps": self.layer_norm_eps,
                "dropout": self.rate}


@keras.saving.register_keras_serializable(package="ampflow")
class BertSelfAttention(keras.layers.Layer):
    """BERT's multi-head self-attention, its softmax (and mask) in float32 under any policy.

    Query, key and value are `Dense(hidden)` layers, so a checkpoint's `[out, in]` Linear
    weights are their kernels transposed, with no reshaping by head.
    """

    def __init__(self, hidden_size: int, num_heads: int, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size, self.num_heads = int(hidden_size), int(num_heads)
        self.head_size = self.hidden_size // self.num_heads
        self.rate = float(dropout)
        self.query, self.key, self.value = (
            keras.layers.Dense(self.hidden_size, dtype=self.dtype_policy, name=name)
            for name in ("query", "key", "value"))
        # on the probabilities cast back to the compute dtype, as Keras's own attention does: a
        # float32 Dropout would be a hand-set dtype the AMP check warns about
        self.dropout = keras.layers.Dropout(self.rate, dtype=self.dtype_policy)

    def build(self, input_shape):
        for projection in (self.query, self.key, self.value):
            projection.build(input_shape[0])

    def call(self, inputs, training=None):
        hidden, mask = inputs
        query, key, value = (self._split_heads(p(hidden))
                             for p in (self.query, self.key, self.value))
        scores = ops.matmul(query, ops.transpose(key, (0, 1, 3, 2)))  # [batch, heads, q, k]
        scores = ops.cast(scores, "float32") / math.sqrt(self.head_size)
        scores = ops.where(mask[:, None, None, :], scores, MASKED_SCORE)
        probabilities = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
        context = ops.matmul(self.dropout(probabilities, training=training), value)
        context = ops.transpose(context, (0, 2, 1, 3))  # [batch, seq, heads, head]
        return ops.reshape(context, (ops.shape(context)[0], ops.shape(context)[1],
                                     self.hidden_size))

    def _split_heads(self, x):
        x = ops.reshape(x, (ops.shape(x)[0], ops.shape(x)[1], self.num_heads, self.head_size))
        return ops.transpose(x, (0, 2, 1, 3))

    def compute_output_shape(self, input_shape):
        return input_shape[0]

    def get_config(self):
        return {**super().get_config(), "hidden_size": self.hidden_size,
                "num_heads": self.num_heads, "dropout": self.rate}


@keras.saving.register_keras_serializable(package="ampflow")
class BertLayer(keras.layers.Layer):
    """One post-LN Transformer layer of BERT: attention and feed-forward, each residual + LN."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int,
                 layer_norm_eps: float = 1e-12, hidden_dropout: float = 0.0,
                 attention_dropout: float = 0.0, approximate_gelu: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size, self.num_heads = int(hidden_size), int(num_heads)
        self.approximate_gelu = bool(approximate_gelu)
        self.intermediate_size, self.layer_norm_eps = int(intermediate_size), float(layer_norm_eps)
        self.rates = (float(hidden_dropout), float(attention_dropout))
        policy = self.dtype_policy
        self.attention = BertSelfAttention(self.hidden_size, self.num_heads, self.rates[1],
                                           dtype=policy, name="attention")
        self.attention_output = keras.layers.Dense(self.hidden_size, dtype=policy,
                                                   name="attention_output")
        self.attention_layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_eps, dtype=policy, name="attention_layer_norm")
        self.intermediate = keras.layers.Dense(self.intermediate_size, dtype=policy,
                                               name="intermediate")
        self.output_dense = keras.layers.Dense(self.hidden_size, dtype=policy, name="output")
        self.output_layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_eps, dtype=policy, name="output_layer_norm")
        self.dropout = keras.layers.Dropout(self.rates[0], dtype=policy)

    def build(self, input_shape):
        hidden_shape = input_shape[0]
        self.attention.build(input_shape)
        for dense, inputs in ((self.attention_output, self.hidden_size),
                              (self.intermediate, self.hidden_size),
                              (self.output_dense, self.intermediate_size)):
            dense.build((*hidden_shape[:-1], inputs))
        self.attention_layer_norm.build(hidden_shape)
        self.output_layer_norm.build(hidden_shape)

    def call(self, inputs, training=None):
        hidden, mask = inputs
        attended = self.attention_output(self.attention([hidden, mask], training=training))
        hidden = self.attention_layer_norm(hidden + self.dropout(attended, training=training))
        inner = keras.activations.gelu(self.intermediate(hidden),
                                       approximate=self.approximate_gelu)
        out = self.dropout(self.output_dense(inner), training=training)
        return self.output_layer_norm(hidden + out)

    def compute_output_shape(self, input_shape):
        return input_shape[0]

    def get_config(self):
        return {**super().get_config(), "hidden_size": self.hidden_size,
                "num_heads": self.num_heads, "intermediate_size": self.intermediate_size,
                "layer_norm_eps": self.layer_norm_eps, "hidden_dropout": self.rates[0],
                "attention_dropout": self.rates[1], "approximate_gelu": self.approximate_gelu}


@keras.saving.register_keras_serializable(package="ampflow")
class BertFirstToken(keras.layers.Layer):
    """`[batch, seq, hidden]` → the first ([CLS]) position's vector, `[batch, hidden]`."""

    def call(self, hidden):
        return hidden[:, 0, :]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])


def bert_encoder(config: BertConfig, *, pad_id: int = 0, name: str = "bert") -> keras.Model:
    """BERT's encoder for `config`, its weights random until a checkpoint is assigned."""
    token_ids = keras.Input((None,), dtype="int32", name=INPUT_NAMES[0])
    segment_ids = keras.Input((None,), dtype="int32", name=INPUT_NAMES[1])
    mask = BertPaddingMask(pad_id, name="padding_mask")(token_ids)
    hidden = BertEmbeddings(
        config.vocab_size, config.max_position_embeddings, config.type_vocab_size,
        config.hidden_size, config.layer_norm_eps, config.hidden_dropout_prob,
        name="embeddings")([token_ids, segment_ids])
    for n in range(config.num_hidden_layers):
        hidden = BertLayer(config.hidden_size, config.num_attention_heads,
                           config.intermediate_size, config.layer_norm_eps,
                           config.hidden_dropout_prob, config.attention_probs_dropout_prob,
                           config.approximate_gelu, name=f"layer_{n}")([hidden, mask])
    first = BertFirstToken(name="cls_token")(hidden)
    pooled = keras.layers.Dense(config.hidden_size, activation="tanh", name="pooler")(first)
    return keras.Model(dict(zip(INPUT_NAMES, (token_ids, segment_ids), strict=True)),
                       dict(zip(OUTPUT_NAMES, (hidden, pooled), strict=True)), name=name)


def load_hf_bert(directory: str | os.PathLike) -> tuple[keras.Model, HfBertCheckpoint]:
    """The encoder of the Hugging Face BERT checkpoint in `directory`, every tensor assigned."""
    checkpoint = read_hf_bert(directory)
    encoder = bert_encoder(checkpoint.config, pad_id=checkpoint.pad_id)
    assign_hf_weights(encoder, checkpoint)
    return encoder, checkpoint


def assign_hf_weights(encoder: keras.Model, checkpoint: HfBertCheckpoint) -> None:
    """Assign each checkpoint tensor to its variable (Linear weights transposed to kernels)."""
    sources = variable_sources(encoder, checkpoint.config)
    unassigned = {id(v): v.path for v in encoder.weights}
    for variable, name, transpose in sources:
        value = checkpoint.tensors[name].T if transpose else checkpoint.tensors[name]
        if tuple(variable.shape) != value.shape:
            raise ModelLoadError(f"{checkpoint.directory}: expected {name} to fit "
                                 f"{variable.path} {tuple(variable.shape)}. Received: "
                                 f"{value.shape}")
        variable.assign(np.ascontiguousarray(value, dtype=variable.dtype))
        unassigned.pop(id(variable), None)
    if unassigned or len({name for _, name, _ in sources}) != len(checkpoint.tensors):
        raise ModelLoadError(f"{checkpoint.directory}: expected every variable of the encoder "
                             f"to take one of its {len(checkpoint.tensors)} tensors. Received: "
                             f"{sorted(unassigned.values())} without one")


def variable_sources(encoder: keras.Model, config: BertConfig) -> list[tuple]:
    """Each variable of `bert_encoder(config)`, its tensor's canonical name, transposed or not.

    A Linear weight (`[out, in]`) is a `Dense` kernel's transpose; every other tensor fits as is.
    """
    embeddings = encoder.get_layer("embeddings")
    sources = [(getattr(embeddings, table).embeddings, f"embeddings.{table}.weight", False)
               for table in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
    sources.extend(_layer_norm(embeddings.layer_norm, "embeddings.LayerNorm"))
    for n in range(config.num_hidden_layers):
        layer, prefix = encoder.get_layer(f"layer_{n}"), f"encoder.layer.{n}"
        for part in ("query", "key", "value"):
            sources.extend(_dense(getattr(layer.attention, part),
                                  f"{prefix}.attention.self.{part}"))
        sources.extend(_dense(layer.attention_output, f"{prefix}.attention.output.dense"))
        sources.extend(_layer_norm(layer.attention_layer_norm,
                                   f"{prefix}.attention.output.LayerNorm"))
        sources.extend(_dense(layer.intermediate, f"{prefix}.intermediate.dense"))
        sources.extend(_dense(layer.output_dense, f"{prefix}.output.dense"))
        sources.extend(_layer_norm(layer.output_layer_norm, f"{prefix}.output.LayerNorm"))
    sources.extend(_dense(encoder.get_layer("pooler"), "pooler.dense"))
    return sources


def _dense(layer, name: str) -> list[tuple]:
    return [(layer.kernel, f"{name}.weight", True), (layer.bias, f"{name}.bias", False)]


def _layer_norm(layer, name: str) -> list[tuple]:
    return [(layer.gamma, f"{name}.weight", False), (layer.beta, f"{name}.bias", False)]
