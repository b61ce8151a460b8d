r"""Text batches that follow their texts' length vs padding to the cap, side by side (issue 50).

On the offline movie-review snippets at cap 128 (`--max-sequence-length 128`), in one run:
- training: `ampflow train --model M --text-padding buckets|max_length`, each in its own
  process, interleaved; texts/s of the timed epoch (epoch 1, with tracing, is warm-up);
- accuracy: whole epochs of the same runs for each seed (`--accuracy-models`), test accuracy
  and its spread over the seeds for either padding;
- the cap's cost: buckets at the cap vs padding to a small cap (`--small-cap`, 32), whose
  texts are cut there: if the cost follows the texts, cap 128 runs near cap 32's texts/s;
- precisions (`--parts precisions`): length-following batches under `--precision` and
  `--compare-precision` (mixed_bfloat16), interleaved: the bf16 ratio, where the CPU has bf16;
- one XLA compile per bucket length: bert_tiny's forward + backward, jit-compiled, timed on its
  first call at each length against a later call (how many shapes, what one costs);
- serving in process: the exported `serving_default` (the tokenizer in the graph) of a SavedModel
  whose model takes any length (requests padded to their bucket) and of the same weights
  behind a fixed 128 input (padded to the cap), on 1 and on 32 real review snippets; p50 and
  texts/s, interleaved, and the answers' largest difference;
- serving over gRPC (`--parts grpc`, text_buckets_grpc.py): the same two exports, each served
  by an `ampflow serve` child process, queried by ampflow's `PredictionClient` with raw snippets
  (1, 32, and 1 long text among 31), each request to both in turn: p50, p99, texts/s, the
  ratio, the answers' largest difference and the share of same classes.
The host's CPU flags and load average are recorded (a shared 2-core host swings ±40 %).

    python benchmarks/text_length_buckets.py --workdir /tmp/buckets-bench
    python benchmarks/text_length_buckets.py --workdir /tmp/b --models bert_tiny --seeds 1
    python benchmarks/text_length_buckets.py --workdir /tmp/b --parts accuracy --tag accuracy
    python benchmarks/text_length_buckets.py --workdir /tmp/b --parts grpc --tag grpc

Writes benchmarks/results/text_length_buckets[_TAG].{json,md}.
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
from text_buckets_grpc import grpc_serving, markdown_lines  # noqa: E402

OUT = Path(__file__).parent / "results"
DATASET = "ampflow_rotten_tomatoes"
PADDINGS = ("buckets", "max_length")
PARTS = ("training", "caps", "precisions", "serving", "grpc", "xla_compile", "accuracy")


def main() -> int:
    args = _parse()
    args.workdir.mkdir(parents=True, exist_ok=True)
    data_dir = _prepare(args.workdir)
    report = {"benchmark": "text_length_buckets", "dataset": DATASET,
              "max_sequence_length": args.max_sequence_length, "batch_size": args.batch_size,
              "precision": args.precision, "host": _host(), "load_before": load_average(),
              "training": [], "caps": [], "precisions": [], "accuracy": [],
              "xla_compile": None, "serving": [], "grpc": []}
    parts = {"training": _training, "caps": _caps, "precisions": _precisions,
             "serving": _serving, "grpc": _grpc,
             "xla_compile": lambda a, _d: _xla_compile(a),
             "accuracy": lambda a, d: _accuracy(a, d, report["accuracy"],
                                                lambda: _write(a, report))}
    # each part written as soon as it is measured (accuracy after each run): a long run cut
    # short keeps what it has
    for part in args.parts:
        report[part] = parts[part](args, data_dir)
        report["load_after"] = load_average()
        _write(args, report)
    print("\n".join(markdown(report)))
    return 0


def _write(args, report: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "text_length_buckets" + (f"_{args.tag}" if args.tag else "")
    (OUT / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (OUT / f"{stem}.md").write_text("\n".join(markdown(report)) + "\n")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--models", nargs="*", default=["bert_tiny", "bert_small"])
    parser.add_argument("--accuracy-models", nargs="*", default=["bert_tiny"],
                        help="models whose whole-epoch accuracy is measured for each seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--accuracy-epochs", type=int, default=1)
    parser.add_argument("--timed-steps", type=int, default=30,
                        help="steps of the timed epoch (after a warm-up epoch as long)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="interleave the throughput runs this many times")
    parser.add_argument("--max-sequence-length", type=int, default=128)
    parser.add_argument("--small-cap", type=int, default=32,
                        help="the caps part: padded to this cap (texts cut there) vs buckets")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--compare-precision", default="mixed_bfloat16",
                        help="the precisions part: the policy set beside --precision")
    parser.add_argument("--serving-models", nargs="*", default=["bert_tiny", "bert_small"])
    parser.add_argument("--serving-calls", type=int, default=30,
                        help="requests of each kind (serving and grpc parts)")
    parser.add_argument("--grpc-rounds", type=int, default=3,
                        help="the grpc part: rounds over the requests, each to both servers")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--tag", default="")
    return parser.parse_args()


def _host() -> dict:
    import tensorflow as tf

    return {"cpu_flags": simd_flags(), "capabilities": cpu_capabilities(),
            "cpu_count": os.cpu_count(), "tensorflow": tf.__version__, "code": git_commit(
                ("components", "src", "benchmarks/text_length_buckets.py"))}


def _prepare(workdir: Path) -> Path:
    data_dir = workdir / "data"
    if not (data_dir / "dataset_info.json").is_file():
        subprocess.run([sys.executable, "-m", "ampflow.cli", "prepare-data", "--dataset",
                        DATASET, "--output-dir", str(data_dir)], check=True,
                       stdout=subprocess.DEVNULL)
    return data_dir


def _train(args, data_dir: Path, model: str, padding: str, seed: int, out: Path,
           steps: int | None, epochs: int, cap: int | None = None,
           precision: str | None = None) -> dict:
    """One `ampflow train` in its own process; its metadata.json's numbers."""
    cap = cap or args.max_sequence_length
    precision = precision or args.precision
    command = [sys.executable, "-m", "ampflow.cli", "train", "--data-dir", str(data_dir),
               "--output-dir", str(out), "--model", model, "--text-padding", padding,
               "--precision", precision, "--epochs", str(epochs), "--seed", str(seed),
               "--batch-size", str(args.batch_size),
               "--max-sequence-length", str(cap)]
    if steps:
        command += ["--steps-per-epoch", str(steps)]
    load = load_average()
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    meta = json.loads((out / "metadata.json").read_text())
    last = meta["epochs"][-1]
    return {"model": model, "padding": padding, "cap": cap, "seed": seed, "epochs": epochs,
            "precision": precision, "policy": meta.get("precision", {}).get("policy"),
            "jit_compile": meta.get("xla", {}).get("effective"),
            "steps_per_epoch": meta["steps_per_epoch"],
            "texts_per_s_last_epoch": last["examples_per_sec"],
            "train_seconds": meta["train_seconds"], "val_accuracy": last["val_accuracy"],
            "text_padding": meta["text_padding"], "wall_s": round(time.perf_counter() - began, 1),
            "load_before": load}


