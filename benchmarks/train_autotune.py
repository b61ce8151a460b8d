r"""`ampflow train --autotune` on a real model: every candidate's rate, the choice and why.

Runs `run_train` itself with `autotune=True` (the candidates are timed on the real model, batch
and input pipeline, compilation excluded, side by side in one child process), then one training
step, and writes the candidates table from `metadata.json` (JSON + Markdown under
benchmarks/results/) with the wall time of the search and of the whole command.
`--policies` measures policies the hardware does not compute natively too (e.g. bfloat16 on a
CPU without AVX512_BF16), `--xla both` the XLA pairs known slow on a CPU, to show what the
rules would have cost.

    python benchmarks/train_autotune.py --model resnet50 --image-size 64 --budget 600 \
        --out benchmarks/results --name resnet50_64_amx   # the issue-37 goal: < 90 s, 2 cores
    python benchmarks/train_autotune.py --model small_cnn --steps 5        # a quick check
    python benchmarks/train_autotune.py --model bert_tiny --data-dir work/reviews --steps 5 \
        --budget 300 --name bert_tiny_amx   # a text model (prepare-data --dataset
                                            # ampflow_rotten_tomatoes); rates are texts/s
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=96)
    p.add_argument("--max-sequence-length", type=int, default=None,
                   help="text models: tokens per text (default: --max-sequence-length's)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per candidate (default: --autotune-steps's)")
    p.add_argument("--budget", type=float, default=600.0, help="seconds")
    p.add_argument("--policies", default=None, help="comma-separated; default: native ones")
    p.add_argument("--xla", default="auto", help="auto | both | off | on (--autotune-xla)")
    p.add_argument("--name", default=None, help="results file stem suffix (default: the model)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()

    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data
    from ampflow.components.train import TrainConfig, run_train
    from ampflow.data import load_dataset_info
    from ampflow.data.modality import is_text

    data_dir = args.data_dir or str(run_prepare_data(PrepareDataConfig(
        output_dir=Path(tempfile.gettempdir()) / "ampflow-bench-digits")).output_dir)
    text = is_text(load_dataset_info(data_dir))
    sized = {"max_sequence_length": args.max_sequence_length} if args.max_sequence_length else {}
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig(
            data_dir=Path(data_dir), output_dir=Path(out), model=args.model,
            image_size=args.image_size if args.model != "small_cnn" and not text else None,
            **sized,
            batch_size=args.batch_size, epochs=1, steps_per_epoch=1, autotune=True,
            **({"autotune_steps": args.steps} if args.steps else {}),
            autotune_budget_s=args.budget,
            autotune_policies=args.policies, autotune_xla=args.xla)
        meta = run_train(config).metadata
    report = {"model": args.model, "image_size": None if text else args.image_size,
              "max_sequence_length": config.max_sequence_length if text else None,
              "text": text, "batch_size": args.batch_size,
              "name": args.name or args.model, "command_wall_s": time.monotonic() - began,
              "command_cpu_s": _cpu_seconds(),
              "load_average_1min": os.getloadavg()[0],
              **meta["autotune"], "chosen_policy": meta["precision"]["policy"],
              "chosen_xla": meta["xla"]["effective"], "cpus": os.cpu_count()}
    _write(report, Path(args.out))
    return 0


def _cpu_seconds() -> float:
    """CPU seconds of this process and its (waited-for) children: the search's child included."""
    import resource

    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                           resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"train_autotune_{report['name']}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    size = f" at {report['image_size']}²" if report["image_size"] and report["model"] != (
        "small_cnn") else ""
    if report.get("text"):
        size = f" at sequence length {report['max_sequence_length']}"
    rate = report["throughput_unit"]  # img/s or texts/s: the run's (throughput.py)
    lines = [f"# --autotune: {report['model']}{size}, batch {report['batch_size']}, "
             f"{report['hardware']}, {report['cpus']} CPUs", "",
             f"{report['warmup_steps']} warm-up + {report['timed_steps']} timed steps per "
             f"candidate, one child process, budget {report['budget_s']:g} s: the search took "
             f"{report['elapsed_s']:.0f} s wall ({report['cpu_s']:.0f} CPU-s), the whole "
             "command (search, one training step, "
             f"publishing) {report['command_wall_s']:.0f} s wall, "
             f"{report['command_cpu_s']:.0f} CPU-s; load average "
             f"{report['load_average_1min']:.1f} at the end (a shared machine).", "",
             f"| policy | XLA | status | {rate} | × float32 | step ms | note |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in report["candidates"]:
        chosen = " **chosen**" if (r["policy"], r["xla"]) == (report["choice"]["policy"],
                                                              report["choice"]["xla"]) else ""
        if r["status"] == "measured":
            ratio = f"{r['ratio_vs_float32']:.2f}" if r.get("ratio_vs_float32") else "–"
            lines.append(f"| {r['policy']} | {'on' if r['xla'] else 'off'} | measured{chosen} | "
                         f"{r['images_per_sec']:.1f} | {ratio} | {r['step_ms']:.0f} | |")
        else:
            partial = (f"{r['images_per_sec']:.1f} ({r['timed_steps']} steps)"
                       if "images_per_sec" in r else "")
            lines.append(f"| {r['policy']} | {'on' if r['xla'] else 'off'} | {r['status']} | "
                         f"{partial} | | | {r.get('reason', '')} |")
    rule = report["rule_choice"]
    lines += ["", f"Choice: **{report['choice']['policy']}, XLA "
                  f"{'on' if report['choice']['xla'] else 'off'}** — {report['reason']}. "
                  f"The rule-based `auto` picks {rule['policy']}, XLA "
                  f"{'on' if rule['xla'] else 'off'} here."]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
