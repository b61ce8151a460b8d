r"""What pretraining buys, measured here without a download (issue 48, point 5).

On the offline movie-review snippets (`ampflow_rotten_tomatoes`), in one run:
1. an encoder of bert_tiny's sizes (2 layers, 128 wide, 2 heads) is pretrained with BERT's
   masked-language-model objective on the **training split's texts only**, labels unused
   (`ampflow.modeling.pretrain.pretrain_mlm`: a WordPiece vocabulary built from those texts,
   15 % of the tokens chosen, 80/10/10), and written in the Hugging Face layout;
2. the same architecture and vocabulary at its initialization is written the same way, once
   per seed (`initial_checkpoint`): the from-scratch arm;
3. both are fine-tuned on the sentiment labels by `ampflow train --model DIR` (the same
   tokenizer, the same epochs, the same optimizer and schedule: AdamW, weight decay 0.01,
   linear warm-up over the first 10 % of the steps then cosine decay to 0; by default both at
   the same peak rate, 1e-3, ampflow's measured rate for an encoder from scratch; either can be
   set, `--pretrained-lr` and `--scratch-lr`), seeds 1..N, interleaved (with
   `--parallel`, a seed's two arms run at the same time, so they meet the same load);
4. accuracy on the whole test split (the last epoch's validation, which `train` runs on the
   test split), mean ± a 95 % Student-t interval over the seeds, and the paired difference
   (same seed, both arms) with its t-interval.
The host's CPU flags and load average are recorded: a shared 2-core host is slow, not wrong.

    python benchmarks/text_transfer.py --workdir /tmp/transfer
    python benchmarks/text_transfer.py --workdir /tmp/t --epochs 1 --parallel  # a busy host
    python benchmarks/text_transfer.py --workdir /tmp/t --seeds 1 --epochs 1 --tag smoke

Writes benchmarks/results/text_transfer[_TAG].{json,md}, after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_host import cpu_capabilities, git_commit, load_average, simd_flags  # noqa: E402

OUT = Path(__file__).parent / "results"
DATASET = "ampflow_rotten_tomatoes"
# Student's t, two-sided 95 %, by degrees of freedom (no SciPy needed)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228}


def main() -> int:
    args = _parse()
    args.workdir.mkdir(parents=True, exist_ok=True)
    data_dir = _prepare(args.workdir)
    report = {"benchmark": "text_transfer", "dataset": DATASET, "settings": _settings(args),
              "host": _host(), "load_before": load_average(), "pretraining": None, "runs": []}
    pretrained = _pretrain(args, data_dir, report)
    _write(args, report)
    vocabulary = (pretrained / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    for seed in range(1, args.seeds + 1):
        arms = (("pretrained", pretrained, args.pretrained_lr),
                ("scratch", _scratch(args, vocabulary, seed), args.scratch_lr))
        # --parallel: a seed's two arms at once (each its own process), so both meet one load
        groups = [arms] if args.parallel else [arms[:1], arms[1:]]
        for group in groups:
            started = [_start(args, data_dir, arm, d, rate, seed) for arm, d, rate in group]
            for run in started:
                report["runs"].append(_collect(run))
                print(f"{run['arm']} seed {seed}: {report['runs'][-1]['test_accuracy']:.4f}",
                      flush=True)
            report["summary"], report["load_after"] = summary(report["runs"]), load_average()
            _write(args, report)
    print("\n".join(markdown(report)))
    return 0


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="fine-tuning epochs, both arms")
    parser.add_argument("--pretrain-epochs", type=int, default=3)
    parser.add_argument("--pretrain-lr", type=float, default=1e-3)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--max-sequence-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--pretrained-lr", type=float, default=1e-3,
                        help="peak rate fine-tuning the pretrained encoder (default: the "
                             "scratch arm's; at 3e-4 one epoch stayed at the majority class)")
    parser.add_argument("--scratch-lr", type=float, default=1e-3,
                        help="peak rate from scratch (ampflow's measured encoder default)")
    parser.add_argument("--parallel", action="store_true",
                        help="run each seed's two arms at the same time")
    parser.add_argument("--tag", default="")
    return parser.parse_args()


def _settings(args) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if k != "workdir"} | {"optimizer": "adamw", "weight_decay": 0.01,
                                  "lr_schedule": "cosine, linear warm-up over 10 % of steps",
                                  "precision": "float32", "text_padding": "buckets"}


def _host() -> dict:
    import tensorflow as tf

    return {"cpu_flags": simd_flags(), "capabilities": cpu_capabilities(),
            "cpu_count": os.cpu_count(), "tensorflow": tf.__version__, "code": git_commit(
                ("components", "src", "benchmarks/text_transfer.py"))}


def _prepare(workdir: Path) -> Path:
    data_dir = workdir / "data"
    if not (data_dir / "dataset_info.json").is_file():
        subprocess.run([sys.executable, "-m", "ampflow.cli", "prepare-data", "--dataset",
                        DATASET, "--output-dir", str(data_dir)], check=True,
                       stdout=subprocess.DEVNULL)
    return data_dir


def _pretrain_config(args):
    from ampflow.modeling.pretrain import PretrainConfig
    from ampflow.modeling.wordpiece_vocab import VocabularyConfig

    return PretrainConfig(max_sequence_length=args.max_sequence_length,
                          vocabulary=VocabularyConfig(size=args.vocabulary_size),
                          epochs=args.pretrain_epochs, batch_size=args.batch_size,
                          learning_rate=args.pretrain_lr)


def _pretrain(args, data_dir: Path, report: dict) -> Path:
    """The masked-LM checkpoint, from the training split's texts only (reused if present)."""
    from ampflow.data import load_texts
    from ampflow.modeling.pretrain import REPORT_FILE, pretrain_mlm

    directory = args.workdir / "pretrained"
    if not directory.is_dir():
        texts, _ = load_texts(data_dir, "train")  # never the test split
        load = load_average()
        pretrain_mlm(texts, directory, _pretrain_config(args))
        (directory / "load_before.json").write_text(json.dumps(load))
    report["pretraining"] = {
        **json.loads((directory / REPORT_FILE).read_text()),
        "load_before": json.loads((directory / "load_before.json").read_text())}
    return directory


