r"""Where a training step goes, against the op-level ceiling (issue 42 point 1, issue 40 point 3).

On the host it runs on, in ONE process and in this order:

1. **The ceiling** (op_ceiling.py): the model's own convolution and matmul shapes (for a
   Transformer also attention's batched matmuls and softmax), forward and backward, alone, in
   float32 and bfloat16, interleaved: GFLOP/s of each and the count-weighted bf16/float32 ratio,
   the most the whole step's ratio could be if everything else were free.
2. **The whole step per policy** through the project's own training path: the model, optimizer
   and input pipeline `ampflow train` builds (build.py), stepped by its `TrainLoop` (loop.py,
   `run_steps`, the timing unit `--autotune` uses), no XLA. The policies are interleaved round by
   round; the ratio is taken per round (side by side) and given as a fraction of the ceiling.
   mixed_float16 is measured only where the native-format rule (precision.py) calls float16
   native, or when asked for by `--policies`: on CPUs TF's float16 kernels are emulated (~80x
   slower without XLA), so it is reported as not native, with the rule's reason.
3. **A per-op profile** of the same steps: the TF profiler (chosen over oneDNN's verbose log
   because it sees every op the step runs, oneDNN's or not: casts, Eigen element-wise ops, the
   optimizer's updates, embedding gathers; oneDNN verbose sees only oneDNN primitives) splits
   the op time into groups, each as a share of the step, per policy, and attributes the gap
   between the bf16 step and the ceiling to each group (its bf16 time minus its float32 time /
   the ceiling). Layout reorders inside oneDNN's kernels are invisible to the TF profiler, so a
   short second process with ONEDNN_VERBOSE=profile_exec sums oneDNN's own primitive times per
   step (reorder, convolution, matmul, ...) for each policy (`--no-onednn-verbose` skips it).

JSON + Markdown under --out (train_step_profile_<model>_<cpu kind>[_tag].md), naming the CPU
flags, the load average beside each phase and the git commit the numbers were taken at.
A host without bf16 units still runs (bf16 emulated: it says so, and the ratio is < 1).

    python benchmarks/step_profile.py --model resnet50 --image-size 96 --batch-size 32
    python benchmarks/step_profile.py --model bert_small --sequence-length 128 --batch-size 32
    python benchmarks/step_profile.py --smoke --out /tmp/smoke   # plumbing, ~1 minute
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_host  # noqa: E402
import op_ceiling  # noqa: E402
from step_profile_report import group_ops, summarize, write_report  # noqa: E402

WARMUP_STEPS = 3
TEXT_DATASET = "ampflow_rotten_tomatoes"
IMAGE_DATASET = "ampflow_digits"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.onednn_worker:
        print(json.dumps(onednn_worker(args)))
        return 0
    report = run(args)
    write_report(report, Path(args.out))
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="resnet50",
                   help="an ampflow built-in: resnet50, mobilenet_v2, small_cnn, bert_small, ...")
    p.add_argument("--image-size", type=int, default=96, help="image models: in-model resize")
    p.add_argument("--sequence-length", type=int, default=128, help="text models: tokens")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--policies", nargs="+", default=None,
                   choices=("float32", "mixed_bfloat16", "mixed_float16"),
                   help="default: float32, mixed_bfloat16, and mixed_float16 where native")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (ceiling and step)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per policy per round")
    p.add_argument("--profile-steps", type=int, default=3, help="profiled steps per policy")
    p.add_argument("--no-onednn-verbose", dest="onednn_verbose", action="store_false",
                   help="skip the oneDNN primitive times (reorders) in a second process")
    p.add_argument("--data-dir", default=None, help="a prepared dataset (default: prepare one)")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--tag", default="", help="suffix for the output files")
    p.add_argument("--smoke", action="store_true",
                   help="tiny and quick: checks the plumbing, not the machine")
    p.add_argument("--onednn-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--policy", default="float32", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.rounds, args.steps, args.profile_steps = 1, 1, 1
    return args


def is_text_model(name: str) -> bool:
    from ampflow.modeling.text_models import BERT_SHAPES

    return name in BERT_SHAPES


def prepare(args) -> str:
    if args.data_dir:
        return args.data_dir
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    dataset = TEXT_DATASET if is_text_model(args.model) else IMAGE_DATASET
    out = Path(tempfile.gettempdir()) / f"ampflow-bench-{dataset}"
    return str(run_prepare_data(PrepareDataConfig(output_dir=out, dataset=dataset)).output_dir)


def train_config(args, data_dir: str, output_dir: str):
    """The TrainConfig `ampflow train` would get for this model, batch and length."""
    from ampflow.components.train.config import TrainConfig

    text = is_text_model(args.model)
    return TrainConfig(data_dir=Path(data_dir), output_dir=Path(output_dir), model=args.model,
                       image_size=None if text else args.image_size,
                       max_sequence_length=args.sequence_length, batch_size=args.batch_size,
                       steps_per_epoch=max(args.steps, 1), epochs=1)


class Session:
    """The data, runtime and tokenizer of one run, shared by every policy's loop."""

    def __init__(self, config) -> None:
        from ampflow.components.train.precision.policy import detect_hardware
        from ampflow.components.train.run.build import preprocessor_of, training_data
        from ampflow.components.train.run.strategy import distribute_datasets, make_runtime
        from ampflow.data import load_dataset_info

        self.config = config
        self.hardware = detect_hardware()
        self.info = load_dataset_info(config.data_dir)
        self.runtime = make_runtime(config)
        self.tokenizer = preprocessor_of(config, self.info)
        train_ds, _, _ = training_data(config, self.info, config.batch_size, self.tokenizer)
        self.dataset, _ = distribute_datasets(self.runtime, train_ds, None)

    def float32_model(self):
        import keras

        from ampflow.components.train.run.build import build_uncompiled_model

        keras.mixed_precision.set_global_policy("float32")
        return build_uncompiled_model(self.config, self.info, self.runtime, self.tokenizer)

    def loop(self, policy: str):
        """The model, optimizer and TrainLoop `ampflow train` makes, warmed up: (loop, iterator)."""
        import keras

        from ampflow.components.train.precision.policy import PrecisionSetup
        from ampflow.components.train.run.build import build_compiled_model
        from ampflow.components.train.run.loop import LoopConfig, TrainLoop

        keras.mixed_precision.set_global_policy(policy)
        keras.utils.set_random_seed(self.config.seed)
        setup = PrecisionSetup(policy, "step profile", False, "step profile: no XLA",
                               self.hardware.describe())
        model = build_compiled_model(self.config, self.info, setup, self.runtime,
                                     self.config.learning_rate, tokenizer=self.tokenizer)
        loop = TrainLoop(self.runtime, model, LoopConfig(
            epochs=1, steps_per_epoch=self.config.steps_per_epoch,
            global_batch_size=self.config.batch_size, jit_compile=False,
            loss_scaling=setup.loss_scaling, state_dir="", progress=False))
        iterator = iter(self.dataset)
        loop.run_steps(iterator, WARMUP_STEPS)  # traced now, under its own global policy
        return loop, iterator


