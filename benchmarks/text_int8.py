"""full_int8 of a text model, measured: each op's error, each runtime's answers (issue 46).

For each text SavedModel given (`--saved-model LABEL=DIR`, e.g. the same trained bert_tiny
exported before and after a change of its layers), side by side in one run:
- the full_int8 model convert makes (the same converter, calibration sentences and settings:
  components/convert_tflite), its op counts, and the range each SOFTMAX input spans (scale ×
  255: the attention scores' resolution);
- its answers on the test split in tf.lite and in LiteRT, each with its default kernels
  (XNNPACK) and with the builtin kernels alone: agreement with the SavedModel, accuracy,
  sentences that fail to run, and the largest probability difference between every pair;
- each op's quantization error against the float model (TensorFlow's QuantizationDebugger:
  RMSE and max |error| of the op's dequantized output, in units of its int8 step), worst first.
The host's CPU flags and load are recorded beside the numbers (bench_host.py).

    python benchmarks/text_int8.py --data-dir work/reviews \
        --saved-model before=work/old/ampflow/1 --saved-model after=work/new/ampflow/1
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import platform
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_host  # noqa: E402 (a sibling script, not a package)

OUT = Path(__file__).resolve().parent / "results" / "text_int8"
RUNS = {"tflite/xnnpack": ("tflite", "AUTO"), "tflite/builtin": ("tflite",
        "BUILTIN_WITHOUT_DEFAULT_DELEGATES"), "litert/xnnpack": ("litert", "AUTO"),
        "litert/builtin": ("litert", "BUILTIN_WITHOUT_DEFAULT_DELEGATES")}
WORST_OPS = 12


def measure(saved_model_dir: Path, data_dir: Path, *, test_limit: int | None,
            representative_size: int, debug_size: int) -> dict:
    """Every number above for one SavedModel."""
    from ampflow.components.convert_tflite import ConvertConfig
    from ampflow.components.convert_tflite.text_inputs import TextInputs
    from ampflow.components.convert_tflite.variants import SavedModelConverter

    config = ConvertConfig(saved_model_dir=saved_model_dir, data_dir=data_dir,
                           output_dir=Path("unused"), test_limit=test_limit,
                           representative_size=representative_size)
    inputs = TextInputs.of(saved_model_dir, config)
    ref = inputs.reference.predict(inputs.reference_inputs, config.batch_size)
    representative = inputs.representative(config)
    model = SavedModelConverter(saved_model_dir, inputs.signature_key,
                                loaded=inputs.reference.loaded).convert(
        "full_int8", representative=representative, input_shape=inputs.reference.input_shape)
    answers = {name: _answers(model, inputs.model_inputs, *how) for name, how in RUNS.items()}
    ref_ids, labels = np.argmax(ref, axis=-1), inputs.labels
    runs = {name: {"agreement": float(np.mean(a["ids"] == ref_ids)),
                   "accuracy": float(np.mean(a["ids"] == labels)),
                   "failed_sentences": int(np.sum(a["ids"] < 0)),
                   "max_abs_prob_diff_vs_savedmodel": _max_diff(a["probs"], ref)}
            for name, a in answers.items()}
    between = {f"{a} vs {b}": _max_diff(answers[a]["probs"], answers[b]["probs"])
               for i, a in enumerate(RUNS) for b in list(RUNS)[i + 1:]}
    return {"test_sentences": int(len(labels)), "savedmodel_probabilities": ref,
            "savedmodel_accuracy": float(np.mean(ref_ids == labels)),
            "tokens_per_sentence": _quantiles((inputs.model_inputs != 0).sum(axis=1)),
            "model": _structure(model), "runs": runs, "max_abs_prob_diff_between": between,
            "op_errors": _op_errors(saved_model_dir, inputs.signature_key, representative,
                                    inputs.model_inputs[:debug_size])}


def _interpreter(model: bytes, runtime: str, resolver: str):
    if runtime == "tflite":
        import tensorflow as tf

        make, kinds = tf.lite.Interpreter, tf.lite.experimental.OpResolverType
    else:
        from ai_edge_litert import interpreter as litert

        make, kinds = litert.Interpreter, litert.OpResolverType
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make(model_content=model, experimental_op_resolver_type=kinds[resolver])


def _answers(model: bytes, ids: np.ndarray, runtime: str, resolver: str) -> dict:
    """Probabilities and classes, one sentence at a time (one that fails: NaN and -1)."""
    runner = _interpreter(model, runtime, resolver).get_signature_runner("token_ids")
    probs, classes = [], []
    for row in ids:
        try:
            out = runner(input_ids=row[None])
            probs.append(out["probabilities"][0])
            classes.append(int(out["class_ids"][0]))
        except RuntimeError:  # a kernel's own check (int8 DIV by a quantized 0)
            probs.append(None)
            classes.append(-1)
    width = next(len(p) for p in probs if p is not None)
    return {"probs": np.stack([np.full(width, np.nan) if p is None else p for p in probs]),
            "ids": np.asarray(classes)}


def _max_diff(a: np.ndarray, b: np.ndarray) -> float | None:
    both = ~(np.isnan(a).any(axis=1) | np.isnan(b).any(axis=1))
    return float(np.max(np.abs(a[both] - b[both]))) if both.any() else None


def _quantiles(values: np.ndarray) -> dict:
    return {f"p{q}": float(np.percentile(values, q)) for q in (0, 50, 90, 100)}


def _structure(model: bytes) -> dict:
    """Op counts, and the range each SOFTMAX input spans (scale × 255) with its name."""
    interpreter = _interpreter(model, "litert", "AUTO")
    ops = interpreter._get_ops_details()
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    counts: dict[str, int] = {}
    for op in ops:
        counts[op["op_name"]] = counts.get(op["op_name"], 0) + 1
    softmax = [{"input": tensors[op["inputs"][0]]["name"][-70:],
                "range": float(tensors[op["inputs"][0]]["quantization"][0] * 255)}
               for op in ops if op["op_name"] == "SOFTMAX"]
    return {"size_bytes": len(model), "op_counts": dict(sorted(counts.items())),
            "softmax_inputs": softmax}


def _op_errors(saved_model_dir: Path, signature_key: str, representative: np.ndarray,
               debug_ids: np.ndarray) -> list[dict]:
    """QuantizationDebugger's per-op statistics, worst RMSE (in int8 steps) first."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model_dir),
                                                         signature_keys=[signature_key])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.representative_dataset = lambda: ([representative[i:i + 1]]
                                                for i in range(len(representative)))
    debugger = tf.lite.experimental.QuantizationDebugger(
        converter=converter,
        debug_dataset=lambda: ([debug_ids[i:i + 1]] for i in range(len(debug_ids))))
    debugger.run()
    dump = io.StringIO()
    debugger.layer_statistics_dump(dump)
    rows = []
    for row in csv.DictReader(io.StringIO(dump.getvalue())):
        scale = float(row["scale"])
        if not scale:
            continue
        rmse = float(row["mean_squared_error"]) ** 0.5
        rows.append({"op": row["op_name"], "tensor": row["tensor_name"][-70:],
                     "scale": scale, "rmse_steps": rmse / scale,
                     "max_abs_error_steps": float(row["max_abs_error"]) / scale})
    rows.sort(key=lambda r: -r["rmse_steps"])
    return rows[:WORST_OPS]


