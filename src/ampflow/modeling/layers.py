"""Layers that the model builders use instead of Keras built-ins, for speed.

Keras 3's TF backend runs BatchNormalization unfused: it upcasts bfloat16/float16 activations to
float32 and computes moments and the normalization as separate memory-bound ops, forward and
backward. On ResNet-50 that work takes more than half of the step and caps the bfloat16 gain at
1.2× (benchmarks/results/train_throughput_diagnosis_resnet50.md). `FusedBatchNormalization`
routes the common case through TF's fused kernel (FusedBatchNormV3, oneDNN bf16 on CPUs, cuDNN
on GPUs), which reads half-precision activations directly and keeps its statistics in float32.
"""

from __future__ import annotations

import functools

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


# Largest output area (height × width) whose filter gradient is computed as one matmul. oneDNN's
# AMX weight-gradient kernel (brgconv_bwd_w) reduces over each image's output rows, a few values
# long at these sizes, and ran bf16 at float32 speed or slower (3×3×512→512 on 3×3: 4.5 vs 6.7
# GFLOP/s), while the same sums as one matmul over batch × height × width ran 36.7
# (benchmarks/results/train_bf16_gap_amx.md). Larger maps keep the kernel.
MATMUL_FILTER_GRADIENT_MAX_AREA = 36


@keras.saving.register_keras_serializable(package="ampflow")
class MatmulGradientConv2D(keras.layers.Conv2D):
    """Conv2D whose bfloat16 filter gradient on small maps is one matmul instead of oneDNN's kernel.

    Forward pass and input gradient are Conv2D's own ops; only dL/dkernel changes, and only when
    the compute dtype is bfloat16 on a CPU with AMX-BF16 (where the slow kernel was measured;
    without AMX oneDNN runs another one) and no GPU, for a plain 2-D convolution (channels last,
    no dilation, no groups) whose output is at most MATMUL_FILTER_GRADIENT_MAX_AREA values. The
    gradient is the same sum (each kernel tap's shifted input patches times the output gradient,
    summed over batch and positions), accumulated in float32 by oneDNN's matmul like the conv
    kernel does. Weights, config and inference are Conv2D's, so a float32 twin or an export sees
    a plain convolution.
    """

    def convolution_op(self, inputs, kernel):
        """Conv2D's convolution, with the matmul filter gradient where it applies."""
        if not self._matmul_filter_gradient(inputs):
            return super().convolution_op(inputs, kernel)
        import tensorflow as tf

        strides = (1, *self.strides, 1)
        padding = self.padding.upper()
        kernel = tf.convert_to_tensor(kernel)

        @tf.custom_gradient
        def conv(x, w):
            y = tf.nn.conv2d(x, w, strides, padding)

            def grad(dy):
                dx = tf.raw_ops.Conv2DBackpropInput(
                    input_sizes=tf.shape(x), filter=w, out_backprop=dy, strides=strides,
                    padding=padding)
                return dx, matmul_filter_gradient(x, dy, w.shape, self.strides, padding)

            return y, grad

        return conv(inputs, kernel)

    def _matmul_filter_gradient(self, inputs) -> bool:
        """Whether this call's filter gradient is the matmul one (see the class docstring)."""
        import tensorflow as tf

        shape = inputs.shape
        if (len(shape) != 4 or None in shape[1:] or self.data_format != "channels_last"
                or tuple(self.dilation_rate) != (1, 1) or self.groups != 1
                or keras.backend.standardize_dtype(inputs.dtype) != "bfloat16"
                or not cpu_has_amx() or tf.config.list_logical_devices("GPU")):
            return False
        out_h, out_w = (_output_size(n, k, s, self.padding) for n, k, s in
                        zip(shape[1:3], self.kernel_size, self.strides, strict=True))
        return out_h * out_w <= MATMUL_FILTER_GRADIENT_MAX_AREA


@functools.cache
def cpu_has_amx() -> bool:
    """Whether this CPU has AMX-BF16, whose oneDNN weight-gradient kernel the matmul replaces."""
    from ampflow.serving.cpu_features import read_cpu_flags

    return "amx_bf16" in read_cpu_flags()


def _output_size(size: int, kernel: int, stride: int, padding: str) -> int:
    if padding == "same":
        return -(-size // stride)
    return (size - kernel) // stride + 1


def matmul_filter_gradient(x, dy, kernel_shape, strides, padding: str):
    """dL/dkernel of a stride-`strides` NHWC convolution as one matmul: patches^T · dy.

    For each kernel tap (kh, kw) the input values it met are a strided slice of the padded
    input; the taps' slices side by side are the im2col matrix [batch·out_h·out_w, kh·kw·c_in],
    and its transpose times dy [batch·out_h·out_w, c_out] is the kernel's gradient.
    """
    import tensorflow as tf

    k_h, k_w, c_in, c_out = (int(d) for d in kernel_shape)
    s_h, s_w = strides
    out_h, out_w = int(dy.shape[1]), int(dy.shape[2])
    if padding == "SAME":
        pads = [max((out - 1) * s + k - n, 0) for out, s, k, n in
                ((out_h, s_h, k_h, int(x.shape[1])), (out_w, s_w, k_w, int(x.shape[2])))]
        x = tf.pad(x, [[0, 0], [pads[0] // 2, pads[0] - pads[0] // 2],
                       [pads[1] // 2, pads[1] - pads[1] // 2], [0, 0]])
    taps = [x[:, i:i + (out_h - 1) * s_h + 1:s_h, j:j + (out_w - 1) * s_w + 1:s_w, :]
            for i in range(k_h) for j in range(k_w)]
    patches = tf.reshape(taps[0] if len(taps) == 1 else tf.concat(taps, axis=-1),
                         [-1, k_h * k_w * c_in])
    gradient = tf.matmul(patches, tf.reshape(dy, [-1, c_out]), transpose_a=True)
    return tf.reshape(gradient, [k_h, k_w, c_in, c_out])