def op_shapes(args, session: Session) -> list[op_ceiling.OpShape]:
    """The model's own conv/matmul shapes at this batch (and length)."""
    if is_text_model(args.model):
        from ampflow.modeling.text_models import BERT_SHAPES

        shape = BERT_SHAPES[args.model]
        return op_ceiling.encoder_op_shapes(shape.layers, shape.hidden, shape.heads,
                                            shape.intermediate,
                                            session.tokenizer.sequence_length, args.batch_size)
    return op_ceiling.image_op_shapes(session.float32_model(), args.batch_size)


def policies(args, hardware) -> tuple[list[str], dict[str, str]]:
    """The policies to measure, and those left out with the native-format rule's reason."""
    from ampflow.components.train.precision.policy import native_formats

    if args.policies:
        return list(args.policies), {}
    formats = native_formats(hardware)
    chosen, skipped = ["float32", "mixed_bfloat16"], {}
    if formats.float16.native:
        chosen.append("mixed_float16")
    else:
        skipped["mixed_float16"] = f"not native here ({formats.kind}): {formats.float16.why}"
    return chosen, skipped


def step_round(loops: dict, rates: dict, steps: int, batch: int, flip: bool) -> None:
    """Each policy's steps once, side by side (the order flipped when `flip`).

    Each turn runs one untimed step first (the first step after switching models can be far
    slower: one bert_tiny step took 7.2 s against 0.05 s in a smoke run on a busy host; the
    cause, oneDNN's primitive cache or the caches' contents, was not isolated), then `steps`
    steps timed one by one; the turn's rate is the batch over its median step, so one step
    slowed by another job on the shared cores does not count.
    """
    order = list(loops)
    for policy in (order[::-1] if flip else order):
        loop, iterator = loops[policy]
        loop.run_steps(iterator, 1)
        seconds = []
        for _ in range(steps):
            began = time.perf_counter()
            loop.run_steps(iterator, 1)
            seconds.append(time.perf_counter() - began)
        rates.setdefault(policy, []).append(batch / statistics.median(seconds))