def _scratch(args, vocabulary: list[str], seed: int) -> Path:
    from ampflow.modeling.pretrain import initial_checkpoint

    directory = args.workdir / f"scratch_{seed}"
    if not directory.is_dir():
        initial_checkpoint(vocabulary, directory, _pretrain_config(args), seed=seed)
    return directory


def _start(args, data_dir: Path, arm: str, checkpoint: Path, rate: float, seed: int) -> dict:
    """Start one `ampflow train --model DIR` in its own process."""
    out = args.workdir / f"run_{arm}_{seed}"
    command = [sys.executable, "-m", "ampflow.cli", "train", "--data-dir", str(data_dir),
               "--output-dir", str(out), "--model", str(checkpoint), "--precision", "float32",
               "--epochs", str(args.epochs), "--seed", str(seed),
               "--batch-size", str(args.batch_size),
               "--max-sequence-length", str(args.max_sequence_length),
               "--learning-rate", str(rate), "--optimizer", "adamw", "--weight-decay", "0.01",
               "--lr-schedule", "cosine", "--warmup-epochs", str(0.1 * args.epochs)]
    return {"arm": arm, "seed": seed, "rate": rate, "out": out, "command": command,
            "load": load_average(), "began": time.perf_counter(), "epochs": args.epochs,
            "process": subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)}


def _collect(run: dict) -> dict:
    """Wait for a started run; its metadata's numbers."""
    _, stderr = run["process"].communicate()
    if run["process"].returncode:
        raise SystemExit(f"{' '.join(run['command'])} failed:\n{stderr[-3000:]}")
    meta = json.loads((run["out"] / "metadata.json").read_text())
    return {"arm": run["arm"], "seed": run["seed"], "learning_rate": run["rate"],
            "epochs": run["epochs"], "test_accuracy": meta["epochs"][-1]["val_accuracy"],
            "test_accuracy_per_epoch": [e["val_accuracy"] for e in meta["epochs"]],
            "train_seconds": meta["train_seconds"],
            "wall_s": round(time.perf_counter() - run["began"], 1), "load_before": run["load"]}


