"""A pretrained BERT checkpoint as a text model of the pipeline: its tokenizer and classifier.

`--model DIR` (a Hugging Face directory or a keras-hub preset) trains, evaluates, exports and
converts like a built-in text model because both halves keep the text contract every step
shares: the tokenizer is the checkpoint's own WordPiece behind the text tokenizer's interface
(`tokenizer.CheckpointTokenizer`), and `checkpoint_classifier` takes the text models' one input,
int32 `token_ids` `[batch, L]`, and ends in the float32 head (`heads.py`).
"""

from __future__ import annotations

import keras


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
    from ampflow.modeling.classifier import check_sizes
    from ampflow.modeling.heads import float32_head
    from ampflow.modeling.text_models import TOKEN_IDS_INPUT

    check_sizes(checkpoint, num_classes, sequence_length)
    encoder = bert_encoder(checkpoint.config, pad_id=checkpoint.pad_id, name="encoder")
    assign_hf_weights(encoder, checkpoint)
    token_ids = keras.Input((sequence_length,), dtype="int32", name=TOKEN_IDS_INPUT)
    segments = SegmentZeros(name="segment_ids")(token_ids)
    pooled = encoder({"token_ids": token_ids, "segment_ids": segments})["pooled_output"]
    pooled = keras.layers.Dropout(checkpoint.config.hidden_dropout_prob,
                                  name="head_dropout")(pooled)
    return keras.Model(token_ids, float32_head(pooled, num_classes), name="bert_checkpoint")
