"""`ampflow train --autotune`: which candidates, the drop and budget rules, a real measured choice.

The search's rules are tested on the real parent (its child process, pipe, kill and restart)
with a fake child that runs the real `run_candidates` on injected step durations (a fake clock),
so a slow candidate is slow by construction, not by this CPU's speed or load.
"""

from __future__ import annotations

import json
import logging
import sys
import textwrap
import time

import pytest

from ampflow.artifacts.model_dir import load_trained_model
from ampflow.components.train import TrainConfig, run_train
from ampflow.components.train.precision import autotune
from ampflow.components.train.precision.autotune import choose, search, spawn_child
from ampflow.components.train.precision.autotune_rules import (
    DROP_AFTER_STEPS,
    LARGE_CONV_MODEL,
    candidates,
    clearly_slower,
    eta_s,
    stall_limit_s,
)
from ampflow.components.train.precision.policy import GpuInfo, HardwareInfo
from ampflow.errors import ConfigError

BF16_CPU = HardwareInfo(cpu_flags=frozenset({"avx512f", "avx512_bf16", "amx_bf16"}))
AMX_FP16_CPU = HardwareInfo(cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile",
                                                 "amx_bf16", "avx512_fp16"}))
ZEN4 = HardwareInfo(cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16"}))
PLAIN_CPU = HardwareInfo(cpu_flags=frozenset({"avx512f"}))
AVX2_CPU = HardwareInfo(cpu_flags=frozenset({"avx2"}))
VOLTA = HardwareInfo(gpus=(GpuInfo("V100", compute_capability=(7, 0)),))
AMPERE = HardwareInfo(gpus=(GpuInfo("A100", compute_capability=(8, 0)),))


def _measured(hardware, policies=None, xla="auto", conv_layers=0):
    pairs, skipped = candidates(hardware, policies, xla, conv_layers)
    return pairs, {(r["policy"], r["xla"]): r["reason"] for r in skipped}


def test_bf16_cpu_measures_float32_first_then_the_rules_choice_and_skips_float16():
    pairs, skipped = _measured(BF16_CPU)
    assert pairs == [("float32", False), ("mixed_bfloat16", False), ("float32", True),
                     ("mixed_bfloat16", True)]
    assert set(skipped) == {("mixed_float16", False), ("mixed_float16", True)}


def test_avx512_fp16_does_not_make_float16_a_default_candidate():
    """The issue's Xeon: AVX512_FP16 read as native float16 ran mixed_float16 for 11 minutes."""
    pairs, skipped = _measured(AMX_FP16_CPU, conv_layers=53)
    assert pairs == [("float32", False), ("mixed_bfloat16", False)]
    assert "avx512_fp16 present" in skipped[("mixed_float16", False)]
    assert "not native" in skipped[("mixed_float16", True)]


def test_xla_on_a_cpu_is_skipped_for_a_large_convolution_model_unless_asked_for():
    for hardware in (ZEN4, AVX2_CPU):
        small, _ = _measured(hardware, conv_layers=LARGE_CONV_MODEL - 1)
        large, skipped = _measured(hardware, conv_layers=LARGE_CONV_MODEL)
        assert ("float32", True) in small
        assert [p for p in large if p[1]] == []
        assert f"model of {LARGE_CONV_MODEL} convolutions" in skipped[("float32", True)]
        both, _ = _measured(hardware, xla="both", conv_layers=LARGE_CONV_MODEL)
        assert ("float32", True) in both
    # a GPU measures XLA whatever the model's size
    assert ("float32", True) in _measured(AMPERE, conv_layers=53)[0]


def test_float16_without_xla_on_a_cpu_is_skipped_even_when_float16_is_asked_for():
    pairs, skipped = _measured(AVX2_CPU, ("float32", "mixed_float16"))
    assert ("mixed_float16", True) in pairs and ("mixed_float16", False) not in pairs
    assert "float16 convolution gradients run" in skipped[("mixed_float16", False)]
    assert ("mixed_float16", False) in _measured(AVX2_CPU, ("mixed_float16",), "both")[0]


def test_cpu_without_bf16_measures_float32_only():
    pairs, skipped = _measured(PLAIN_CPU)
    assert pairs == [("float32", False), ("float32", True)]
    assert ("mixed_bfloat16", False) in skipped


def test_gpus_measure_what_their_compute_capability_supports():
    assert _measured(VOLTA)[0][:2] == [("float32", False), ("mixed_float16", True)]
    assert ("mixed_bfloat16", True) in _measured(VOLTA)[1]
    assert {p for p, _ in _measured(AMPERE)[0]} == {"float32", "mixed_bfloat16",
                                                     "mixed_float16"}


def test_explicit_policies_and_xla_modes_are_honoured_and_checked():
    pairs, _ = _measured(PLAIN_CPU, ("float32", "mixed_bfloat16"))
    assert ("mixed_bfloat16", False) in pairs
    assert _measured(BF16_CPU, xla="off")[0] == [("float32", False), ("mixed_bfloat16", False)]
    assert _measured(BF16_CPU, xla="on")[0] == [("float32", True), ("mixed_bfloat16", True)]
    with pytest.raises(ConfigError, match="autotune_policies must be among"):
        candidates(PLAIN_CPU, ("float64",))
    with pytest.raises(ConfigError, match="autotune_xla must be one of"):
        candidates(PLAIN_CPU, None, "sometimes")


def test_the_drop_rule_needs_enough_steps_and_a_margin():
    best = 0.100
    assert not clearly_slower([0.5] * (DROP_AFTER_STEPS - 1), best)  # too few steps to judge
    assert clearly_slower([0.5] * DROP_AFTER_STEPS, best)
    assert not clearly_slower([0.5, 0.12, 0.5], best)  # one step within the margin: maybe noise
    assert not clearly_slower([0.5] * 5, None)  # nothing to compare with yet
    assert stall_limit_s(None) is None
    assert stall_limit_s(0.1, stall_min_s=10) == 10
    assert stall_limit_s(10.0, stall_min_s=1) == pytest.approx(DROP_AFTER_STEPS * 1.25 * 10)


def test_eta_comes_from_measured_time_per_xla_setting_and_never_passes_the_budget():
    measured = [{"xla": False, "warmup_s": 4.0, "step_ms_median": 500.0},
                {"xla": True, "warmup_s": 30.0, "step_ms_median": 1000.0}]
    running = {"xla": False, "warm": True, "steps": [0.4, 0.6, 0.5], "phase_s": 0.1}
    seconds, estimated = eta_s([False, True], running, 10, measured, budget_left_s=500.0)
    assert estimated
    assert seconds == pytest.approx(7 * 0.5 + (4.0 + 10 * 0.5) + (30.0 + 10 * 1.0))
    warming = {"xla": True, "warm": False, "steps": [], "phase_s": 20.0}
    assert eta_s([], warming, 10, measured, 500.0) == (pytest.approx(10.0 + 10 * 1.0), True)
    assert eta_s([False], running, 10, measured, budget_left_s=5.0) == (5.0, False)
    # no XLA candidate measured yet: its compile and steps are unknown, so only the budget is
    assert eta_s([True], None, 10, measured[:1], budget_left_s=80.0) == (80.0, False)
    assert eta_s([False], None, 10, [], budget_left_s=80.0) == (80.0, False)


# ---- the search, on a fake child with injected step durations -----------------------------

FAKE_CHILD = textwrap.dedent('''
    import json, os, sys, time
    from ampflow.components.train.precision import autotune
    request = json.load(open(sys.argv[1]))
    scenario = json.loads(SCENARIO)
    out = os.fdopen(int(sys.argv[2]), "w", buffering=1)
    def emit(**event):
        out.write(json.dumps(event) + "\\n")
    now = [0.0]
    def prepare(policy, jit):
        step = scenario["step_s"][f"{policy} {jit}"]
        def warm_up():
            now[0] += 1.0
        def one_step():
            if step == "hang":
                time.sleep(600)
            if step == "crash":
                os._exit(7)
            now[0] += step
        return warm_up, one_step
    pairs = request["pairs"]
    if pairs is None:
        pairs = scenario["plan"]
        emit(event="plan", pairs=pairs, skipped=[], conv_layers=0, global_batch_size=32,
             hardware="fake", modality=scenario.get("modality"))
    autotune.run_candidates([tuple(p) for p in pairs], request["config"]["autotune_steps"], 32,
                            request["best_median_s"], prepare, emit, lambda: now[0])
    emit(event="end")
''')


def _fake_search(tmp_path, step_s, plan, budget_s=60.0, steps=10, stall_min_s=10.0,
                 modality=None):
    code = FAKE_CHILD.replace("SCENARIO", repr(json.dumps({"step_s": step_s, "plan": plan,
                                                            "modality": modality})))
    config = TrainConfig(data_dir=tmp_path, output_dir=tmp_path, autotune=True,
                         autotune_steps=steps, autotune_budget_s=budget_s)
    began = time.monotonic()
    result = search(config, BF16_CPU, stall_min_s=stall_min_s,
                    spawn=lambda request: spawn_child(request, (sys.executable, "-c", code)))
    return result, time.monotonic() - began, config


def _rows(result):
    return {(r["policy"], r["xla"]): r for r in result.rows}


PLAN = [["float32", False], ["mixed_bfloat16", False], ["float32", True], ["mixed_bfloat16", True]]


def test_a_clearly_slower_candidate_is_dropped_and_the_winner_is_the_full_measurements(tmp_path):
    step_s = {"float32 False": 0.10, "mixed_bfloat16 False": 0.06, "float32 True": 0.40,
              "mixed_bfloat16 True": 0.07}
    result, _, config = _fake_search(tmp_path, step_s, PLAN)
    rows = _rows(result)
    slow = rows[("float32", True)]
    assert slow["status"] == "dropped" and slow["timed_steps"] == DROP_AFTER_STEPS
    assert "clearly slower after 3 of 10 timed steps" in slow["reason"]
    assert [rows[p]["status"] for p in rows if p != ("float32", True)] == ["measured"] * 3
    full_winner = min(step_s, key=step_s.get)  # every candidate measured to the end
    setup, report = choose(result, None, BF16_CPU, config)
    assert f"{setup.policy} {setup.jit_compile}" == full_winner == "mixed_bfloat16 False"
    assert report["choice"] == {"policy": "mixed_bfloat16", "xla": False}
    assert report["candidates"][0]["ratio_vs_float32"] == 1.0


def test_a_text_models_rates_are_texts_per_second_wherever_autotune_says_them(tmp_path,
                                                                              caplog):
    """bert_* on text data (the plan names the data's modality): every rate autotune prints or
    records is texts (sequences) per second: the candidates' log lines, the choice's reason and
    the report, whose `throughput_unit` says it (the rows keep `images_per_sec`, the field
    benchmarks/results hold). Image data keeps img/s."""
    import keras

    step_s = {"float32 False": 0.10, "mixed_bfloat16 False": 0.05}  # 320 and 640 a second
    try:
        for modality, unit, wrong in (("text", "texts/s", "img/s"), ("image", "img/s", "texts/s")):
            caplog.clear()
            with caplog.at_level(logging.INFO, logger=autotune.log.name):
                result, _, config = _fake_search(tmp_path, step_s, PLAN[:2], steps=3,
                                                 modality=modality)
                setup, report = choose(result, None, BF16_CPU, config)
            lines = [r.getMessage() for r in caplog.records]
            assert f"autotune float32 xla=False: measured: 320.0 {unit} (3 timed steps)" in lines
            assert f"measured candidates at 640.0 {unit}," in setup.reason
            assert report["throughput_unit"] == unit and report["modality"] == modality
            assert [r["images_per_sec"] for r in report["candidates"]] == pytest.approx([320, 640])
            assert wrong not in "\n".join([*lines, setup.reason, json.dumps(report)])
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_the_budget_stops_a_running_candidate_and_says_where(tmp_path):
    step_s = {"float32 False": 0.10, "mixed_bfloat16 False": "hang", "float32 True": 0.1,
              "mixed_bfloat16 True": 0.1}
    result, seconds, config = _fake_search(tmp_path, step_s, PLAN, budget_s=3.0)
    assert seconds < 3.0 + 3.0  # the budget, a read interval and a kill: not 600 s
    rows = _rows(result)
    assert rows[("float32", False)]["status"] == "measured"
    stopped = rows[("mixed_bfloat16", False)]
    assert stopped["status"] == "stopped"
    assert "time budget (3 s) after 0 of 10 timed steps" in stopped["reason"]
    assert {rows[p]["status"] for p in [("float32", True), ("mixed_bfloat16", True)]} == {
        "skipped"}
    assert result.stopped_at_budget
    setup, _ = choose(result, None, BF16_CPU, config)
    assert (setup.policy, setup.jit_compile) == ("float32", False)


def test_a_stalled_step_is_stopped_and_the_search_goes_on_in_a_new_process(tmp_path):
    step_s = {"float32 False": 0.10, "float32 True": "hang", "mixed_bfloat16 False": 0.05}
    plan = [["float32", False], ["float32", True], ["mixed_bfloat16", False]]
    result, seconds, _ = _fake_search(tmp_path, step_s, plan, stall_min_s=0.3)
    rows = _rows(result)
    assert rows[("float32", True)]["status"] == "dropped"
    assert "still running after" in rows[("float32", True)]["reason"]
    assert rows[("mixed_bfloat16", False)]["status"] == "measured"  # measured after the restart
    assert result.restarts == 1 and seconds < 20


def test_a_crashed_candidate_fails_alone_and_the_rest_is_measured(tmp_path):
    step_s = {"float32 False": 0.10, "mixed_bfloat16 False": "crash", "float32 True": 0.2}
    plan = [["float32", False], ["mixed_bfloat16", False], ["float32", True]]
    result, _, _ = _fake_search(tmp_path, step_s, plan)
    rows = _rows(result)
    assert rows[("mixed_bfloat16", False)]["status"] == "failed"
    assert "exited with code 7" in rows[("mixed_bfloat16", False)]["reason"]
    assert rows[("float32", True)]["status"] == "dropped"  # measured by the second process
    assert result.restarts == 1


def test_with_every_candidate_failed_the_run_takes_the_rules_choice_and_says_so(tmp_path):
    plan = [["float32", False], ["mixed_bfloat16", False]]
    result, _, config = _fake_search(tmp_path, {"float32 False": "crash",
                                                "mixed_bfloat16 False": "crash"}, plan)
    assert [r["status"] for r in result.rows] == ["failed", "failed"]
    setup, report = choose(result, None, BF16_CPU, config)
    assert (setup.policy, setup.jit_compile) == ("mixed_bfloat16", False)  # auto's, on BF16_CPU
    assert "measured no candidate to the end (each one failed" in setup.reason
    assert report["choice"] == {"policy": "mixed_bfloat16", "xla": False}


def test_bad_autotune_flags_are_one_line_before_any_process(tmp_path):
    def no_spawn(request):
        raise AssertionError("no process may start")

    for bad, match in ((dict(autotune_policies="float32,float64"),
                        "Received: autotune_policies='float32,float64'"),
                       (dict(autotune_xla="sometimes"), "autotune_xla must be one of")):
        config = TrainConfig(data_dir=tmp_path, output_dir=tmp_path, autotune=True, **bad)
        with pytest.raises(ConfigError, match=match):
            search(config, BF16_CPU, spawn=no_spawn)


def test_a_child_that_cannot_start_is_one_clear_error(tmp_path):
    config = TrainConfig(data_dir=tmp_path, output_dir=tmp_path, autotune=True)
    with pytest.raises(ConfigError, match="exited with code 3 before it planned"):
        search(config, BF16_CPU, spawn=lambda request: spawn_child(
            request, (sys.executable, "-c", "import sys; sys.exit(3)")))


# ---- real runs ----------------------------------------------------------------------------

@pytest.mark.slow
def test_autotune_measures_picks_the_fastest_and_records_every_candidate(prepared_digits,
                                                                          tmp_path):
    config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path, epochs=1,
                         steps_per_epoch=5, autotune=True, autotune_steps=5,
                         autotune_policies="float32,mixed_bfloat16", autotune_xla="off")
    meta = run_train(config, hardware=PLAIN_CPU).metadata
    report = meta["autotune"]
    rows = {(r["policy"], r["xla"]): r for r in report["candidates"]}
    # bfloat16 is not native on the injected CPU: measured because it was asked for
    assert set(rows) == {("float32", False), ("mixed_bfloat16", False)}
    assert not report["stopped_at_budget"] and report["elapsed_s"] < report["budget_s"]
    assert report["cpu_s"] > 0  # the child's CPU time, waited for and counted
    assert (report["modality"], report["throughput_unit"]) == ("image", "img/s")  # the digits
    assert {r["status"] for r in rows.values()} <= {"measured", "dropped"}
    measured = [r for r in rows.values() if r["status"] == "measured"]
    best = max(measured, key=lambda r: r["images_per_sec"])
    assert report["choice"] == {"policy": best["policy"], "xla": best["xla"]}
    assert (meta["precision"]["policy"], meta["xla"]["effective"]) == (best["policy"],
                                                                       best["xla"])
    assert meta["precision"]["reason"].startswith(
        f"autotune: fastest of {len(measured)} measured candidates")
    # each rate is what was timed, each ratio is to the float32-without-XLA baseline
    for row in rows.values():
        assert row["images_per_sec"] == pytest.approx(
            1000 * report["global_batch_size"] / row["step_ms"])
    baseline = rows[("float32", False)]
    assert baseline["status"] == "measured" and baseline["ratio_vs_float32"] == 1.0
    for row in measured:
        assert row["ratio_vs_float32"] == pytest.approx(
            row["images_per_sec"] / baseline["images_per_sec"])
    assert report["rule_choice"] == {"policy": "float32", "xla": False}
    assert meta["precision"]["native_formats"]["formats"]["bfloat16"]["native"] is False
    model, _ = load_trained_model(tmp_path)
    assert model.get_layer("logits").dtype_policy.name == "float32"


@pytest.mark.slow
def test_autotune_with_no_time_trains_with_the_rules_choice(prepared_digits, tmp_path):
    config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path, epochs=1,
                         steps_per_epoch=3, autotune=True, autotune_steps=3,
                         autotune_budget_s=0.001)
    meta = run_train(config, hardware=BF16_CPU).metadata
    assert meta["autotune"]["stopped_at_budget"]
    assert meta["autotune"]["choice"] == {"policy": "mixed_bfloat16", "xla": False}
    assert "measured no candidate to the end within its budget" in meta["precision"]["reason"]