def _training(args, data_dir: Path) -> list[dict]:
    """texts/s of the second epoch of `--timed-steps` steps, buckets and cap interleaved."""
    runs = []
    for repeat in range(args.repeats):
        for model in args.models:
            for padding in PADDINGS:
                out = args.workdir / f"speed_{model}_{padding}_{repeat}"
                runs.append(_train(args, data_dir, model, padding, 1, out, args.timed_steps, 2))
                print(f"train {model} {padding}: {runs[-1]['texts_per_s_last_epoch']:.1f} texts/s",
                      flush=True)
    return runs


def _precisions(args, data_dir: Path) -> list[dict]:
    """Length-following batches under `--precision` and `--compare-precision`, interleaved."""
    runs = []
    for repeat in range(args.repeats):
        for model in args.models:
            for precision in (args.precision, args.compare_precision):
                out = args.workdir / f"precision_{model}_{precision}_{repeat}"
                runs.append(_train(args, data_dir, model, "buckets", 1, out, args.timed_steps,
                                   2, precision=precision))
                print(f"train {model} buckets {precision}: "
                      f"{runs[-1]['texts_per_s_last_epoch']:.1f} texts/s", flush=True)
    return runs


def _precisions_lines(report: dict) -> list[str]:
    """The precisions part: texts/s per policy on length-following batches (medians)."""
    runs = report.get("precisions") or []
    if not runs:
        return []
    names = list(dict.fromkeys(r["precision"] for r in runs))
    lines = ["", "## Length-following batches per precision (texts/s of the timed epoch, "
             "median of repeats)", "",
             "| model | " + " | ".join(f"{n} texts/s" for n in names) + f" | {names[-1]} × "
             f"{names[0]} | each repeat's pair | XLA |",
             "|---|" + "---:|" * (len(names) + 1) + "---|---|"]
    for model in dict.fromkeys(r["model"] for r in runs):
        speed = {n: statistics.median(r["texts_per_s_last_epoch"] for r in runs
                                      if r["model"] == model and r["precision"] == n)
                 for n in names}
        xla = ", ".join(f"{r['precision']}: {'on' if r.get('jit_compile') else 'off'}" for r in
                        {r["precision"]: r for r in runs if r["model"] == model}.values())
        mine = [r for r in runs if r["model"] == model]
        pairs = [b["texts_per_s_last_epoch"] / a["texts_per_s_last_epoch"]  # interleaved
                 for a, b in zip(mine[0::2], mine[1::2], strict=False)]
        lines.append(f"| {model} | " + " | ".join(f"{speed[n]:.1f}" for n in names)
                     + f" | {speed[names[-1]] / speed[names[0]]:.2f}× | "
                     + ", ".join(f"{p:.2f}×" for p in pairs) + f" | {xla} |")
    return lines


