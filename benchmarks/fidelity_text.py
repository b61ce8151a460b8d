r"""Text fidelity over seeds: AMP vs float32 for the BERT-style encoders, three seeds per row.

The text rows of the fidelity table (fidelity.py has the image models; both call the same
steps). For `bert_tiny` and `bert_mini` from scratch on the offline movie-review snippets
(`ampflow_rotten_tomatoes`: 10,227 training / 2,525 test texts, split by movie, majority class
58.4 %), per seed (`--seeds`, default 1 2 3):

1. `run_train` under float32 (the baseline) and under each AMP policy, same data and seed, the
   learning rate passed explicitly (`--learning-rate`, default 1e-3: the encoders' default
   when this ran, which another change retunes), the step's own XLA rule (on for float16 on a
   CPU);
2. `run_evaluate` on each AMP model with that seed's float32 model as the baseline: the twin
   check (the AMP weights run under float32: argmax agreement, max relative logit diff) and the
   training check (AMP-trained − float32-trained accuracy, its paired SE, McNemar), the gate's
   verdict and, where it fails, its evidence (each failed check's value and threshold);
3. for the seeds in `--tflite-seeds` (default: the first): `run_export` of the float32 twin and
   `run_convert` into the four TFLite variants, each checked on the same test sentences
   (token ids from the model's own vocabulary) against the SavedModel.

Per (model, policy) the table gives the mean of the per-seed accuracy difference and its 95 %
t-interval over the seeds (n − 1 degrees of freedom: wide with three seeds, which is the point:
one seed cannot tell AMP's effect from a seed's), the twin agreement (mean and lowest), and the
gates per seed. Each (model, seed) runs in its own subprocess; the JSON is rewritten after each,
so a run that is stopped keeps the seeds it finished, and rows not run are marked.

    python benchmarks/fidelity_text.py --out benchmarks/results   # the full run
    python benchmarks/fidelity_text.py --smoke --out /tmp/f        # minutes: a few steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fidelity  # noqa: E402  (the image benchmark's evaluate/export/convert helpers)

MODELS = ("bert_tiny", "bert_mini")
POLICIES = fidelity.POLICIES
DATASET = "ampflow_rotten_tomatoes"
SMOKE = {"steps_per_epoch": 3, "test_limit": 64, "latency_runs": 5, "representative_size": 16}


def main() -> int:
    args = _parse()
    if args.worker:
        Path(args.result_file).write_text(json.dumps(_worker(args), indent=2))
        return 0
    began = time.perf_counter()
    if args.merge:
        _write({**_report(args, _merged(args.merge), began), "merged": args.merge},
               Path(args.out), args.smoke)
        return 0
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ampflow-fidelity-text-"))
    workdir.mkdir(parents=True, exist_ok=True)
    args.data_dir = args.data_dir or str(_prepare(workdir))
    runs: list[dict] = []
    for model in args.models:  # a model's seeds together: a stopped run has whole rows first
        for seed in args.seeds:
            runs.append(_run_worker(args, model, seed, workdir))
            _write(_report(args, runs, began), Path(args.out), args.smoke)
    return 0 if all("error" not in r for r in runs) else 1


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="3 steps, 64 test texts: the script only")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--tflite-seeds", nargs="*", type=int, default=None,
                   help="seeds whose models are exported and converted (default: the first)")
    p.add_argument("--sequence-length", type=int, default=32,
                   help="tokens per text (the snippets' median is 19 words)")
    p.add_argument("--epochs", type=int, default=1,
                   help="from scratch the encoders peak after one epoch, then overfit")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--steps-per-epoch", type=int, default=None)
    p.add_argument("--test-limit", type=int, default=None, help="default: all 2,525 texts")
    p.add_argument("--latency-runs", type=int, default=50)
    p.add_argument("--representative-size", type=int, default=200)
    p.add_argument("--tflite-threads", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3600, help="seconds per (model, seed)")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--workdir", default=None)
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="write one report from earlier runs instead of running: their reports "
                        "(fidelity_text.json) or a worker's <model>-seed<N>.json, kept as far "
                        "as it got (the later file wins for a (model, seed))")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("--data-dir", help=f"an already prepared {DATASET} (default: prepared)")
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    p.add_argument("--tflite", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tflite_seeds is None:
        args.tflite_seeds = args.seeds[:1]
    if args.smoke:
        fidelity.apply_smoke(args, SMOKE)
    return args


def _prepare(workdir: Path) -> Path:
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    return run_prepare_data(PrepareDataConfig(output_dir=workdir / "data",
                                              dataset=DATASET)).output_dir


def _run_worker(args, model: str, seed: int, workdir: Path) -> dict:
    """One (model, seed) in a subprocess; an error or a timeout becomes its record."""
    result_file = workdir / f"{model}-seed{seed}.json"
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--seed", str(seed),
           "--data-dir", args.data_dir, "--workdir", str(workdir / f"{model}-seed{seed}"),
           "--result-file", str(result_file), "--policies", *args.policies,
           "--sequence-length", str(args.sequence_length), "--epochs", str(args.epochs),
           "--batch-size", str(args.batch_size), "--learning-rate", str(args.learning_rate),
           "--latency-runs", str(args.latency_runs),
           "--representative-size", str(args.representative_size),
           "--tflite-threads", str(args.tflite_threads)]
    cmd += ["--tflite"] if seed in args.tflite_seeds else []
    for flag, value in (("--steps-per-epoch", args.steps_per_epoch),
                        ("--test-limit", args.test_limit)):
        cmd += [flag, str(value)] if value else []
    print(f"[fidelity-text] {model} seed {seed}", flush=True)
    began = time.perf_counter()
    log = workdir / f"{model}-seed{seed}.log"
    try:
        with log.open("w") as out:
            done = subprocess.run(cmd, timeout=args.timeout, stdout=out,
                                  stderr=subprocess.STDOUT, text=True)
    except subprocess.TimeoutExpired:
        return {"model": model, "seed": seed, "error": f"timed out after {args.timeout:.0f} s"}
    if done.returncode != 0 or not result_file.is_file():
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        return {"model": model, "seed": seed, "error": f"exit {done.returncode}: {tail[0][:300]}",
                "log": str(log)}
    result = json.loads(result_file.read_text())
    result["wall_seconds"] = time.perf_counter() - began
    print(f"[fidelity-text] {model} seed {seed}: {result['wall_seconds']:.0f} s", flush=True)
    return result


def _merged(paths: list[str]) -> list[dict]:
    runs: dict[tuple[str, int], dict] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        for run in data.get("runs", [data]):
            runs[(run["model"], run["seed"])] = {"wall_seconds": None, **run}
    return sorted(runs.values(), key=lambda r: (MODELS.index(r["model"]), r["seed"]))


def _worker(args) -> dict:
    """float32 baseline + each AMP policy for one seed: train, evaluate (export, convert)."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.image_size = None  # fidelity's helpers read these
    work = Path(args.workdir)
    timings: dict[str, float] = {}
    baseline = fidelity._timed(timings, "train float32", lambda: _train(args, "float32", work))
    rows = []
    for policy in args.policies:
        model_dir = fidelity._timed(timings, f"train {policy}",
                                    lambda p=policy: _train(args, p, work))
        row = {"policy": policy, **fidelity._timed(
            timings, f"evaluate {policy}",
            lambda m=model_dir, p=policy: fidelity._evaluate(args, m, baseline, work, p))}
        row["gate_evidence"] = _gate_evidence(work / f"eval-{policy}")
        if args.tflite:
            export_dir, forced = fidelity._timed(
                timings, f"export {policy}", lambda m=model_dir, p=policy, r=row:
                fidelity._export(args, m, work, p, r["parity_gate_passed"]))
            row["export_forced"] = forced
            row["tflite"] = fidelity._timed(timings, f"convert {policy}",
                                            lambda e=export_dir, p=policy:
                                            fidelity._convert(args, e, work, p))
        rows.append(row)
        result = {"model": args.model, "seed": args.seed, "rows": rows, "phase_seconds": timings,
                  "baseline": fidelity._train_summary(baseline)}
        Path(args.result_file).write_text(json.dumps(result, indent=2))  # a stopped seed keeps it
    return result