def interval(values: list[float]) -> dict:
    """Mean, sample sd and the 95 % Student-t half-width (None with one value)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return {"n": n, "mean": mean, "sd": None, "half_width_95": None}
    sd = statistics.stdev(values)
    return {"n": n, "mean": mean, "sd": sd, "half_width_95": T_975[n - 1] * sd / n ** 0.5}


def summary(runs: list[dict]) -> dict:
    """Each arm's interval, and the paired (same seed) difference pretrained − scratch."""
    by_arm = {arm: {r["seed"]: r["test_accuracy"] for r in runs if r["arm"] == arm}
              for arm in ("pretrained", "scratch")}
    seeds = sorted(by_arm["pretrained"].keys() & by_arm["scratch"].keys())
    out = {arm: interval(list(acc.values())) for arm, acc in by_arm.items() if acc}
    if seeds:
        out["paired_difference"] = interval(
            [by_arm["pretrained"][s] - by_arm["scratch"][s] for s in seeds])
    return out


def _write(args, report: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "text_transfer" + (f"_{args.tag}" if args.tag else "")
    (OUT / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (OUT / f"{stem}.md").write_text("\n".join(markdown(report)) + "\n")


def _pct(stat: dict | None) -> str:
    if not stat:
        return "–"
    if stat["half_width_95"] is None:
        return f"{100 * stat['mean']:.1f} % (n=1)"
    return f"{100 * stat['mean']:.1f} % ± {100 * stat['half_width_95']:.1f} (n={stat['n']})"


def markdown(report: dict) -> list[str]:
    s, host, pre = report["settings"], report["host"], report["pretraining"] or {}
    summ = report.get("summary", {})
    lines = [
        f"# What masked-LM pretraining here buys bert_tiny ({report['dataset']}, "
        f"sequence {s['max_sequence_length']}, {s['epochs']} fine-tuning epochs)", "",
        f"Host: {host['capabilities'].get('model_name') or 'CPU'}, {host['cpu_count']} cores, "
        f"CPU flags {', '.join(host['cpu_flags'])}; TF {host['tensorflow']}; load average "
        f"before {report['load_before']}, after {report.get('load_after')} (**a shared "
        "host**: other jobs ran beside this one; times are slow, accuracies are not affected).",
        "", "## Pretraining (`ampflow.modeling.pretrain.pretrain_mlm`, train split's texts only)",
        "",
        f"{pre.get('texts')} texts, WordPiece vocabulary of {pre.get('vocabulary_size')}, "
        f"{s['pretrain_epochs']} epochs × {pre.get('steps_per_epoch')} steps of "
        f"{s['batch_size']}, peak rate {s['pretrain_lr']}; masked-LM loss per epoch "
        f"{pre.get('masked_lm_loss_per_epoch')}; {pre.get('seconds')} s.", "",
        "## Fine-tuned on the sentiment labels (`ampflow train --model DIR`), test split", "",
        f"AdamW (weight decay 0.01), {s['lr_schedule']}, float32, length buckets; mean ± 95 % "
        "Student-t half-width over the seeds.", "",
        "| arm | peak rate | test accuracy | per seed |", "|---|---:|---:|---|"]
    for arm, rate in (("pretrained", s["pretrained_lr"]), ("scratch", s["scratch_lr"])):
        seeds = ", ".join(f"{100 * r['test_accuracy']:.1f}" for r in report["runs"]
                          if r["arm"] == arm)
        lines.append(f"| {arm} | {rate:g} | {_pct(summ.get(arm))} | {seeds} |")
    diff = summ.get("paired_difference")
    if diff:
        lines += ["", f"Paired difference (pretrained − scratch, same seed): "
                      f"{_pct(diff).replace(' %', ' points')}."]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
