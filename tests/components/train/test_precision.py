import pytest

from ampflow.components.train.precision.policy import (
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


# ---- one rule of native formats: auto, autotune's candidates and check-model agree ----------

AVX2_ONLY = HardwareInfo(cpu_flags=frozenset({"avx", "avx2", "fma"}))
ZEN4 = HardwareInfo(cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16"}))
SAPPHIRE_RAPIDS = HardwareInfo(cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16",
                                                    "avx512_fp16", "amx_tile", "amx_bf16"}))
GRANITE_RAPIDS = HardwareInfo(cpu_flags=SAPPHIRE_RAPIDS.cpu_flags | {"amx_fp16"})
FP16_ONLY_CPU = HardwareInfo(cpu_flags=frozenset({"avx2", "avx512f", "avx512_fp16"}))

KINDS = [  # hardware, (float16 native, bfloat16 native), auto's policy
    (AVX2_ONLY, (False, False), "float32"),
    (FP16_ONLY_CPU, (False, False), "float32"),
    (ZEN4, (False, True), "mixed_bfloat16"),
    (SAPPHIRE_RAPIDS, (False, True), "mixed_bfloat16"),
    (GRANITE_RAPIDS, (False, True), "mixed_bfloat16"),
    (HardwareInfo(gpus=(P100,)), (False, False), "float32"),
    (HardwareInfo(gpus=(V100,)), (True, False), "mixed_float16"),
    (HardwareInfo(gpus=(A100,), cpu_flags=SAPPHIRE_RAPIDS.cpu_flags), (True, True),
     "mixed_float16"),
    (HardwareInfo(gpus=(GpuInfo("?", compute_capability=None),)), (False, False), "float32"),
    (HardwareInfo(tpu=True), (False, True), "mixed_bfloat16"),
]


@pytest.mark.parametrize(("hardware", "native", "auto"), KINDS)
def test_auto_autotune_and_check_model_follow_one_native_format_rule(hardware, native, auto):
    from ampflow.components.train.precision.autotune_rules import candidates
    from ampflow.components.train.precision.policy import native_format_notes, native_formats

    formats = native_formats(hardware)
    assert (formats.float16.native, formats.bfloat16.native) == native
    assert formats.float16.why and formats.bfloat16.why and formats.kind
    assert choose_policy("auto", hardware)[0] == auto
    expected = {"float32"} | {p for p, ok in zip(("mixed_float16", "mixed_bfloat16"), native,
                                                  strict=True) if ok}
    pairs, skipped = candidates(hardware)  # autotune's defaults
    assert {p for p, _ in pairs} == expected
    assert {r["policy"] for r in skipped if r["reason"].startswith("not native")} == {
        "mixed_float16", "mixed_bfloat16"} - expected
    for policy in ("float32", "mixed_float16", "mixed_bfloat16"):  # check-model's notes
        warns = len(native_format_notes(policy, formats)) > 1
        assert warns == (policy not in expected), policy


def test_avx512_fp16_on_a_cpu_does_not_make_float16_native_and_says_why():
    from ampflow.components.train.precision.policy import native_formats

    formats = native_formats(SAPPHIRE_RAPIDS)
    assert formats.kind == "CPU with AMX and AVX512_FP16"
    assert "avx512_fp16 present, but TF's float16 CPU kernels" in formats.float16.why
    assert "native_formats.md" in formats.float16.why


def test_an_explicit_policy_that_is_not_native_is_warned_of(caplog):
    with caplog.at_level("WARNING", logger="ampflow.components.train.precision.policy"):
        configure_precision("mixed_float16", None, SAPPHIRE_RAPIDS)
        configure_precision("mixed_bfloat16", None, SAPPHIRE_RAPIDS)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1
    assert warned[0].startswith("mixed_float16 is not native on this CPU with AMX and AVX512_FP16")


def test_the_native_formats_are_recorded_with_the_policy():
    setup = configure_precision("auto", None, ZEN4)
    block = setup.as_metadata()["precision"]["native_formats"]
    assert block["kind"] == "CPU with AVX512_BF16, no AMX"
    assert block["formats"]["bfloat16"]["native"] is True
    assert block["formats"]["float16"]["native"] is False
    assert setup.policy == "mixed_bfloat16" and "oneDNN" in setup.reason


def test_check_model_notes_a_policy_that_is_not_native_here(prepared_digits, capsys):
    import keras

    from ampflow.components.train.preflight.check_model import CheckModelConfig, run_check_model

    report = run_check_model(CheckModelConfig(data_dir=prepared_digits, model="small_cnn",
                                              precision="mixed_float16"), SAPPHIRE_RAPIDS)
    assert "native half-precision formats on this CPU with AMX and AVX512_FP16: bfloat16" in \
        report.notes[-2]
    assert report.notes[-1].startswith("mixed_float16 computes in float16, which is not native")
    assert "auto picks mixed_bfloat16" in report.notes[-1]
    assert "which is not native" in capsys.readouterr().out
    assert keras.mixed_precision.global_policy().name == "float32"  # restored


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_the_cpu_xla_reason_of_a_text_model_quotes_no_image_rate(policy):
    # a bert_tiny run was told "2.4 vs 187 img/s" (a CNN's images) for its own XLA setting
    cpu = HardwareInfo(cpu_flags=PLAIN_CPU)
    text_jit, text_reason = choose_jit(None, cpu, policy, modality="text")
    image_jit, image_reason = choose_jit(None, cpu, policy, modality="image")
    assert text_jit == image_jit == choose_jit(None, cpu, policy)[0]  # one rule for both
    assert "img/s" not in text_reason and "image" not in text_reason
    assert "texts/s" not in image_reason
    setup = configure_precision(policy, None, cpu, modality="text")
    assert setup.as_metadata()["xla"]["reason"] == text_reason