def _train(args, policy: str, work: Path) -> Path:
    from ampflow.components.train import TrainConfig, run_train

    return run_train(TrainConfig(
        data_dir=Path(args.data_dir), output_dir=work / f"model-{policy}", model=args.model,
        precision=policy, epochs=args.epochs, batch_size=args.batch_size,
        steps_per_epoch=args.steps_per_epoch, max_sequence_length=args.sequence_length,
        learning_rate=args.learning_rate, seed=args.seed)).output_dir


def _gate_evidence(eval_dir: Path) -> list[dict]:
    """Each failed check of the gate: its name, value, comparison and threshold."""
    metrics = json.loads((eval_dir / "metrics.json").read_text()) \
        if (eval_dir / "metrics.json").is_file() else {}
    return [{k: c.get(k) for k in ("name", "value", "op", "threshold")}
            for c in metrics.get("gate", {}).get("checks", []) if not c.get("passed")]


# ---- across seeds ----------------------------------------------------------------------------

def interval(values: list[float], confidence: float = 0.95) -> dict:
    """Mean and its t-interval over the seeds (n − 1 degrees of freedom); None below 2 seeds."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "ci95": None, "n": len(values)}
    from scipy import stats

    half = (stats.t.ppf(0.5 + confidence / 2, len(values) - 1)
            * statistics.stdev(values) / len(values) ** 0.5)
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": len(values)}


def summarize(runs: list[dict], model: str, policy: str) -> dict:
    """One (model, policy) row over the seeds that ran."""
    per_seed = []
    for run in runs:
        row = next((r for r in run.get("rows", []) if r["policy"] == policy), None)
        if run["model"] == model and row:
            per_seed.append({"seed": run["seed"], **row})
    errors = [f"seed {r['seed']}: {r['error']}" for r in runs
              if r["model"] == model and "error" in r]
    if not per_seed:
        return {"model": model, "policy": policy, "seeds": [], "errors": errors}
    agreement = [r["twin_agreement"] for r in per_seed]
    return {
        "model": model, "policy": policy, "seeds": [r["seed"] for r in per_seed],
        "errors": errors, "num_test_texts": per_seed[0]["num_test_images"],
        "delta_points": interval([r["baseline_delta_points"] for r in per_seed]),
        "per_seed_delta_points": [r["baseline_delta_points"] for r in per_seed],
        "amp_accuracy": interval([r["amp_accuracy"] for r in per_seed]),
        "float32_accuracy": interval([r["baseline_accuracy"] for r in per_seed]),
        "twin_agreement_mean": statistics.fmean(agreement),
        "twin_agreement_min": min(agreement),
        "max_relative_logit_diff": max(r["max_relative_logit_diff"] for r in per_seed),
        "relative_logit_bound": per_seed[0]["relative_logit_bound"],
        "gates": [{"seed": r["seed"], "passed": r["parity_gate_passed"],
                   "evidence": r["gate_evidence"]} for r in per_seed],
        "tflite": [{"seed": r["seed"], **r["tflite"]} for r in per_seed if "tflite" in r],
        "train_per_sec": [r["train"]["train_images_per_sec"] for r in per_seed],
    }


def _report(args, runs: list[dict], began: float) -> dict:
    return {"benchmark": "fidelity_text", "mode": "smoke" if args.smoke else "full",
            "dataset": f"{DATASET} (10,227 train / 2,525 test, split by movie)",
            "models": list(args.models), "policies": list(args.policies),
            "seeds": list(args.seeds), "tflite_seeds": list(args.tflite_seeds),
            "sequence_length": args.sequence_length, "epochs": args.epochs,
            "batch_size": args.batch_size, "learning_rate": args.learning_rate,
            "optimizer": "train's default (adam)", "steps_per_epoch": args.steps_per_epoch,
            "test_limit": args.test_limit, "tflite_threads": args.tflite_threads,
            "environment": fidelity._environment(),
            "wall_seconds": time.perf_counter() - began, "runs": runs,
            "rows": [summarize(runs, m, p) for m in args.models for p in args.policies]}


# ---- output ----------------------------------------------------------------------------------

def _points(value: dict) -> str:
    if value["ci95"] is None:
        return f"{value['mean']:+.2f} pt (one seed)"
    lo, hi = value["ci95"]
    return f"{value['mean']:+.2f} pt [{lo:+.2f}, {hi:+.2f}]"


def _gates(row: dict, seeds: list[int]) -> str:
    out = []
    for g in row["gates"]:
        if g["passed"]:
            out.append(f"s{g['seed']} passed")
        else:
            why = ", ".join(f"{e['name']} {_num(e['value'])} (needs {e['op']} "
                            f"{_num(e['threshold'])})" for e in g["evidence"]) or "metrics.json"
            out.append(f"s{g['seed']} FAILED: {why}")
    missing = [f"s{seed} not run (time)" for seed in seeds if seed not in row["seeds"]]
    return "; ".join(out + missing)


def _num(value) -> str:
    return f"{value:.3g}" if isinstance(value, int | float) else str(value)


def markdown(report: dict) -> list[str]:
    """The text rows of the fidelity table, and their TFLite variants."""
    env = report["environment"]
    lines = [
        f"# Text fidelity over seeds: AMP vs float32 ({report['mode']} run)", "",
        f"{report['dataset']}; from scratch, sequence length {report['sequence_length']}, "
        f"{report['epochs']} epoch(s), batch {report['batch_size']}, learning rate "
        f"{report['learning_rate']:g} (passed explicitly), {report['optimizer']}; seeds "
        f"{report['seeds']}; TF {env['tensorflow']}, {env['cpu_count']} CPUs, bf16 units: "
        f"{', '.join(env['cpu_bf16']) or 'none'}, fp16 units: "
        f"{', '.join(env['cpu_fp16']) or 'none'}. " + (
            "Merged from (model, seed) runs made in parallel on this host (their times below)."
            if report.get("merged") else f"Whole run: {report['wall_seconds'] / 60:.1f} min."),
        "",
        "AMP − float32 = the AMP-trained model's test accuracy minus the float32-trained one's "
        "with the same seed; mean over the seeds and its 95 % t-interval. Twin = the AMP "
        "weights run under float32 (inference rounding only). Gate = the evaluate step's "
        "verdict per seed, and what failed.", "",
        "| model | policy | seeds | n texts | AMP acc (mean) | float32 acc (mean) | AMP − float32 "
        "(95 % CI) | per seed | twin agreement mean (min) | max rel. logit diff (bound) "
        "| gate per seed |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in report["rows"]:
        if not r["seeds"]:
            lines.append(f"| {r['model']} | {r['policy']} | not run | | | | | | | | "
                         f"{'; '.join(r['errors']) or 'not run (time)'} |")
            continue
        lines.append(
            f"| {r['model']} | {r['policy']} | {','.join(map(str, r['seeds']))} | "
            f"{r['num_test_texts']} | {r['amp_accuracy']['mean']:.2%} | "
            f"{r['float32_accuracy']['mean']:.2%} | {_points(r['delta_points'])} | "
            f"{', '.join(f'{d:+.2f}' for d in r['per_seed_delta_points'])} | "
            f"{r['twin_agreement_mean']:.2%} ({r['twin_agreement_min']:.2%}) | "
            f"{r['max_relative_logit_diff']:.1e} ({r['relative_logit_bound']:.1e}) | "
            f"{_gates(r, report['seeds'])}"
            f"{' — ' + '; '.join(r['errors']) if r['errors'] else ''} |")
    lines += ["", "TFLite variants (from the float32 twin of the AMP model; agreement = argmax "
              "agreement with the SavedModel on the same test sentences):", "",
              "| model | policy | seed | variant | accuracy | agreement | size KiB | gate |",
              "|---|---|---:|---|---:|---:|---:|---|"]
    for r in report["rows"]:
        for t in r.get("tflite", []):
            for name in [v for v in fidelity.VARIANTS if v in t["variants"]]:
                v = t["variants"][name]
                lines.append(f"| {r['model']} | {r['policy']} | {t['seed']} | {name} | "
                             f"{v['accuracy']:.2%} | {v['agreement']:.2%} | "
                             f"{v['size_bytes'] / 1024:.0f} | "
                             f"{'passed' if v['passed'] else 'FAILED'} |")
    lines += ["", "Wall time per (model, seed), s:", ""]
    for run in report["runs"]:
        if "phase_seconds" in run:
            phases = ", ".join(f"{k} {v:.0f}" for k, v in run["phase_seconds"].items())
            wall = f" ({run['wall_seconds']:.0f} s)" if run.get("wall_seconds") else ""
            lines.append(f"- {run['model']} seed {run['seed']}{wall}: {phases}")
        else:
            lines.append(f"- {run['model']} seed {run['seed']}: {run['error']}")
    return lines


def _write(report: dict, out: Path, smoke: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = "fidelity_text_smoke" if smoke else "fidelity_text"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    text = "\n".join(markdown(report)) + "\n"
    (out / f"{stem}.md").write_text(text)
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
