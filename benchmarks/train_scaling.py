r"""Training loop throughput: 1 vs 2 workers, the loop vs Keras `fit`, telemetry on vs off.

All side by side in one run (JSON + Markdown).

Every configuration is a fresh subprocess on the same data (the offline digits), model, seed
and per-replica batch; `--repeats` interleaves the whole sweep again to show the noise. The
first epoch (tracing, XLA compilation) is warm-up; images/s is what `run_train` records (the
timed epochs' training steps, validation excluded), and it is GLOBAL (all workers' images).

1. Scaling: one worker pinned to one core (taskset + one TF thread) vs two workers on loopback
   (`ampflow train --workers 2 --cpus-per-worker 1`, MultiWorkerMirroredStrategy), the same
   per-replica batch (so the global batch doubles). Efficiency = 2-worker img/s / (2 × 1-worker).
   On a 2-core machine this is the most that can be shown: two single-core workers; the
   collectives go over loopback gRPC, not a network.
2. The loop vs `fit` (one process, all cores): today's `run_train` (the custom step) beside the
   `model.fit` path it replaced, rebuilt here with the same model, optimizer, input pipeline
   and callbacks (BackupAndRestore, loss-scale telemetry, epoch log, TensorBoard).
3. Telemetry (mixed_float16, where the loss scale exists): recorded every step vs never (only
   the per-epoch guard reads the device), in one process with the two settings alternating epoch
   by epoch, so that the machine's drift hits both alike; the paired median is reported, and the
   host cost of one recorded step timed alone (the part that does not drown in the noise).

    python benchmarks/train_scaling.py --out benchmarks/results            # small_cnn
    python benchmarks/train_scaling.py --model resnet50 --image-size 32 --steps 10
    python benchmarks/train_scaling.py --smoke                             # a quick check
    python benchmarks/train_scaling.py --loop-vs-fit-ci --pairs 20         # the 95 % interval

5. `--profile-step`: where a 2-worker step's time goes. Two workers (one core each, loopback)
   build the model twice, once with the former all-reduce (`--no-packed-allreduce`: Keras's
   gradient all-reduce + the statistics' reduce + under loss scaling the skip agreement) and
   once packed (one collective), and time, in alternating rounds: the whole step of each, the
   input (`next`), the forward/backward pass alone (a fixed batch, no collective), one
   gradient-sized all-reduce (float32, and in the compute dtype under a mixed policy), a
   3-float reduce, a scalar all-reduce, and 4 packed steps per tf.function call (fewer host
   round-trips). The same in one process pinned to one core is the 1-worker reference.

    python benchmarks/train_scaling.py --profile-step                       # small_cnn
    python benchmarks/train_scaling.py --profile-step --model resnet50 --image-size 32 \
        --profile-steps 3

The scaling group runs the 2-worker configuration with the former all-reduce (before) and
with the packed one (after, the default), and with `--allreduce-dtype compute` under a mixed
`--policy`, all interleaved in each sweep.

4. `--loop-vs-fit-ci`: the loop vs `fit` with a confidence interval. Separate processes and
   epoch medians (group 2) could not tell a 0.82x loss from noise (per sweep 1.20, 0.99, 0.55
   on this shared machine). Here both run in ONE process on twin models (same seed, model,
   policy, XLA, optimizer, batch, input pipeline, callbacks: loss-scale telemetry every step
   and the epoch log), in `--pairs` alternating chunks of one epoch of `--steps` steps (order
   ABBA, so that a drift hits both alike) after one warm-up chunk each. Each pair gives a ratio
   of the epoch logs' img/s; the report is their geometric mean with a 95 % t-interval over the
   pairs' log-ratios (the goal: >= 1.0x, the interval not below 0.95).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its parts live beside it

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from train_scaling_loops import (  # noqa: E402
    fit_path,
    loop_vs_fit_paired,
    ratio_interval,
    telemetry_epochs,
)
from train_scaling_profile import PROFILE_PREFIX, profile_pieces, profile_step  # noqa: E402
from train_scaling_report import write, write_ci, write_profile  # noqa: E402
from train_scaling_runs import (  # noqa: E402
    ALL_GROUPS,
    configs,
    cpu_flags,
    merge,
    paired_ratios,
    ratios,
    run,
    telemetry_cost,
)

_ratio_interval = ratio_interval  # the name tests/benchmarks/test_benchmark_statistics.py calls


def main() -> int:
    args = _parse()
    if args.fit_worker:
        print(json.dumps(fit_path(args)))
        return 0
    if args.telemetry_worker:
        print(json.dumps(telemetry_epochs(args)))
        return 0
    if args.profile_worker:
        print(PROFILE_PREFIX + json.dumps(profile_pieces(args)), flush=True)
        return 0
    data_dir = prepare(args)
    if args.profile_step:
        write_profile(profile_step(args, data_dir), Path(args.out))
        return 0
    if args.loop_vs_fit_ci:
        write_ci(loop_vs_fit_paired(args, data_dir), Path(args.out))
        return 0
    groups = set(args.groups.split(","))
    unknown = groups - set(ALL_GROUPS)
    if unknown:
        raise SystemExit(f"--groups must be among {ALL_GROUPS}. Received: {sorted(unknown)}")
    chosen = {k: v for k, v in configs(args).items() if v["group"] in groups}
    runs: dict[str, list[dict]] = {}
    for repeat in range(args.repeats):
        for name, spec in chosen.items():
            row = run(args, data_dir, name, spec)
            runs.setdefault(name, []).append(row)
            print(f"[{repeat + 1}/{args.repeats}] {name:>28}: "
                  + (f"{row['images_per_sec']:8.1f} img/s" if "images_per_sec" in row
                     else row["error"]), flush=True)
    rows = {name: merge(name, chosen[name], r) for name, r in runs.items()}
    paired = paired_ratios(runs)
    telemetry = telemetry_cost(args, data_dir) if "telemetry" in groups else {}
    report = {
        "model": args.model, "image_size": args.image_size, "per_replica_batch": args.batch_size,
        "steps_per_epoch": args.steps, "timed_epochs": args.epochs, "repeats": args.repeats,
        "warmup": "epoch 1 (tracing/compilation)", "cpus": os.cpu_count(),
        "note": ("2-core machine shared with other jobs; scaling = two single-core workers "
                 "over loopback; ratios measured side by side, interleaved"),
        "groups": [g for g in ALL_GROUPS if g in groups],
        "cpu_flags": cpu_flags(), "load_average": os.getloadavg(),
        "rows": list(rows.values()), "ratios": ratios(rows), "per_sweep": paired,
        "telemetry": telemetry,
    }
    write(report, Path(args.out))
    return 0


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=32, help="per replica")
    p.add_argument("--steps", type=int, default=None, help="steps per epoch (default: all)")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs after the warm-up one")
    p.add_argument("--repeats", type=int, default=2, help="interleaved sweeps")
    p.add_argument("--policy", default="float32", help="policy of the scaling and loop rows")
    p.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    p.add_argument("--smoke", action="store_true", help="1 timed epoch of 5 steps, 1 sweep")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--groups", default="scaling,loop_vs_fit,telemetry",
                   help="which measurements (comma-separated)")
    p.add_argument("--telemetry-epochs", type=int, default=16,
                   help="epochs of the telemetry on/off measurement (alternating)")
    p.add_argument("--loop-vs-fit-ci", action="store_true",
                   help="the loop vs fit in one process, alternating, with a 95 %% interval")
    p.add_argument("--pairs", type=int, default=20, help="alternating pairs (--loop-vs-fit-ci)")
    p.add_argument("--profile-step", action="store_true",
                   help="time the parts of one 2-worker step (and of a 1-worker one)")
    p.add_argument("--profile-steps", type=int, default=30,
                   help="steps per timed round of --profile-step")
    p.add_argument("--profile-rounds", type=int, default=5,
                   help="alternating rounds of --profile-step")
    p.add_argument("--profile-no-multi-step", action="store_true",
                   help="leave out the 4-steps-per-call piece (slow for big models)")
    p.add_argument("--pack-bytes", type=int, default=None,
                   help="also run 2 workers with --allreduce-bytes-per-pack N (scaling group)")
    p.add_argument("--profile-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fit-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--telemetry-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--output-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.smoke:
        args.epochs, args.steps, args.repeats, args.telemetry_epochs = 1, 5, 1, 4
    return args


def prepare(args) -> str:
    if args.data_dir:
        return args.data_dir
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    out = Path(tempfile.gettempdir()) / "ampflow-bench-digits"
    return str(run_prepare_data(PrepareDataConfig(output_dir=out)).output_dir)


if __name__ == "__main__":
    sys.exit(main())
