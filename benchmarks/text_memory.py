r"""The seed's BERT memory claim, measured: peak training memory per policy, the batch that fits.

The claim (the reference article): BERT-base at sequence 512 and batch 32 needs about 16 GB in
float32 and about 9 GB with AMP, so the batch doubles and fewer gradient-accumulation steps are
needed. This script measures, for `bert_small` and `bert_base` (src/ampflow/modeling/text_models.py,
BERT's 30,522-token vocabulary by default) at sequence 128 and 512, under float32,
mixed_bfloat16 and mixed_float16, side by side in one run:

1. **The peak.** Each (model, sequence, policy) runs in a fresh subprocess. For each batch of
   `--batches` (ascending) it clears the Keras session, builds the model, and runs `--steps`
   steps of ampflow's own train step (`TrainLoop`, Adam; a dynamic LossScaleOptimizer under
   mixed_float16, which runs on until one update was applied, as train's batch probe does) on
   random token ids, inside one `PeakMemory` region (components/train/run/memory.py): the TF
   allocator's peak (on a CPU every tensor TF allocates; on a GPU the device memory its
   capacity bounds) above what the process held before the model was built, with the
   process's RSS growth beside it. XLA off for every policy, so each policy's peak is the same
   graph's (train's rule turns XLA on for float16 on a CPU; on a GPU it is on for all, and its
   buffer assignment changes the peak: rerun with `--xla` there).
2. **The split.** The peak is fit as `fixed + per_example × batch` (least squares over the
   measured batches; the residual reported). The intercept is what does not grow with the
   batch: float32 master weights, their gradients and Adam's two slots (16 bytes a parameter,
   counted beside it) and the half-precision weight copies. The slope is the activations (and
   their gradients) of one example: the share AMP can shrink. The largest measured batch is
   also predicted from the others (leave-one-out) and the error printed: the check that the fit
   extrapolates.
3. **The batch that fits** an injected device limit (`--limits-gib`, default the seed's 16 GB
   V100 and a 40 GB A100) is `floor((limit - fixed) / per_example)` from the fit: no batch that
   large can run on this machine. For an effective batch (`--effective-batch`, default 64) the
   micro-batch is the largest divisor of it that fits and the accumulation steps K =
   effective / micro-batch; the steps AMP saves are float32's K minus the policy's.

**Memory safety** (a shared machine): every worker is watched by the parent, which kills it
when its resident set passes `--cap-gib` (default 4.5 GiB), and the worker itself stops before
a batch whose predicted RSS would pass the cap (its RSS now, freed heap returned to the OS, +
the allocator peak the points so far predict, + the largest RSS overhead over the allocator
seen): that batch and the larger ones are recorded as "not run" with the prediction. bert_base
at 512 × 32 in float32 (~16 GB) is never run on a CPU; it is computed.

    python benchmarks/text_memory.py --out benchmarks/results --tag cpu_xeon
    python benchmarks/text_memory.py --models bert_small --sequence-lengths 128 --batches 1 2 4
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = Path(__file__).resolve().parent
MODELS = ("bert_base", "bert_small")  # the claim's model first
# Batches tried per (model, sequence): above the update-bound floor at short sequences, up to
# the cap (measured: bert_small at 128 held ~500 MiB from batch 1 to 4, the update's peak).
LADDERS = {("bert_small", 128): [8, 16, 32], ("bert_small", 512): [1, 2, 4],
           ("bert_base", 128): [2, 4, 8], ("bert_base", 512): [1, 2, 3]}
BERT_LADDER = {"bert_tiny": [1, 2, 4, 8, 16, 32], "bert_mini": [1, 2, 4, 8, 16, 32],
               "bert_small": [1, 2, 4, 8, 16, 32], "bert_base": [1, 2, 3, 4, 8]}
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
BERT_VOCABULARY = 30_522  # BERT's uncased WordPiece vocabulary (ampflow's tokenizer: 20,000)
NUM_CLASSES = 2
GIB = 2**30
# The reference article's claim: bert_base, sequence 512, batch 32: float32 ~16 GB, AMP ~9 GB.
CLAIM = {"model": "bert_base", "sequence_length": 512, "batch_size": 32,
         "float32_gb": 16.0, "amp_gb": 9.0}


def main() -> int:
    args = _parse()
    if args.worker:
        _worker(args)
        return 0
    sys.path.insert(0, str(HERE))
    from text_memory_report import print_config, write
    from train_memory import _cpu_flags, _versions
    from train_throughput import _cpu_capabilities, _device

    began = time.monotonic()
    host = _merged_host(args) if args.merge_only else {
        "cpu": {**_cpu_capabilities(), "flags": _cpu_flags()}, "device": _device(),
        "versions": _versions()}
    done = _resumed(args)
    configs = []
    for model, sequence, policy in _order(args):
        key = (model, sequence, policy)
        if key in done:
            points, notes = done[key]["points"], done[key]["notes"]
        elif args.merge_only:
            points, notes = [], ["not run (time)"]
        else:
            points, notes = _run_worker(args, model, sequence, policy)
        configs.append(_analyse(args, model, sequence, policy, points, notes))
        print_config(configs[-1])
        # written after each: a stopped run keeps what it measured
        write(_report(args, configs, began, host), Path(args.out))
    return 0


def _merged_host(args) -> dict:
    """--merge-only: the host as the merged runs recorded it, and each run's wall and load."""
    args.resume = [p for p in args.resume or [] if Path(p).is_file()]
    runs = [json.loads(Path(p).read_text()) for p in args.resume]
    if not runs:
        raise SystemExit("text_memory.py: error: --merge-only needs --resume JSON files")
    return {"cpu": runs[0]["cpu"], "device": runs[0]["device"], "versions": runs[0]["versions"],
            "merged_runs": [{"file": Path(p).name, "wall_seconds": r["wall_seconds"],
                             "load_average": r["load_average"]}
                            for p, r in zip(args.resume, runs, strict=True)]}