def markdown(payload: dict) -> str:
    """The side-by-side table, then each model's worst ops."""
    host = payload["host"]
    lines = ["# full_int8 of a text model: runtimes and per-op error", "",
             f"Host: {host['cpu']['model_name']} ({', '.join(host['simd_flags'])}), "
             f"{host['device']}, load {host['load_average']}; TensorFlow "
             f"{payload['tensorflow']}, ai-edge-litert {payload['litert']}.", "",
             payload["note"], "",
             "| model | run | agreement | accuracy (SavedModel) | failed | max abs dp vs "
             "SavedModel |", "|---|---|---:|---:|---:|---:|"]
    for label, m in payload["models"].items():
        for name, r in m["runs"].items():
            lines.append(f"| {label} | {name} | {r['agreement']:.4f} | {r['accuracy']:.4f} "
                         f"({m['savedmodel_accuracy']:.4f}) | {r['failed_sentences']} | "
                         f"{_fmt(r['max_abs_prob_diff_vs_savedmodel'])} |")
    for label, m in payload["models"].items():
        spans = ", ".join(f"{s['range']:.3g}" for s in m["model"]["softmax_inputs"])
        lines += ["", f"## {label}", "",
                  f"{m['test_sentences']} test sentences (tokens {m['tokens_per_sentence']}); "
                  f"SavedModel's largest probability difference from the first model's: "
                  f"{m['savedmodel_max_abs_prob_diff_vs_first']:.3g}; "
                  f"ops: {m['model']['op_counts']}; SOFTMAX input ranges: {spans}.", "",
                  "Largest probability difference between runs: " + "; ".join(
                      f"{k} {_fmt(v)}" for k, v in m["max_abs_prob_diff_between"].items()),
                  "", "| op | tensor | scale | RMSE (steps) | max abs error (steps) |",
                  "|---|---|---:|---:|---:|"]
        lines += [f"| {r['op']} | `{r['tensor']}` | {r['scale']:.3g} | {r['rmse_steps']:.2f} "
                  f"| {r['max_abs_error_steps']:.1f} |" for r in m["op_errors"]]
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--saved-model", action="append", required=True, metavar="LABEL=DIR")
    parser.add_argument("--test-limit", type=int, default=None)
    parser.add_argument("--representative-size", type=int, default=200)
    parser.add_argument("--debug-size", type=int, default=100,
                        help="Test sentences the per-op error is measured on.")
    parser.add_argument("--note", default="", help="What the models are (recorded as is).")
    parser.add_argument("--out", type=Path, default=OUT, help="Writes OUT.json and OUT.md.")
    args = parser.parse_args(argv)
    from importlib.metadata import version

    import tensorflow as tf

    models = {}
    for item in args.saved_model:
        label, _, directory = item.partition("=")
        models[label] = measure(Path(directory), args.data_dir, test_limit=args.test_limit,
                                representative_size=args.representative_size,
                                debug_size=args.debug_size)
    first = next(iter(models.values()))["savedmodel_probabilities"]
    for m in models.values():  # e.g. the same weights before and after a change of layers
        m["savedmodel_max_abs_prob_diff_vs_first"] = _max_diff(
            m.pop("savedmodel_probabilities"), first)
    payload = {"host": {"cpu": bench_host.cpu_capabilities(), "simd_flags":
                        bench_host.simd_flags(), "device": bench_host.device(),
                        "load_average": bench_host.load_average(),
                        "machine": platform.machine(),
                        "git": bench_host.git_commit(("components",))},
               "tensorflow": tf.__version__, "litert": version("ai-edge-litert"),
               "note": args.note, "models": models}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(payload))
    print(markdown(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
