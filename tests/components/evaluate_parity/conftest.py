"""Fixtures of the parity tests: a model whose float16 path is broken, its float32 path intact.

The broken model is honest: it is the session's trained mixed_float16 model with the first
conv layer's kernel and bias scaled by 1e5 and the second conv's kernel scaled by 1e-5. ReLU is
positively homogeneous (relu(c*z) = c*relu(z) for c > 0), so the float32 function is the same up
to float32 rounding, but the first layer's activations (~1e5) overflow float16's 65,504 to inf:
the failure that a parity gate exists to catch (activations outside the half-precision range).
Measured on 64 test images: 0.2 % of the first conv's float16 outputs are inf, 23 % after the
max-pooling, none after the third conv + ReLU: the logits stay finite but wrong (the test
accuracy fell by 64 points in one run).
"""

from __future__ import annotations

import shutil

import pytest

OVERFLOW_FACTOR = 1e5


def copy_model_dir(src, dst):
    """A writable copy of a published model dir (the session's cached ones must stay intact)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("tensorboard"))
    return dst


@pytest.fixture(scope="session")
def overflowing_float16_model(tmp_path_factory, trained_model):
    """A mixed_float16 model dir whose AMP path overflows while its float32 twin is intact."""
    import keras

    from ampflow.artifacts.model_dir import load_trained_model

    source = trained_model("mixed_float16")
    out = copy_model_dir(source, tmp_path_factory.mktemp("overflow") / "model")
    model, _ = load_trained_model(source)
    first, second = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)][:2]
    kernel, bias = first.get_weights()
    first.set_weights([kernel * OVERFLOW_FACTOR, bias * OVERFLOW_FACTOR])
    kernel, bias = second.get_weights()
    second.set_weights([kernel / OVERFLOW_FACTOR, bias])
    (out / "model.keras").unlink()
    model.save(out / "model.keras")
    return out