def _order(args) -> list[tuple[str, int, str]]:
    """The configurations in run order: float32 and mixed_bfloat16 for every shape first.

    mixed_float16 (the GPU policy; two bytes an activation, as bfloat16) comes last.
    """
    first = [p for p in args.policies if p != "mixed_float16"]
    passes = [first, [p for p in args.policies if p not in first]]
    return [(m, s, p) for group in passes for m in args.models
            for s in args.sequence_lengths for p in group]


def _resumed(args) -> dict:
    """--resume: the configurations an earlier run (this output, or the files named) measured."""
    if args.resume is None:
        return {}
    own = Path(args.out) / ("text_memory" + (f"_{args.tag}" if args.tag else "") + ".json")
    done: dict = {}
    for path in [own, *map(Path, args.resume)]:
        if not path.is_file():
            continue
        for c in json.loads(path.read_text())["configs"]:
            key = (c["model"], c["sequence_length"], c["policy"])
            old = done.setdefault(key, {"points": [], "notes": []})
            measured = {p["batch"]: p for p in old["points"] + c["points"]
                        if "allocator_peak_bytes" in p}  # batches measured in several runs
            skipped = [p for p in c["points"] + old["points"] if "allocator_peak_bytes" not in p
                       and p["batch"] not in measured]
            old["points"] = sorted([*measured.values(), *{p["batch"]: p for p in skipped}
                                    .values()], key=lambda p: p["batch"])
            old["notes"] = list(dict.fromkeys(old["notes"] + c["notes"]))
    return {k: v for k, v in done.items() if v["points"]}