def _caps(args, data_dir: Path) -> list[dict]:
    """Buckets at the cap vs padded to `--small-cap`, interleaved: to see what the cap costs."""
    runs = []
    arms = (("buckets", args.max_sequence_length), ("max_length", args.small_cap))
    for repeat in range(args.repeats):
        for model in args.models:
            for padding, cap in arms:
                out = args.workdir / f"cap_{model}_{padding}_{cap}_{repeat}"
                runs.append(_train(args, data_dir, model, padding, 1, out, args.timed_steps, 2,
                                   cap=cap))
                print(f"caps {model} {padding} cap {cap}: "
                      f"{runs[-1]['texts_per_s_last_epoch']:.1f} texts/s", flush=True)
    return runs


def _accuracy(args, data_dir: Path, runs: list[dict], written) -> list[dict]:
    """Whole epochs per seed, buckets and the cap interleaved; `written()` after each run."""
    for model in args.accuracy_models:
        for seed in range(1, args.seeds + 1):
            for padding in PADDINGS:
                out = args.workdir / f"accuracy_{model}_{padding}_{seed}"
                runs.append(_train(args, data_dir, model, padding, seed, out, None,
                                   args.accuracy_epochs))
                print(f"accuracy {model} {padding} seed {seed}: {runs[-1]['val_accuracy']:.4f}",
                      flush=True)
                written()
    return runs


