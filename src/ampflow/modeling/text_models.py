"""Text models: BERT-style encoders in the shapes of Google's BERT miniatures and BERT-base.

`bert_tiny` L2/H128/A2, `bert_mini` L4/H256/A4, `bert_small` L4/H512/A8, `bert_base`
L12/H768/A12 (Turc et al. 2019, "Well-Read Students Learn Better"; Devlin et al. 2019), the
feed-forward 4H wide. Built from scratch (nothing can be downloaded here: a pretrained model is
fine-tuned from its `.keras` file, docs/how-to/text-models.md). Each takes int32 token ids
`[batch, length]` for any length up to `sequence_length`, the size of its position table (0 =
padding; the attention mask is derived from them), so a batch cut to its texts' length bucket
runs as it is (ampflow.modeling.length_buckets); it is:

token + position embeddings → LayerNorm → dropout → L × (multi-head self-attention → dropout →
add & LayerNorm → Dense 4H GELU → Dense H → dropout → add & LayerNorm), post-norm as BERT →
mean of the token vectors over the tokens (no [CLS] token: TextVectorization has none) →
BERT's pooler (Dense H, tanh) → dropout → the float32 head (`logits`, `probabilities`).

The layers are in text_layers.py. This module imports no TensorFlow until a model is built
(models.py registers the names when the CLI parses its flags).
"""

from __future__ import annotations

from dataclasses import dataclass

from ampflow.modeling.tokenizer import MAX_SEQUENCE_LENGTH

TOKEN_IDS_INPUT = "token_ids"  # the text models' input: int32 ids [batch, sequence_length]
LAYER_NORM_EPSILON = 1e-12  # BERT's; the normalization computes in float32 (Keras upcasts)
DROPOUT = 0.1  # BERT's hidden and attention dropout


@dataclass(frozen=True)
class EncoderShape:
    """Layers L, hidden size H, attention heads A; the feed-forward is 4H wide."""

    layers: int
    hidden: int
    heads: int

    @property
    def intermediate(self) -> int:
        """The feed-forward width."""
        return 4 * self.hidden


BERT_SHAPES = {
    "bert_tiny": EncoderShape(layers=2, hidden=128, heads=2),
    "bert_mini": EncoderShape(layers=4, hidden=256, heads=4),
    "bert_small": EncoderShape(layers=4, hidden=512, heads=8),
    "bert_base": EncoderShape(layers=12, hidden=768, heads=12),
}
# The encoders' default learning rate (train's --learning-rate when not given). Measured: from
# scratch on the offline Rotten Tomatoes snippets, bert_tiny with Adam at 3e-3 (the CNNs'
# default) stayed at the majority class (58 %), at 1e-3 it reached 75 % after one epoch
# (docs/how-to/text-models.md, "From scratch, here"). Fine-tuning a pretrained .keras encoder
# wants less still (BERT's 2e-5 to 5e-5): pass --learning-rate.
ENCODER_LEARNING_RATE = 1e-3
# Fine-tuning a pretrained BERT checkpoint: the peak of BERT's own range (2e-5, 3e-5, 5e-5).
CHECKPOINT_LEARNING_RATE = 3e-5


def bert_builder(name: str):
    """The builder of BERT shape `name`: `build(sequence_length, vocabulary_size, num_classes)`.

    The same contract as a user's text builder (src/ampflow/modeling/user_model.py).
    """
    shape = BERT_SHAPES[name]

    def build(sequence_length: int, vocabulary_size: int, num_classes: int):
        return build_encoder_classifier(shape, sequence_length, vocabulary_size, num_classes,
                                        name=name)

    return build


def build_encoder_classifier(shape: EncoderShape, sequence_length: int, vocabulary_size: int,
                             num_classes: int, *, name: str = "bert", dropout: float = DROPOUT):
    """A BERT-style classifier of `shape` under the current Keras global dtype policy."""
    import keras
    from keras import layers

    from ampflow.modeling.heads import float32_head
    from ampflow.modeling.text_layers import (
        AttentionMaskFromIds,
        Float32SoftmaxAttention,
        MaskedMeanPooling,
        TokenAndPositionEmbedding,
    )

    if not 1 <= sequence_length <= MAX_SEQUENCE_LENGTH:
        from ampflow.errors import ConfigError

        raise ConfigError(f"sequence_length must be between 1 and {MAX_SEQUENCE_LENGTH}. "
                          f"Received: sequence_length={sequence_length}")
    init = keras.initializers.TruncatedNormal(stddev=0.02)
    # any length up to the position table's: batches cut to their length bucket run as they are
    token_ids = keras.Input(shape=(None,), dtype="int32", name=TOKEN_IDS_INPUT)
    attention_mask = AttentionMaskFromIds(name="attention_mask")(token_ids)
    x = TokenAndPositionEmbedding(vocabulary_size, sequence_length, shape.hidden,
                                  name="embeddings")(token_ids)
    x = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="embeddings_norm")(x)
    x = layers.Dropout(dropout, name="embeddings_dropout")(x)
    for i in range(shape.layers):
        attention = Float32SoftmaxAttention(
            num_heads=shape.heads, key_dim=shape.hidden // shape.heads, dropout=dropout,
            kernel_initializer=init, name=f"encoder_{i}_attention")
        y = attention(x, x, attention_mask=attention_mask)
        y = layers.Dropout(dropout, name=f"encoder_{i}_attention_dropout")(y)
        x = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON,
                                      name=f"encoder_{i}_attention_norm")(layers.Add()([x, y]))
        y = layers.Dense(shape.intermediate, activation="gelu", kernel_initializer=init,
                         name=f"encoder_{i}_intermediate")(x)
        y = layers.Dense(shape.hidden, kernel_initializer=init, name=f"encoder_{i}_output")(y)
        y = layers.Dropout(dropout, name=f"encoder_{i}_output_dropout")(y)
        x = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON,
                                      name=f"encoder_{i}_output_norm")(layers.Add()([x, y]))
    pooled = MaskedMeanPooling(name="mean_pool")([x, token_ids])
    pooled = layers.Dense(shape.hidden, activation="tanh", kernel_initializer=init,
                          name="pooler")(pooled)
    pooled = layers.Dropout(dropout, name="pooler_dropout")(pooled)
    return keras.Model(token_ids, float32_head(pooled, num_classes), name=name)