def _report(args, configs: list[dict], began: float, host: dict) -> dict:
    configs = [dict(c) for c in configs]
    _borrow_fixed(args, configs)
    _ratios(configs)
    return {"benchmark": "text_memory", "configs": configs, "claim": _claim(configs),
            "steps": args.steps, "xla": args.xla, "vocabulary_size": args.vocabulary_size,
            "num_classes": NUM_CLASSES, "limits_gib": args.limits_gib,
            "effective_batch": args.effective_batch, "cap_gib": args.cap_gib,
            "optimizer": "Adam (LossScaleOptimizer, dynamic, for mixed_float16)",
            "data": "random token ids in [1, vocabulary) (no padding), random labels",
            "loop": "ampflow TrainLoop (train's step), default strategy",
            **host,
            "cores": os.cpu_count(), "load_average": os.getloadavg(), "tag": args.tag,
            "wall_seconds": time.monotonic() - began}


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(BERT_LADDER))
    p.add_argument("--sequence-lengths", nargs="+", type=int, default=[512, 128])
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--batches", nargs="+", type=int, default=None,
                   help="tried ascending; a worker stops before one its prediction puts over "
                        "--cap-gib (default: per model and sequence, LADDERS)")
    p.add_argument("--steps", type=int, default=2,
                   help="train steps per batch (2: the first step's slots are held by the second)")
    p.add_argument("--vocabulary-size", type=int, default=BERT_VOCABULARY)
    p.add_argument("--xla", action="store_true", help="jit_compile the step for every policy")
    p.add_argument("--cap-gib", type=float, default=4.5,
                   help="the most resident memory a worker may hold (killed above it)")
    p.add_argument("--limits-gib", nargs="+", type=float, default=[16.0, 40.0],
                   help="injected device limits for the batch that fits")
    p.add_argument("--effective-batch", type=int, default=64,
                   help="the global batch that accumulation must reach")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per worker")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--tag", default="", help="suffix for the output files (e.g. the machine)")
    p.add_argument("--resume", nargs="*", default=None, metavar="JSON",
                   help="keep the configurations the output's JSON (and these files) hold")
    p.add_argument("--merge-only", action="store_true",
                   help="with --resume: run nothing, mark what is missing as not run")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--sequence-length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--policy", help=argparse.SUPPRESS)
    return p.parse_args()


# ---- the parent: one watched worker per (model, sequence, policy) ----------------------------

