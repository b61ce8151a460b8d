"""Layers that the model builders use instead of Keras built-ins, for speed.

Keras 3's TF backend runs BatchNormalization unfused: it upcasts bfloat16/float16 activations to
float32 and computes moments and the normalization as separate memory-bound ops, forward and
backward. On ResNet-50 that work takes more than half of the step and caps the bfloat16 gain at
1.2× (benchmarks/results/train_throughput_diagnosis_resnet50.md). `FusedBatchNormalization`
routes the common case through TF's fused kernel (FusedBatchNormV3, oneDNN bf16 on CPUs, cuDNN
on GPUs), which reads half-precision activations directly and keeps its statistics in float32.
"""

from __future__ import annotations

import keras

# FusedBatchNormV3 rejects a smaller epsilon (the cuDNN minimum); smaller ones run unfused.
_MIN_FUSED_EPSILON = 1.001e-5
_FUSED_DTYPES = ("float16", "bfloat16", "float32")


@keras.saving.register_keras_serializable(package="ampflow")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization through TF's fused kernel, same weights, config and numbers as Keras's.

    Covers 4-D channels-last inputs (axis -1) without mask, renorm or cross-replica statistics:
    every BatchNormalization in keras.applications' ResNet50 and MobileNetV2. Anything else
    falls back to the parent implementation, so the layer is a drop-in replacement. The moving
    statistics follow Keras's update exactly (the biased batch variance, not the Bessel-corrected
    one that the fused kernel reports), so swapping the class does not change training.
    """

    def call(self, inputs, training=None, mask=None):
        """Normalize with the fused kernel where it applies, else as the parent does."""
        if not self._fusable(inputs, training, mask):
            return super().call(inputs, training=training, mask=mask)
        if training and self.trainable:
            return self._fused_train(inputs)
        return self._fused_infer(inputs)

    def _fusable(self, inputs, training, mask) -> bool:
        """Whether the fused kernel computes exactly what the parent would for this call."""
        # `renorm` exists only from Keras 3.14 (and `synchronized` is not in every 3.x): read
        # them with a default so the layer works across the declared keras range.
        return (
            mask is None
            and not getattr(self, "renorm", False)
            and not getattr(self, "synchronized", False)
            and len(inputs.shape) == 4
            and self.axis in (-1, 3)
            and self.epsilon >= _MIN_FUSED_EPSILON
            and keras.backend.standardize_dtype(inputs.dtype) in _FUSED_DTYPES
            and (training is None or isinstance(training, bool))  # a tensor: the generic way
        )

    def _scale_and_offset(self, channels: int):
        """gamma/beta in float32 (the kernel's parameter dtype); ones/zeros when disabled."""
        import tensorflow as tf

        gamma = self.gamma if self.scale else tf.ones((channels,), tf.float32)
        beta = self.beta if self.center else tf.zeros((channels,), tf.float32)
        return tf.convert_to_tensor(gamma), tf.convert_to_tensor(beta)

    def _fused_train(self, inputs):
        """Batch statistics, normalize, and update the moving averages as Keras does."""
        import tensorflow as tf

        gamma, beta = self._scale_and_offset(inputs.shape[-1])
        outputs, batch_mean, corrected_var, *_ = tf.raw_ops.FusedBatchNormV3(
            x=inputs, scale=gamma, offset=beta,
            mean=tf.constant([], tf.float32), variance=tf.constant([], tf.float32),
            epsilon=self.epsilon, exponential_avg_factor=1.0,
            data_format="NHWC", is_training=True,
        )
        # The kernel reports the unbiased variance n/(n-1)·var (and normalizes with the biased
        # one); Keras averages the biased one into moving_variance, so undo the correction.
        count = tf.cast(tf.reduce_prod(tf.shape(inputs)[:-1]), tf.float32)
        batch_var = corrected_var * (tf.maximum(count - 1.0, 1.0) / count)
        self.moving_mean.assign(
            self.moving_mean * self.momentum + batch_mean * (1.0 - self.momentum))
        self.moving_variance.assign(
            self.moving_variance * self.momentum + batch_var * (1.0 - self.momentum))
        return outputs

    def _fused_infer(self, inputs):
        """Normalize with the moving statistics (TFLite folds this op into the conv before it)."""
        import tensorflow as tf

        gamma, beta = self._scale_and_offset(inputs.shape[-1])
        outputs, *_ = tf.raw_ops.FusedBatchNormV3(
            x=inputs, scale=gamma, offset=beta,
            mean=tf.convert_to_tensor(self.moving_mean),
            variance=tf.convert_to_tensor(self.moving_variance),
            epsilon=self.epsilon, exponential_avg_factor=1.0,
            data_format="NHWC", is_training=False,
        )
        return outputs
