import pytest

from ampflow.components.train.precision import (
    GpuInfo,
    HardwareInfo,
    choose_jit,
    choose_policy,
    configure_precision,
)
from ampflow.errors import ConfigError

V100 = GpuInfo("Tesla V100", compute_capability=(7, 0))
A100 = GpuInfo("A100", compute_capability=(8, 0))
P100 = GpuInfo("Tesla P100", compute_capability=(6, 0))
BF16_CPU = frozenset({"avx512f", "avx512_bf16"})
AMX_CPU = frozenset({"amx_bf16"})
PLAIN_CPU = frozenset({"avx2"})


@pytest.mark.parametrize(
    ("hardware", "expected"),
    [
        (HardwareInfo(gpus=(A100,)), "mixed_float16"),
        (HardwareInfo(gpus=(V100,)), "mixed_float16"),
        (HardwareInfo(gpus=(P100,)), "float32"),
        (HardwareInfo(tpu=True), "mixed_bfloat16"),
        (HardwareInfo(cpu_flags=BF16_CPU), "mixed_bfloat16"),
        (HardwareInfo(cpu_flags=AMX_CPU), "mixed_bfloat16"),
        (HardwareInfo(cpu_flags=PLAIN_CPU), "float32"),
        (HardwareInfo(gpus=(A100,), cpu_flags=BF16_CPU), "mixed_float16"),
    ],
)
def test_choose_policy_auto_follows_the_hardware(hardware, expected):
    policy, reason = choose_policy("auto", hardware)
    assert policy == expected
    assert reason  # every choice says why


def test_choose_policy_explicit_request_wins_and_names_auto_choice():
    policy, reason = choose_policy("float32", HardwareInfo(gpus=(A100,)))
    assert policy == "float32"
    assert "auto would pick mixed_float16" in reason


def test_choose_policy_unknown_is_a_config_error():
    with pytest.raises(ConfigError, match="Received: precision='fp8'"):
        choose_policy("fp8", HardwareInfo())


@pytest.mark.parametrize(
    ("requested", "hardware", "policy", "expected"),
    [
        (None, HardwareInfo(gpus=(A100,)), "mixed_float16", True),
        (None, HardwareInfo(tpu=True), "mixed_bfloat16", True),
        (None, HardwareInfo(cpu_flags=BF16_CPU), "mixed_bfloat16", False),
        (None, HardwareInfo(cpu_flags=BF16_CPU), "mixed_float16", True),
        (None, HardwareInfo(), "float32", False),
        (True, HardwareInfo(), "float32", True),
        (False, HardwareInfo(gpus=(A100,)), "mixed_float16", False),
    ],
)
def test_choose_jit_auto_and_explicit(requested, hardware, policy, expected):
    jit, reason = choose_jit(requested, hardware, policy)
    assert jit is expected and reason


def test_configure_precision_sets_global_policy_and_reports_loss_scaling():
    import keras

    setup = configure_precision("mixed_float16", None, HardwareInfo(cpu_flags=PLAIN_CPU))
    assert keras.mixed_precision.global_policy().name == "mixed_float16"
    assert setup.compute_dtype == "float16" and setup.loss_scaling
    meta = setup.as_metadata()
    assert meta["precision"]["loss_scaling"] == "dynamic"
    assert meta["xla"]["effective"] is True