def _xla_compile(args) -> dict:
    """bert_tiny's jit-compiled forward + backward: first call (compile) vs a later one."""
    import keras
    import numpy as np
    import tensorflow as tf

    from ampflow.modeling.length_buckets import bucket_lengths
    from ampflow.modeling.models import make_text_model

    keras.utils.set_random_seed(0)
    model = make_text_model("bert_tiny", args.max_sequence_length, 20_000, 2,
                            policy="float32").model

    @tf.function(jit_compile=True, autograph=False)
    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                labels, model(ids, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        return tf.add_n([tf.reduce_sum(tf.convert_to_tensor(g)) for g in grads])

    rows = []
    labels = tf.zeros([args.batch_size], tf.int64)
    for length in bucket_lengths(args.max_sequence_length):
        ids = tf.constant(np.random.default_rng(length).integers(
            2, 20_000, size=(args.batch_size, length)), tf.int32)
        began = time.perf_counter()
        step(ids, labels).numpy()
        first = time.perf_counter() - began
        later = min(_timed(lambda x=ids: step(x, labels).numpy()) for _ in range(3))
        rows.append({"length": length, "first_call_s": round(first, 3),
                     "later_call_s": round(later, 4), "compile_s": round(first - later, 3)})
    return {"model": "bert_tiny", "shapes": len(rows), "per_length": rows}


def _timed(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def _exports(args, data_dir: Path) -> tuple[list[str], dict[str, dict[str, Path]]]:
    """Real test snippets and, for each serving model, its two exports (written once).

    `buckets` takes any length (requests padded to their bucket), `max_length` is the same
    weights behind a fixed cap input. Each is a model base path (version 1 inside), with the
    `ampflow_export.json` the export step writes, so a server knows its length buckets.
    """
    import keras

    from ampflow.components.export_savedmodel.text_signatures import (
        length_buckets_of,
        save_text_servable,
    )
    from ampflow.components.train.config import TrainConfig
    from ampflow.components.train.run.build import text_tokenizer
    from ampflow.data import load_dataset_info, load_texts
    from ampflow.modeling.models import make_text_model

    texts, _ = load_texts(data_dir, "test", limit=256)
    config = TrainConfig(data_dir=data_dir, output_dir=args.workdir / "unused", model="bert_tiny",
                         max_sequence_length=args.max_sequence_length)
    tokenizer = text_tokenizer(config, load_dataset_info(data_dir))
    cap, exports = args.max_sequence_length, {}
    for name in args.serving_models:
        exports[name] = {p: args.workdir / f"serve_{name}" / p for p in PADDINGS}
        if all((base / "1").exists() for base in exports[name].values()):
            continue
        keras.utils.set_random_seed(0)
        model = make_text_model(name, cap, tokenizer.vocabulary_size, 2, policy="float32").model
        ids = keras.Input((cap,), dtype="int32")
        fixed = keras.Model(ids, model(ids))  # the same weights, at the cap only
        for padding, keras_model in (("buckets", model), ("max_length", fixed)):
            version = exports[name][padding] / "1"
            save_text_servable(keras_model, tokenizer, ["fresh", "rotten"], version)
            (version / "ampflow_export.json").write_text(json.dumps(
                {"input": {"length_buckets": length_buckets_of(keras_model, cap)}}))
    return texts, exports


def _grpc(args, data_dir: Path) -> list[dict]:
    """The exports served by `ampflow serve` over gRPC (text_buckets_grpc.py)."""
    texts, exports = _exports(args, data_dir)
    return grpc_serving(texts, exports, args.workdir, args.serving_calls, args.grpc_rounds)


def _serving(args, data_dir: Path) -> list[dict]:
    """serving_default in process: buckets vs the same weights behind a fixed cap input."""
    import numpy as np
    import tensorflow as tf

    texts, exports = _exports(args, data_dir)
    rows = []
    for name, bases in exports.items():
        served = {p: tf.saved_model.load(str(base / "1")).signatures["serving_default"]
                  for p, base in bases.items()}
        for batch in (1, 32):
            requests = [tf.constant([t.encode("utf-8") for t in texts[i:i + batch]])
                        for i in range(0, len(texts) - batch + 1, batch)][:args.serving_calls]
            answers = {p: [fn(text=r)["probabilities"].numpy() for r in requests]
                       for p, fn in served.items()}  # the first calls: warm-up
            times = {p: [] for p in served}
            for _ in range(2):
                for padding, fn in served.items():  # interleaved
                    for request in requests:
                        times[padding].append(_timed(lambda f=fn, r=request: f(text=r)[
                            "probabilities"].numpy()))
            diff = max(float(np.abs(a - b).max()) for a, b in
                       zip(answers["buckets"], answers["max_length"], strict=True))
            same = all((a.argmax(-1) == b.argmax(-1)).all() for a, b in
                       zip(answers["buckets"], answers["max_length"], strict=True))
            row = {"model": name, "texts_per_request": batch, "max_abs_diff": diff,
                   "same_classes": bool(same), "load": load_average()}
            for padding, seconds in times.items():
                row[padding] = {"p50_ms": round(1000 * statistics.median(seconds), 2),
                                "texts_per_s": round(batch / statistics.mean(seconds), 1)}
            row["speedup"] = round(row["buckets"]["texts_per_s"]
                                   / row["max_length"]["texts_per_s"], 2)
            rows.append(row)
            print(f"serve {name} x{batch}: {row['speedup']}x", flush=True)
    return rows


def _pair(runs: list[dict], model: str, key: str) -> tuple[list[float], list[float]]:
    return tuple([r[key] for r in runs if r["model"] == model and r["padding"] == p]
                 for p in PADDINGS)


def _mean(values: list[float]) -> str:
    return f"{statistics.mean(values):.0f}" if values else "–"


def _spread(values: list[float]) -> str:
    if not values:
        return "–"
    mean = statistics.mean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * mean:.1f} % ± {100 * sd:.1f} (n={len(values)})"


def _caps_lines(report: dict) -> list[str]:
    """The caps part: buckets at the cap over padding to the small cap (medians of repeats)."""
    runs = report.get("caps") or []
    if not runs:
        return []
    lines = ["", "## The cap's cost: buckets at the cap vs padded to a small cap (texts cut there)",
             "", "| model | buckets, cap | texts/s | max_length, cap | texts/s | ratio |",
             "|---|---:|---:|---:|---:|---:|"]
    for model in dict.fromkeys(r["model"] for r in runs):
        arms = {p: [r for r in runs if r["model"] == model and r["padding"] == p] for p in PADDINGS}
        if not all(arms.values()):
            continue
        speed = {p: statistics.median(r["texts_per_s_last_epoch"] for r in rows)
                 for p, rows in arms.items()}
        lines.append(f"| {model} | {arms['buckets'][0]['cap']} | {speed['buckets']:.1f} | "
                     f"{arms['max_length'][0]['cap']} | {speed['max_length']:.1f} | "
                     f"{speed['buckets'] / speed['max_length']:.2f}× |")
    return lines


def markdown(report: dict) -> list[str]:
    host = report["host"]
    lines = [
        f"# Text batches by length bucket vs padded to the cap ({report['dataset']}, cap "
        f"{report['max_sequence_length']}, batch {report['batch_size']}, "
        f"{report['precision']})", "",
        f"Host: {host['capabilities'].get('model_name')}, {host['cpu_count']} cores, CPU flags "
        f"{', '.join(host['cpu_flags'])}; TF {host['tensorflow']}; load average before "
        f"{report['load_before']}, after {report.get('load_after')} (**a shared host**: other jobs "
        "ran beside this one; compare within a row, not across runs).", "",
        "## Training (texts/s of the timed epoch; `benchmarks/text_length_buckets.py`)", "",
        "| model | buckets texts/s | max_length texts/s | buckets × max_length |",
        "|---|---:|---:|---:|"]
    for model in dict.fromkeys(r["model"] for r in report["training"]):
        fast, slow = _pair(report["training"], model, "texts_per_s_last_epoch")
        if not fast or not slow:
            continue
        lines.append(f"| {model} | {statistics.median(fast):.1f} | {statistics.median(slow):.1f}"
                     f" | {statistics.median(fast) / statistics.median(slow):.2f}× |")
    lines += _caps_lines(report)
    lines += _precisions_lines(report)
    if report["accuracy"]:
        lines += ["", "## Accuracy (test split, mean ± sd over seeds)", "",
                  "| model | epochs | buckets | max_length | train s buckets / max_length |",
                  "|---|---:|---:|---:|---:|"]
        for model in dict.fromkeys(r["model"] for r in report["accuracy"]):
            acc = _pair(report["accuracy"], model, "val_accuracy")
            secs = _pair(report["accuracy"], model, "train_seconds")
            epochs = report["accuracy"][0]["epochs"]
            lines.append(f"| {model} | {epochs} | {_spread(acc[0])} | {_spread(acc[1])} | "
                         f"{_mean(secs[0])} / {_mean(secs[1])} |")
    xla = report["xla_compile"] or {"shapes": 0, "model": "–", "per_length": []}
    lines += ["", f"## XLA: {xla['shapes']} shapes, one compile each ({xla['model']}, forward + "
              "backward)", "", "| length | first call s | later call s | compile s |",
              "|---:|---:|---:|---:|"]
    lines += [f"| {r['length']} | {r['first_call_s']} | {r['later_call_s']} | {r['compile_s']} |"
              for r in xla["per_length"]]
    lines += ["", "## Serving in process (`serving_default`, raw snippets in)", "",
              "| model | texts/request | buckets p50 ms | buckets texts/s | max_length p50 ms | "
              "max_length texts/s | × | same classes | max abs diff |",
              "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in report["serving"]:
        lines.append(f"| {r['model']} | {r['texts_per_request']} | {r['buckets']['p50_ms']} | "
                     f"{r['buckets']['texts_per_s']} | {r['max_length']['p50_ms']} | "
                     f"{r['max_length']['texts_per_s']} | {r['speedup']}× | "
                     f"{'yes' if r['same_classes'] else 'NO'} | {r['max_abs_diff']:.1e} |")
    return lines + markdown_lines(report.get("grpc") or [])


if __name__ == "__main__":
    sys.exit(main())