def step_rows(rates: dict, batch: int) -> dict:
    """Per policy: the median rate over rounds, and the per-round ratio to float32's."""
    out = {}
    for policy, per_round in rates.items():
        median = statistics.median(per_round)
        out[policy] = {"examples_per_sec": median, "rounds_examples_per_sec": per_round,
                       "step_ms": 1000 * batch / median}
        if policy != "float32" and "float32" in rates:
            ratios = [x / y for x, y in zip(per_round, rates["float32"], strict=True)]
            out[policy]["rounds_ratio_vs_float32"] = ratios
            out[policy]["ratio_vs_float32"] = statistics.median(ratios)
    return out


def profile_steps(loop, iterator, steps: int) -> dict:
    """The TF profiler over `steps` steps: op time per step by (node name, op type)."""
    import glob

    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    loop.run_steps(iterator, 1)  # after a switch of models: see time_steps
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        began = time.perf_counter()
        loop.run_steps(iterator, steps)
        seconds = time.perf_counter() - began
        tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        space.ParseFromString(Path(glob.glob(f"{logdir}/**/*.xplane.pb",
                                             recursive=True)[0]).read_bytes())
    ops: dict[str, float] = {}
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:  # the executor threads: one event per op execution
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if name.rsplit(":", 1)[-1] in ("Process", "__inference_distributed_train_step"):
                    continue  # the executor's wrapper events, not ops
                ops[name] = ops.get(name, 0.0) + event.duration_ps / 1e9 / steps
    return {"step_ms_profiled": 1000 * seconds / steps, "ops": ops}


MARK = "ampflow-step-profile: timed steps begin"


def onednn_worker(args) -> dict:
    """In the verbose child: warm up, print a mark, run the steps; the parent parses after it."""
    with tempfile.TemporaryDirectory() as out:
        session = Session(train_config(args, args.data_dir, out))
        loop, iterator = session.loop(args.policy)
        print(MARK, flush=True)
        loop.run_steps(iterator, args.profile_steps)
    return {"policy": args.policy, "steps": args.profile_steps}


def parse_onednn_verbose(stdout: str, steps: int) -> dict[str, float]:
    """Milliseconds per step by oneDNN primitive kind, from the exec lines after MARK."""
    totals: dict[str, float] = {}
    timed = False
    for line in stdout.splitlines():
        if line.startswith(MARK):
            timed = True
            continue
        if not timed or not line.startswith("onednn_verbose") or ",exec," not in line:
            continue
        fields = line.split(",")
        at = fields.index("exec")
        try:
            ms = float(fields[-1])
        except ValueError:
            continue
        kind = fields[at + 2]
        totals[kind] = totals.get(kind, 0.0) + ms / steps
    return totals


def say(message: str) -> None:
    """A phase's start, on stderr (a run on a busy host takes long: show where it is)."""
    print(f"step_profile {time.strftime('%H:%M:%S')}: {message}", file=sys.stderr, flush=True)


