"""benchmarks/guard_seeds.py: the old rate rule's replay and the per-seed summary.

The runs are the machine's; what is tested is what the script makes of a recorded
`loss_scale_history.json`: the skipped steps, the scale's path, and where the pre-issue-37 rule
stops. The histories are rebuilt from the skipped steps the Xeon runs recorded
(docs/explanation/amp-checks.md), so the replay must give the verdicts that page states; the
kept results must be what their own histories say.
"""

import json
from pathlib import Path

import pytest
from benchmark_scripts import BENCHMARKS, load_benchmark

STEPS = 264  # 6 epochs of 44 steps


@pytest.fixture(scope="module")
def guard_seeds():
    return load_benchmark("guard_seeds")


def recorded_history(skipped_at, steps=STEPS):
    """A loss_scale_history.json as train writes it: each skip halves the scale."""
    history, skipped, scale = [], 0, 32768.0
    for step in range(1, steps + 1):
        if step in skipped_at:
            skipped, scale = skipped + 1, scale / 2
        history.append({"step": step, "loss_scale": scale, "skipped_steps": skipped,
                        "loss": 0.5, "time": float(step)})
    return history


@pytest.mark.parametrize(("skipped_at", "stop_step", "counts", "percent"), [
    ((64, 79, 138), 79, (2, 29), "6.9%"),  # the Xeon's seed 2
    ((75, 87, 100), 87, (2, 37), "5.4%"),  # the Xeon's seed 3
    ((45, 48), 70, (0, 20), "0.0%"),  # skips in the warm-up do not count: never stops
    ((52, 60), 70, (2, 20), "10.0%"),  # the "10.0 % of the 20 steps after warm-up"
])
def test_old_rate_rule_stops_where_amp_checks_page_says(guard_seeds, skipped_at, stop_step,
                                                        counts, percent):
    verdict = guard_seeds.old_rate_rule_verdict(recorded_history(skipped_at))
    if counts[0] == 0:
        assert verdict == {"stopped": False}
        return
    assert verdict["stopped"] and verdict["step"] == stop_step
    assert (verdict["skipped_after_warmup"], verdict["steps_after_warmup"]) == counts
    assert verdict["why"] == f"{percent} of the {counts[1]} steps after warm-up were skipped"


@pytest.mark.parametrize("skipped_at", [(71, 165), (85, 141), (60,), ()])
def test_old_rate_rule_lets_a_run_finish_at_or_under_five_percent(guard_seeds, skipped_at):
    # (60,): 1 of the first 20 steps after warm-up is 5.0 %, not over the limit.
    assert guard_seeds.old_rate_rule_verdict(recorded_history(skipped_at)) == {"stopped": False}


def test_old_rate_rule_stops_under_the_floor(guard_seeds):
    history = recorded_history(range(10, 27))  # 17 halvings: 32768 → 0.25
    verdict = guard_seeds.old_rate_rule_verdict(history)
    assert verdict["stopped"] and verdict["step"] == 25  # 32768 / 2**16 = 0.5
    assert "under the floor" in verdict["why"]


def test_summarize_seed_reads_skips_scale_path_and_the_guards_rule(guard_seeds):
    history = recorded_history((64, 79, 138))
    history[-1]["loss_scale"] = 8192.0  # grown back once
    row = guard_seeds.summarize_seed(2, history, 0, None,
                                     {"final_metrics": {"val_accuracy": 0.933}})
    assert row["finished"] and row["stopped_by"] is None
    assert row["skipped_at"] == [64, 79, 138] and row["skipped_steps"] == 3
    assert row["scale_path"] == {"start": 32768.0, "lowest": 4096.0, "end": 8192.0}
    assert row["val_accuracy"] == 0.933 and row["old_rate_rule"]["step"] == 79

    error = ("ampflow train: 16 steps in a row were skipped for non-finite gradients, up to "
             "step 80 (limit 15; the loss scale is now 0.5): ...")
    stopped = guard_seeds.summarize_seed(3, history[:80], 1, error, None)
    assert not stopped["finished"] and stopped["stopped_by"] == "consecutive_skipped"
    assert stopped["val_accuracy"] is None and stopped["steps"] == 80


def test_summarize_gives_ranges_over_every_seed(guard_seeds):
    rows = [guard_seeds.summarize_seed(seed, recorded_history(skips), 0, None,
                                       {"final_metrics": {"val_accuracy": acc}})
            for seed, skips, acc in ((1, (71, 165), 0.93), (2, (64, 79, 138), 0.933),
                                     (3, (75, 87, 100), 0.955), (4, (85, 141), 0.922))]
    summary = guard_seeds.summarize(rows)
    assert summary["finished"] == 4 and summary["skipped_steps_range"] == [2, 3]
    assert summary["val_accuracy_range"] == [0.922, 0.955]
    assert summary["lowest_scale_range"] == [4096.0, 8192.0]
    assert summary["old_rule_stops_seeds"] == [2, 3]
    assert "| 2 | 264 | 3 (64, 79, 138) | 32768 → 4096 → 4096 | finished | 0.9330 | stops at " \
        "step 79 (2 of 29 steps after warm-up: 6.9%) |" in guard_seeds.markdown(
            {"mode": "full", "builder": "b", "precision": "p", "dataset": "d", "batch_size": 32,
             "epochs": 6, "host": {"cpu": "c", "cores": 2, "simd_flags": [], "onednn_isa": "i",
                                   "fp16_units": [], "tensorflow": "t"},
             "load_1_5_15_start": None, "load_1_5_15_end": None, "commit": {},
             "summary": summary, "runs": rows})


def kept_results():
    return sorted(p for p in (BENCHMARKS / "results").glob("guard_seeds_*.json")
                  if not p.stem.endswith("_smoke"))


def test_guard_seeds_results_are_kept():
    assert kept_results(), "README's guard row cites benchmarks/results/guard_seeds_<host>.json"


@pytest.mark.parametrize("path", kept_results(), ids=lambda p: Path(p).stem)
def test_kept_result_is_what_its_histories_say(guard_seeds, path):
    """Each row and the ranges recompute from the kept histories: no number typed in by hand."""
    report = json.loads(path.read_text())
    for run in report["runs"]:
        again = guard_seeds.summarize_seed(
            run["seed"], run["loss_scale_history"], 0 if run["finished"] else 1, run["error"],
            {"final_metrics": {"val_accuracy": run["val_accuracy"]}})
        assert {k: run[k] for k in again} == again
    assert report["summary"] == guard_seeds.summarize(report["runs"])
