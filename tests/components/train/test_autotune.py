"""`ampflow train --autotune`: which candidates are measured, and a real measured choice."""

from __future__ import annotations

import pytest

from ampflow.components.train import TrainConfig, load_trained_model, run_train
from ampflow.components.train.autotune import candidates
from ampflow.components.train.precision import GpuInfo, HardwareInfo
from ampflow.errors import ConfigError

BF16_CPU = HardwareInfo(cpu_flags=frozenset({"avx512f", "avx512_bf16", "amx_bf16"}))
PLAIN_CPU = HardwareInfo(cpu_flags=frozenset({"avx512f"}))
VOLTA = HardwareInfo(gpus=(GpuInfo("V100", compute_capability=(7, 0)),))
AMPERE = HardwareInfo(gpus=(GpuInfo("A100", compute_capability=(8, 0)),))


def _measured(hardware, policies=None):
    pairs, skipped = candidates(hardware, policies)
    return pairs, {(r["policy"], r["xla"]) for r in skipped}


def test_bf16_cpu_measures_float32_first_then_the_rules_choice_and_skips_float16():
    pairs, skipped = _measured(BF16_CPU)
    assert pairs == [("float32", False), ("mixed_bfloat16", False), ("float32", True),
                     ("mixed_bfloat16", True)]
    assert skipped == {("mixed_float16", False), ("mixed_float16", True)}


def test_cpu_without_bf16_measures_float32_only():
    pairs, skipped = _measured(PLAIN_CPU)
    assert pairs == [("float32", False), ("float32", True)]
    assert ("mixed_bfloat16", False) in skipped


def test_gpus_measure_what_their_compute_capability_supports():
    assert _measured(VOLTA)[0][:2] == [("float32", False), ("mixed_float16", True)]
    assert ("mixed_bfloat16", True) in _measured(VOLTA)[1]
    assert {p for p, _ in _measured(AMPERE)[0]} == {"float32", "mixed_bfloat16",
                                                     "mixed_float16"}


def test_explicit_policies_are_measured_even_where_not_native():
    pairs, _ = _measured(PLAIN_CPU, ("float32", "mixed_bfloat16"))
    assert ("mixed_bfloat16", False) in pairs
    with pytest.raises(ConfigError, match="autotune_policies must be among"):
        candidates(PLAIN_CPU, ("float64",))


@pytest.mark.slow
def test_autotune_measures_picks_the_fastest_and_records_every_candidate(prepared_digits,
                                                                          tmp_path):
    config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path, epochs=1,
                         steps_per_epoch=5, autotune=True, autotune_steps=5,
                         autotune_policies="float32,mixed_bfloat16")
    meta = run_train(config, hardware=PLAIN_CPU).metadata
    report = meta["autotune"]
    measured = [r for r in report["candidates"] if r["status"] == "measured"]
    assert {(r["policy"], r["xla"]) for r in measured} == {
        ("float32", False), ("float32", True), ("mixed_bfloat16", False),
        ("mixed_bfloat16", True)}
    best = max(measured, key=lambda r: r["images_per_sec"])
    assert report["choice"] == {"policy": best["policy"], "xla": best["xla"]}
    assert (meta["precision"]["policy"], meta["xla"]["effective"]) == (best["policy"],
                                                                       best["xla"])
    assert meta["precision"]["reason"].startswith("autotune: fastest of 4 measured candidates")
    # each rate is what was timed, and each ratio is to the float32-without-XLA baseline (the
    # reason quotes the chosen one): an inverted or mis-based ratio, or a rate not made of the
    # timed steps, fails here
    for row in measured:
        assert row["images_per_sec"] == pytest.approx(
            1000 * report["global_batch_size"] / row["step_ms"])
    baseline = next(r for r in measured if r["policy"] == "float32" and not r["xla"])
    assert baseline["ratio_vs_float32"] == 1.0
    for row in measured:
        assert row["ratio_vs_float32"] == pytest.approx(
            row["images_per_sec"] / baseline["images_per_sec"])
    assert best["ratio_vs_float32"] >= 1.0
    assert f"{best['ratio_vs_float32']:.2f}x float32 without XLA" in meta["precision"]["reason"]
    assert report["rule_choice"] == {"policy": "float32", "xla": False}
    model, _ = load_trained_model(tmp_path)
    assert model.get_layer("logits").dtype_policy.name == "float32"


@pytest.mark.slow
def test_autotune_budget_skips_the_candidates_it_has_no_time_for(prepared_digits, tmp_path):
    config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path, epochs=1,
                         steps_per_epoch=3, autotune=True, autotune_steps=3,
                         autotune_budget_s=0.001)
    report = run_train(config, hardware=BF16_CPU).metadata["autotune"]
    statuses = [(r["policy"], r["xla"], r["status"]) for r in report["candidates"]]
    assert statuses[0] == ("float32", False, "measured")  # the baseline always runs
    assert [s for s in statuses if s[2] == "measured"] == [statuses[0]]
    assert any("time budget" in (r.get("reason") or "") for r in report["candidates"])
