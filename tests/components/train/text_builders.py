"""User text builders for the text tests, written into a scratch dir as a user's module.

`SOURCE` is the module's text (tests write it to `<tmp>/usertext.py` and pass the dir as
`--model-path`): builders called as `build(sequence_length, vocabulary_size, num_classes)`.
"""

import textwrap

MODULE = "usertext"
SOURCE = textwrap.dedent('''
    import keras
    from keras import layers, ops


    class HandAttention(layers.Layer):
        """One-head self-attention written by hand, masking padding with -1e9: the float16 trap
        (-1e9 is -inf in float16, and (1 - mask) * -inf is NaN where the mask keeps a score)."""

        def __init__(self, units=16, mask_value=-1e9, cast_mask=False, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.mask_value = mask_value
            self.cast_mask = cast_mask  # tf.cast(-1e9, dtype): a float32 constant, then a Cast
            self.query = layers.Dense(units, dtype=self.dtype_policy, name="query")
            self.key = layers.Dense(units, dtype=self.dtype_policy, name="key")
            self.value = layers.Dense(units, dtype=self.dtype_policy, name="value")

        def call(self, x, token_ids):
            scores = ops.matmul(self.query(x), ops.transpose(self.key(x), (0, 2, 1)))
            scores = scores / ops.sqrt(ops.cast(self.units, scores.dtype))
            keep = ops.cast(ops.not_equal(token_ids, 0), scores.dtype)[:, None, :]
            mask_value = self.mask_value
            if self.cast_mask:
                mask_value = ops.cast(ops.convert_to_tensor(mask_value, "float32"), scores.dtype)
            scores = scores + (1.0 - keep) * mask_value
            return ops.matmul(ops.softmax(scores, axis=-1), self.value(x))

        def get_config(self):
            return {**super().get_config(), "units": self.units, "mask_value": self.mask_value,
                    "cast_mask": self.cast_mask}


    class Float32SoftmaxHandAttention(HandAttention):
        """The fix the check advises: scores cast to float32, masked and softmaxed there."""

        def call(self, x, token_ids):
            scores = ops.matmul(self.query(x), ops.transpose(self.key(x), (0, 2, 1)))
            scores = ops.cast(scores, "float32") / ops.sqrt(float(self.units))
            keep = ops.cast(ops.not_equal(token_ids, 0), "float32")[:, None, :]
            scores = scores + (1.0 - keep) * self.mask_value
            weights = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
            return ops.matmul(weights, self.value(x))


    def _classifier(sequence_length, vocabulary_size, num_classes, **attention):
        ids = keras.Input((sequence_length,), dtype="int32", name="token_ids")
        x = layers.Embedding(vocabulary_size, 16, name="embed")(ids)
        layer = attention.pop("layer", HandAttention)
        x = layer(16, name="hand_attention", **attention)(x, ids)
        x = layers.GlobalAveragePooling1D(name="pool")(x)
        return keras.Model(ids, layers.Dense(num_classes, name="out")(x))


    def hand_attention(sequence_length, vocabulary_size, num_classes):
        return _classifier(sequence_length, vocabulary_size, num_classes)


    def hand_attention_float32_softmax(sequence_length, vocabulary_size, num_classes):
        return _classifier(sequence_length, vocabulary_size, num_classes,
                           layer=Float32SoftmaxHandAttention)


    def hand_attention_cast_mask(sequence_length, vocabulary_size, num_classes):
        return _classifier(sequence_length, vocabulary_size, num_classes, cast_mask=True)


    def hand_attention_safe_mask(sequence_length, vocabulary_size, num_classes):
        """The same layer with a mask value float16 holds (Keras's Softmax uses -3e4)."""
        return _classifier(sequence_length, vocabulary_size, num_classes, mask_value=-3e4)


    def hand_attention_float32(sequence_length, vocabulary_size, num_classes):
        """The attention layer's dtype set by hand: float32 math inside a float16 chain."""
        return _classifier(sequence_length, vocabulary_size, num_classes, dtype="float32")


    def keras_attention_with_dropout(sequence_length, vocabulary_size, num_classes):
        """Keras's MultiHeadAttention with attention dropout: its explicit path."""
        ids = keras.Input((sequence_length,), dtype="int32")
        x = layers.Embedding(vocabulary_size, 16)(ids)
        x = layers.MultiHeadAttention(2, 8, dropout=0.1, name="mha")(x, x)
        x = layers.GlobalAveragePooling1D()(x)
        return keras.Model(ids, layers.Dense(num_classes, activation="softmax")(x))


    def sequential(sequence_length, vocabulary_size, num_classes):
        """A Sequential without keras.Input: ampflow gives it the int32 token-id input."""
        return keras.Sequential([layers.Embedding(vocabulary_size, 8),
                                 layers.GlobalAveragePooling1D(), layers.Dense(num_classes)])


    def float_input(sequence_length, vocabulary_size, num_classes):
        ids = keras.Input((sequence_length,))  # float32: not token ids
        x = layers.Embedding(vocabulary_size, 8)(ids)
        return keras.Model(ids, layers.Dense(num_classes)(layers.GlobalAveragePooling1D()(x)))


    def wrong_length(sequence_length, vocabulary_size, num_classes):
        return hand_attention(sequence_length + 1, vocabulary_size, num_classes)


    def image_signature(input_shape, num_classes):
        return None
''')


def write_module(directory) -> str:
    """Write the builders' module into `directory`; return `directory` as a string."""
    (directory / f"{MODULE}.py").write_text(SOURCE)
    return str(directory)