def run(args) -> dict:
    """The three phases in one process; the report's dict."""
    loads = {"start": bench_host.load_average()}
    git = bench_host.git_commit()  # at the start: the code the run imports is this tree's now
    data_dir = prepare(args)
    with tempfile.TemporaryDirectory() as out:
        session = Session(train_config(args, data_dir, out))
        chosen, skipped = policies(args, session.hardware)
        shapes = op_shapes(args, session)
        loops = {}
        for policy in chosen:
            say(f"building and warming up the {policy} step")
            loops[policy] = session.loop(policy)
        say(f"ceiling: {len(shapes)} distinct ops x {op_ceiling.DTYPES}, traced")
        probe = op_ceiling.Probe(shapes, min_seconds=0.05 if args.smoke else 0.2)
        rates: dict[str, list[float]] = {}
        for r in range(args.rounds):  # the ceiling's round, then the step's: side by side
            say(f"round {r + 1}/{args.rounds}: the ceiling's ops, then {chosen} x {args.steps}")
            probe.round()
            step_round(loops, rates, args.steps, args.batch_size, flip=r % 2 == 1)
            loads[f"after_round_{r + 1}"] = bench_host.load_average()
        rows = probe.rows()
        step = step_rows(rates, args.batch_size)
        profiles = {}
        for policy, (loop, iterator) in loops.items():
            say(f"profiling {policy}: {args.profile_steps} steps")
            profiles[policy] = profile_steps(loop, iterator, args.profile_steps)
            profiles[policy]["groups_ms"] = group_ops(profiles[policy]["ops"])
        sequence = session.tokenizer.sequence_length if session.tokenizer else None
    del loops
    onednn = {}
    if args.onednn_verbose:
        for policy in chosen:
            say(f"oneDNN verbose child for {policy}")
            onednn[policy] = _onednn_child(args, data_dir, policy)
    loads["end"] = bench_host.load_average()
    import tensorflow as tf

    from ampflow.artifacts.throughput import throughput_unit
    from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT

    cpu = bench_host.cpu_capabilities()
    unit = throughput_unit(MODALITY_TEXT if sequence else MODALITY_IMAGE)
    report = {
        "model": args.model, "batch_size": args.batch_size, "tag": args.tag,
        "image_size": None if sequence else args.image_size, "sequence_length": sequence,
        "item": unit.item, "smoke": args.smoke,  # img, or texts for a text model
        "path": "build.build_compiled_model + loop.TrainLoop.run_steps (what ampflow train "
                "runs), no XLA, optimizer adam, the training input pipeline",
        "rounds": args.rounds, "steps_per_round": args.steps, "warmup_steps": WARMUP_STEPS,
        "profiled_steps": args.profile_steps, "policies": chosen, "skipped_policies": skipped,
        "tensorflow": tf.__version__, "device": bench_host.device(), "cpu": cpu,
        "cpu_kind": bench_host.cpu_kind(cpu), "cpu_simd_flags": bench_host.simd_flags(),
        "load_average": loads, "shared_host": True, "git": git,
        "ceiling_ops": rows, "ceiling": op_ceiling.ceiling(rows), "step": step,
        "profiles": profiles, "onednn_primitives_ms": onednn,
    }
    report["summary"] = summarize(report)
    return report


def _onednn_child(args, data_dir: str, policy: str) -> dict:
    cmd = [sys.executable, __file__, "--onednn-worker", "--policy", policy, "--model", args.model,
           "--image-size", str(args.image_size), "--sequence-length", str(args.sequence_length),
           "--batch-size", str(args.batch_size), "--profile-steps", str(args.profile_steps),
           "--steps", str(args.steps), "--data-dir", data_dir]
    env = {**os.environ, "ONEDNN_VERBOSE": "profile_exec"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 900 s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return parse_onednn_verbose(done.stdout, args.profile_steps)


if __name__ == "__main__":
    sys.exit(main())
