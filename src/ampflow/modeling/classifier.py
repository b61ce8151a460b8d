"""A pretrained BERT with a classification head on its pooled [CLS] output, ready to fine-tune.

What Hugging Face's `BertForSequenceClassification` and keras-hub's `BertTextClassifier` build:
the encoder's pooled output (tanh pooler over [CLS]), dropout at the checkpoint's hidden
dropout rate, then `num_classes` logits. The head follows ampflow's rule for every built-in
model (`heads.float32_head`): the `logits` Dense and the `probabilities` softmax in float32
whatever the policy, so the model returns float32 probabilities and every variable, the
checkpoint's included, stays float32 under `mixed_float16` and `mixed_bfloat16`. Inputs are
the encoder's: `token_ids` and `segment_ids`, int32 `[batch, max_sequence_length]`, the mask
from `[PAD]` (bert.py).
"""

from __future__ import annotations

from ampflow.errors import ConfigError, ModelConfigError
from ampflow.modeling.hf_bert import CONFIG_FILE, HfBertCheckpoint


def bert_classifier(checkpoint: HfBertCheckpoint, num_classes: int, max_sequence_length: int):
    """`keras.Model` {token_ids, segment_ids} → float32 probabilities `[batch, num_classes]`.

    Built under the current global policy, the checkpoint's tensors assigned to the encoder
    (bit for bit) and the head freshly initialized.
    """
    import keras

    from ampflow.modeling.bert import INPUT_NAMES, assign_hf_weights, bert_encoder
    from ampflow.modeling.heads import float32_head

    check_sizes(checkpoint, num_classes, max_sequence_length)
    encoder = bert_encoder(checkpoint.config, pad_id=checkpoint.pad_id, name="encoder")
    assign_hf_weights(encoder, checkpoint)
    inputs = {name: keras.Input((max_sequence_length,), dtype="int32", name=name)
              for name in INPUT_NAMES}
    pooled = encoder(inputs)["pooled_output"]
    pooled = keras.layers.Dropout(checkpoint.config.hidden_dropout_prob,
                                  name="head_dropout")(pooled)
    return keras.Model(inputs, float32_head(pooled, num_classes), name="bert_classifier")


def check_sizes(checkpoint: HfBertCheckpoint, num_classes, max_sequence_length) -> None:
    """The class count and sequence length a classifier on `checkpoint` can have: one line."""
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
        raise ConfigError(f"num_classes must be an integer >= 2. Received: "
                          f"num_classes={num_classes!r}")
    if (not isinstance(max_sequence_length, int) or isinstance(max_sequence_length, bool)
            or max_sequence_length < 2):
        raise ConfigError("max_sequence_length must be an integer >= 2 ([CLS] and [SEP]). "
                          f"Received: max_sequence_length={max_sequence_length!r}")
    limit = checkpoint.config.max_position_embeddings
    if max_sequence_length > limit:
        raise ModelConfigError(
            f"max_sequence_length must be at most {limit}, the position table of "
            f"{checkpoint.directory / CONFIG_FILE}. Received: "
            f"max_sequence_length={max_sequence_length}")
