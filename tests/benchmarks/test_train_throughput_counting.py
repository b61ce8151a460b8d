"""The training benchmark's FLOP count and bf16-goal verdict: its efficiency numbers."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "train_throughput.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("train_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flops_count_two_per_multiply_add_and_skip_the_first_input_gradient(bench):
    import keras

    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, padding="same")(inputs)  # 8·8·4 outputs × 3·3·1 MACs
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)  # 8·8·4 outputs × 3·3 MACs
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(2)(x)  # 256 × 2 MACs
    forward, training = bench._model_flops(keras.Model(inputs, outputs))
    conv, depthwise, dense = 2 * 8 * 8 * 4 * 9, 2 * 8 * 8 * 4 * 9, 2 * 256 * 2
    assert forward == conv + depthwise + dense
    # forward + weight gradient for all; + input gradient for all but the first layer
    assert training == 2 * conv + 3 * depthwise + 3 * dense


@pytest.mark.slow  # builds ResNet-50
def test_flops_of_nested_backbones_are_counted(bench):
    from ampflow.modeling.models import build_model

    forward, training = bench._model_flops(build_model("resnet50", (8, 8, 1), 10, image_size=32))
    assert 0.15e9 < forward < 0.17e9  # ResNet-50: 4.1 GMACs at 224², × (32/224)² × 2
    assert 2.9 < training / forward < 3.0


def _report(bf16_hardware: bool, ratio, fraction, device="CPU, 2 cores"):
    return {"device": device, "cpu": {"bf16_hardware": bf16_hardware, "onednn_isa": "x"},
            "rows": [{"policy": "mixed_bfloat16", "xla": False, "ratio_vs_float32": ratio,
                      "fraction_of_conv_peak": fraction},
                     {"policy": "mixed_bfloat16", "xla": True, "ratio_vs_float32": 9.0,
                      "fraction_of_conv_peak": 0.9}]}


@pytest.mark.parametrize(
    ("bf16_hardware", "ratio", "fraction", "status"),
    [(True, 1.7, 0.45, "met"), (True, 1.5, 0.45, "not met"), (True, 1.7, 0.30, "not met"),
     (False, 1.7, 0.45, "not applicable")],
)
def test_bf16_goal_verdict(bench, bf16_hardware, ratio, fraction, status):
    verdict = bench._bf16_goal(_report(bf16_hardware, ratio, fraction))
    assert verdict["status"].startswith(status)
    assert verdict["ratio_vs_float32"] == 1.6 and verdict["fraction_of_conv_peak"] == 0.4
