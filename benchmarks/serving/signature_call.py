"""Signature-call benchmark: the three ways the server can call a loaded signature, side by side.

For one model (the exported one, or the tiny contract model when none is given), in
interleaved rounds (each way once per round, the result the median of per-round ratios):
- public: `signature(images=x)`, TensorFlow's keyword call (binding and casting every call);
- flat: `SignatureCall` without its runtime call (`ConcreteFunction._call_flat`, argument
  order worked out at load time), what the server did before;
- runtime: `SignatureCall` as the server runs it now (`RuntimeCall`: the runtime call that
  `_call_flat` ends in, without TensorFlow's Python around it).
Each way takes the same numpy batch and returns numpy outputs, as a request does. Writes JSON
+ Markdown naming the host's CPU and its flags.

    .venv/bin/python benchmarks/serving/signature_call.py      # writes benchmarks/results/
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import (  # noqa: E402
    cpu_info,
    input_batch,
    latest_version_dir,
    model_base,
    write_report,
)

WAYS = ("public", "flat", "runtime")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model-base-path", default=None,
                   help="a model base dir (<name>/<version>/); default: the tiny contract model")
    p.add_argument("--rows", type=int, default=1, help="images per call")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    p.add_argument("--calls", type=int, default=1000, help="timed calls per way and round")
    p.add_argument("--out", default="benchmarks/results", help="output dir")
    p.add_argument("--name", default="signature_call", help="result file stem")
    return p.parse_args(argv)


def make_ways(version_dir: Path, rows: int, signature: str = "serving_default") -> dict:
    """A zero-argument call per way on `serving_default`, each with numpy in and out."""
    from ampflow.serving.models.servable import SavedModelServable, SignatureCall

    servable = SavedModelServable("bench", int(version_dir.name), version_dir)
    runtime = servable._functions[signature]
    if runtime.runtime_call is None:
        raise SystemExit(f"signature {signature!r} has no runtime call here (see the log)")
    flat = SignatureCall(runtime.fn)
    flat.runtime_call = None
    name, batch = input_batch(version_dir, rows)
    inputs = {name: batch}

    def public():
        return {k: v.numpy() for k, v in runtime.fn(**inputs).items()}

    return {"public": public, "flat": lambda: flat(inputs), "runtime": lambda: runtime(inputs)}


def measure(ways: dict, rounds: int, calls: int) -> list[dict]:
    """Per round, each way's mean µs per call (ways interleaved within the round)."""
    for call in ways.values():
        for _ in range(200):
            call()
    return [{way: timeit.timeit(call, number=calls) / calls * 1e6
             for way, call in ways.items()} for _ in range(rounds)]


def report(per_round: list[dict]) -> dict:
    median = {way: statistics.median(r[way] for r in per_round) for way in WAYS}
    ratios = {f"{a}/{b}": [r[a] / r[b] for r in per_round]
              for a, b in (("runtime", "flat"), ("runtime", "public"), ("flat", "public"))}
    return {"median_us": median,
            "ratios": {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                       for k, v in ratios.items()}}


def to_markdown(result: dict) -> str:
    host = result["host"]
    lines = [f"# Signature call ({result['label']})", "",
             f"Model: `{result['model']}`, signature `{result['signature']}`, {result['rows']} "
             f"row(s) per call; {result['rounds']} interleaved rounds of {result['calls']} calls "
             f"per way. Host: {host['model']}, {host['cores']} CPUs, flags "
             f"{', '.join(host['flags'])}; Python {host['python']}.", "",
             "| way | µs per call (median of rounds) |", "|---|---:|"]
    lines += [f"| {way} | {result['median_us'][way]:.1f} |" for way in WAYS]
    lines += ["", "| ratio | median | min | max |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {v['median']:.3f} | {v['min']:.3f} | {v['max']:.3f} |"
              for k, v in result["ratios"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ampflow-bench-") as tmp:
        version_dir = latest_version_dir(model_base(args.model_base_path, Path(tmp), "bench"))
        per_round = measure(make_ways(version_dir, args.rows), args.rounds, args.calls)
    result = {"label": args.name,
              "model": str(version_dir) if args.model_base_path else
              "tiny contract model (ampflow.serving.testing, 8x8x1 -> 10 classes)",
              "signature": "serving_default", "rows": args.rows, "rounds": args.rounds,
              "calls": args.calls, "host": cpu_info(), **report(per_round),
              "per_round_us": per_round}
    write_report(Path(args.out), args.name, result, to_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