def _run_worker(args, model: str, sequence: int, policy: str) -> tuple[list[dict], list[str]]:
    """The worker's points (one JSON line per batch) and notes; killed above the RSS cap."""
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--sequence-length",
           str(sequence), "--policy", policy, "--steps", str(args.steps), "--vocabulary-size",
           str(args.vocabulary_size), "--cap-gib", str(args.cap_gib),
           "--batches", *map(str, sorted(_batches(args, model, sequence)))]
    cmd += ["--xla"] if args.xla else []
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    errors: list[str] = []
    readers = [threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True),
               threading.Thread(target=lambda: errors.extend(child.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    notes, began, top = [], time.monotonic(), 0
    while child.poll() is None:
        rss = _rss_bytes(child.pid)
        top = max(top, rss or 0)
        if rss and rss > args.cap_gib * GIB:
            notes.append(f"killed by the guard: RSS {rss / GIB:.2f} GiB > {args.cap_gib} GiB")
        elif time.monotonic() - began > args.timeout:
            notes.append(f"timed out after {args.timeout:.0f} s")
        if notes:
            child.kill()
            child.wait()
            break
        time.sleep(0.1)
    for reader in readers:
        reader.join(5)
    points = [json.loads(line) for line in lines if line.startswith("{")]
    if child.returncode and not notes:
        notes.append(f"exit {child.returncode}: "
                     + ((errors or ["?"])[-1].strip()[:200]))
    notes.append(f"worker's largest RSS seen by the guard: {top / GIB:.2f} GiB")
    return points, notes


def _batches(args, model: str, sequence: int) -> list[int]:
    return args.batches or LADDERS.get((model, sequence), BERT_LADDER[model])


def _rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# ---- the worker: ascending batches, each in its own PeakMemory region ------------------------

def _worker(args) -> None:
    import keras
    import tensorflow as tf

    from ampflow.components.train.run.memory import PeakMemory, is_out_of_memory
    from ampflow.modeling.text_models import bert_builder

    points: list[dict] = []
    for batch in sorted(args.batches):
        keras.backend.clear_session()
        gc.collect()
        _return_freed_memory()
        predicted = _predict(points, batch, 16 * parameter_count(
            args.model, args.sequence_length, args.vocabulary_size))
        rss = _rss_bytes(os.getpid()) or 0
        overhead = max((p["process_region_bytes"] - p["allocator_peak_bytes"] for p in points),
                       default=0)
        if predicted is not None and rss + predicted + max(overhead, 0) > args.cap_gib * GIB:
            _emit({"batch": batch, "not_run": (
                f"predicted allocator peak {predicted / GIB:.2f} GiB; with the process's "
                f"{rss / GIB:.2f} GiB that passes the {args.cap_gib} GiB cap")})
            break
        keras.mixed_precision.set_global_policy(args.policy)
        keras.utils.set_random_seed(0)
        began = time.perf_counter()
        try:
            with PeakMemory() as region:
                model = bert_builder(args.model)(args.sequence_length, args.vocabulary_size,
                                                 NUM_CLASSES)
                applied, steps = _train_steps(tf, keras, model, args, batch)
                del model
        except Exception as e:  # an out-of-memory on a GPU is a result, not a crash
            if not is_out_of_memory(e):
                raise
            _emit({"batch": batch, "out_of_memory": str(e).splitlines()[0][:200]})
            break
        peak = region.result
        point = {"batch": batch, "allocator_peak_bytes": peak.region_bytes,
                 "allocator_source": peak.source, "device": peak.device,
                 "process_region_bytes": (peak.process_peak_bytes or 0)
                 - (peak.process_baseline_bytes or 0),
                 "process_peak_bytes": peak.process_peak_bytes, "steps": steps,
                 "updates_applied": applied, "seconds": time.perf_counter() - began}
        points.append(point)
        _emit(point)


def _return_freed_memory() -> None:
    """Give the freed heap back to the OS (glibc's malloc_trim), so RSS is what is in use."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _train_steps(tf, keras, model, args, batch: int) -> tuple[int, int]:
    """`--steps` steps of train's own step (more under float16 until one update applied)."""
    from ampflow.components.train.run.loop import LoopConfig, TrainLoop
    from ampflow.components.train.run.strategy import Runtime

    optimizer = keras.optimizers.Adam(1e-4)
    if args.policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  jit_compile=args.xla)
    loop = TrainLoop(Runtime(tf.distribute.get_strategy(), "default", "benchmark"), model,
                     LoopConfig(epochs=1, steps_per_epoch=args.steps, global_batch_size=batch,
                                jit_compile=args.xla,
                                loss_scaling=args.policy == "mixed_float16", state_dir="",
                                progress=False, item="text"))
    ids = tf.random.uniform((batch, args.sequence_length), 1, args.vocabulary_size, tf.int32,
                            seed=0)
    labels = tf.random.uniform((batch,), 0, NUM_CLASSES, tf.int64, seed=0)
    data = iter(tf.data.Dataset.from_tensors((ids, labels)).repeat())
    loop.run_steps(data, args.steps)
    steps = args.steps
    while (args.policy == "mixed_float16" and steps < args.steps + 16
           and int(model.optimizer.iterations.numpy()) == 0):
        loop.run_steps(data, 1)
        steps += 1
    return int(model.optimizer.iterations.numpy()), steps


def _predict(points: list[dict], batch: int, counted_fixed: int) -> float | None:
    """The next batch's allocator peak from the points so far, on the safe side.

    The larger of: the line through the last two points, and the last point's excess over
    the counted weights + gradients + Adam slots scaled to `batch` (all of it activations).
    """
    if not points:
        return None
    last = points[-1]
    scaled = counted_fixed + (last["allocator_peak_bytes"] - counted_fixed) * batch / last["batch"]
    if len(points) == 1:
        return scaled
    fixed, slope, _ = _fit([(p["batch"], p["allocator_peak_bytes"]) for p in points[-2:]])
    return max(fixed + max(slope, 0) * batch, scaled)


def _emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


# ---- the analysis ----------------------------------------------------------------------------

def _fit(xy: list[tuple[float, float]]) -> tuple[float, float, list[float]]:
    """Least squares y = a + b·x: (a, b, residuals)."""
    n = len(xy)
    mx = sum(x for x, _ in xy) / n
    my = sum(y for _, y in xy) / n
    sxx = sum((x - mx) ** 2 for x, _ in xy)
    b = sum((x - mx) * (y - my) for x, y in xy) / sxx if sxx else 0.0
    a = my - b * mx
    return a, b, [y - (a + b * x) for x, y in xy]


def parameter_count(model: str, sequence: int, vocabulary: int) -> int:
    """Trainable parameters of the encoder classifier (counted, not built: no TF needed)."""
    from ampflow.modeling.text_models import BERT_SHAPES

    s = BERT_SHAPES[model]
    h, f = s.hidden, s.intermediate
    embeddings = vocabulary * h + sequence * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
    return embeddings + s.layers * layer + (h * h + h) + (h * NUM_CLASSES + NUM_CLASSES)


def fits_under(limit_bytes: float, fixed: float, per_example: float) -> int:
    """The largest batch whose predicted peak stays under `limit_bytes` (0: none)."""
    return max(int((limit_bytes - fixed) // per_example), 0) if per_example > 0 else 0


def accumulation(effective: int, fits: int) -> dict:
    """Micro-batch (the largest divisor of `effective` that fits) and accumulation steps."""
    micro = max((d for d in range(1, effective + 1) if effective % d == 0 and d <= fits),
                default=0)
    return {"micro_batch": micro, "accumulation_steps": effective // micro if micro else None}


def split_fit(xy: list[tuple[float, float]], tolerance: float = 0.03) -> dict:
    """Fit `peak = max(floor, fixed + per_example × batch)` to (batch, peak) points, ascending.

    At small batches the step's peak is set by the optimizer's update (Adam's temporaries the
    size of the largest variable, BERT's token embedding), not by the activations, and does not
    grow with the batch: those points are the floor. The line is fit (least squares) to the
    longest run of the largest batches whose residuals stay within `tolerance` of the peak, and
    whose smaller points all lie at or above it (on the floor); at least the last two points.
    """
    for k in range(len(xy) - 1):
        a, b, residuals = _fit(xy[k:])
        on_line = all(abs(r) <= tolerance * y for r, (_, y) in zip(residuals, xy[k:], strict=True))
        above = all(y >= (a + b * x) * (1 - tolerance) for x, y in xy[:k])
        if on_line and above and b > 0:
            break
    else:
        k = len(xy) - 2
        a, b, residuals = _fit(xy[k:])
    return {"fixed": a, "per_example": b, "residuals": residuals, "first_on_line": k,
            "floor": max((y for _, y in xy[:k]), default=None)}


def _analyse(args, model, sequence, policy, points, notes) -> dict:
    measured = [p for p in points if "allocator_peak_bytes" in p]
    params = parameter_count(model, sequence, args.vocabulary_size)
    row = {"model": model, "sequence_length": sequence, "policy": policy, "points": points,
           "notes": notes, "trainable_params": params, "weights_grads_adam_bytes": 16 * params}
    if not measured:
        return {**row, "error": "not measured"}
    if len(measured) < 2:
        return {**row, "error": "one batch under the cap: no fit of its own"}
    xy = [(p["batch"], p["allocator_peak_bytes"]) for p in measured]
    fit = split_fit(xy)
    fixed, per_example, on_line = fit["fixed"], fit["per_example"], xy[fit["first_on_line"]:]
    largest = measured[-1]
    row.update(fixed_bytes=fixed, per_example_bytes=per_example, fit_batches=[
        x for x, _ in on_line], floor_bytes=fit["floor"],
        max_abs_residual_bytes=max(abs(r) for r in fit["residuals"]),
        max_relative_residual=max(abs(r) / y for r, (_, y)  # two points: a line, no check
                                  in zip(fit["residuals"], on_line, strict=True))
        if len(on_line) >= 3 else None,
        largest_measured_batch=largest["batch"],
        activation_share_at_largest=per_example * largest["batch"]
        / largest["allocator_peak_bytes"])
    if len(on_line) >= 3:
        a, b, _ = _fit(on_line[:-1])
        predicted = a + b * largest["batch"]
        row["leave_one_out"] = {"batch": largest["batch"], "predicted_bytes": predicted,
                                "measured_bytes": largest["allocator_peak_bytes"],
                                "relative_error": predicted / largest["allocator_peak_bytes"]
                                - 1}
    _limits(args, row)
    return row


def _limits(args, row: dict) -> None:
    """The batch that fits each injected limit, and the accumulation steps; the claim's peak."""
    fixed, per_example = row["fixed_bytes"], row["per_example_bytes"]
    row["limits"] = {}
    for limit in args.limits_gib:
        fits = fits_under(limit * GIB, fixed, per_example)
        row["limits"][str(limit)] = {"batch_that_fits": fits,
                                     **accumulation(args.effective_batch, fits)}
    row["predicted_claim_bytes"] = fixed + per_example * CLAIM["batch_size"]


def _borrow_fixed(args, configs: list[dict]) -> None:
    """Fit a shape with one batch under the cap from the fixed part of a fitted neighbour.

    The neighbour: the same model and policy at the shortest fitted sequence (+ 16 bytes per
    extra position-embedding parameter), else the same model and sequence under the other
    half-precision policy (the same float32 state and two-byte weight copies). Then
    per_example = (peak − fixed) / batch. Marked `fixed_from`.
    """
    half = ("mixed_bfloat16", "mixed_float16")
    for row in configs:
        measured = [p for p in row["points"] if "allocator_peak_bytes" in p]
        fitted = [c for c in configs if c["model"] == row["model"] and "fixed_bytes" in c
                  and "fixed_from" not in c]
        donor = min((c for c in fitted if c["policy"] == row["policy"]),
                    key=lambda c: c["sequence_length"], default=None) or next(
            (c for c in fitted if c["sequence_length"] == row["sequence_length"]
             and row["policy"] in half and c["policy"] in half), None)
        if "fixed_bytes" in row or len(measured) != 1 or donor is None:
            continue
        point = measured[0]
        fixed = donor["fixed_bytes"] + 16 * (row["trainable_params"] - donor["trainable_params"])
        row.pop("error", None)
        row.update(fixed_bytes=fixed, per_example_bytes=(point["allocator_peak_bytes"] - fixed)
                   / point["batch"], fit_batches=[point["batch"]],
                   fixed_from=f"{donor['policy']} at sequence {donor['sequence_length']}",
                   largest_measured_batch=point["batch"], max_relative_residual=None)
        row["activation_share_at_largest"] = (row["per_example_bytes"] * point["batch"]
                                              / point["allocator_peak_bytes"])
        _limits(args, row)


def _ratios(configs: list[dict]) -> None:
    """Each AMP row against float32 of the same model and sequence."""
    for row in configs:
        base = next((c for c in configs if c["model"] == row["model"] and "fixed_bytes" in c
                     and c["sequence_length"] == row["sequence_length"]
                     and c["policy"] == "float32"), None)
        if not base or "fixed_bytes" not in row:
            continue
        row["per_example_ratio_vs_float32"] = row["per_example_bytes"] / base["per_example_bytes"]
        row["claim_batch_ratio_vs_float32"] = (row["predicted_claim_bytes"]
                                               / base["predicted_claim_bytes"])
        for limit, entry in row["limits"].items():
            b = base["limits"][limit]
            entry["batch_ratio_vs_float32"] = (entry["batch_that_fits"] / b["batch_that_fits"]
                                               if b["batch_that_fits"] else None)
            entry["accumulation_steps_saved"] = (
                b["accumulation_steps"] - entry["accumulation_steps"]
                if b["accumulation_steps"] and entry["accumulation_steps"] else None)


def _claim(configs: list[dict]) -> dict:
    """The seed's 16 → 9 GB at bert_base 512 × 32, next to our fit's prediction per policy."""
    rows = {c["policy"]: c for c in configs if c["model"] == CLAIM["model"]
            and c["sequence_length"] == CLAIM["sequence_length"] and "fixed_bytes" in c}
    out = {**CLAIM, "claim_ratio": CLAIM["amp_gb"] / CLAIM["float32_gb"], "predicted": {}}
    for policy, c in rows.items():
        out["predicted"][policy] = {"gb": c["predicted_claim_bytes"] / 1e9,
                                    "ratio_vs_float32": c.get("claim_batch_ratio_vs_float32")}
    return out


if __name__ == "__main__":
    sys.exit(main())
