"""step_profile.py's op groups, its summary (fractions of the ceiling, who holds the gap), tables.

Plain Python on the measured dicts (no TensorFlow), so the grouping and the arithmetic are
tested without a run (tests/benchmarks/test_step_profile.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# The profile's groups, in the order the tables show them.
GROUPS = ("convolutions/matmuls", "BatchNorm/LayerNorm", "softmax", "casts", "layout reorders",
          "element-wise", "embedding", "optimizer", "other")

_MATMUL_OPS = ("Conv2D", "DepthwiseConv2d", "MatMul", "Einsum")
_ELEMENTWISE = frozenset((
    "Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "DivNoNan", "Neg", "Square", "Sqrt",
    "Rsqrt", "SquaredDifference", "Maximum", "Minimum", "Relu", "ReluGrad", "Relu6", "Relu6Grad",
    "Tanh", "TanhGrad", "Erf", "Exp", "Log", "Pow", "Sigmoid", "SigmoidGrad", "Select",
    "SelectV2", "Greater", "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual",
    "LogicalAnd", "Cos", "Sin", "ZerosLike", "OnesLike", "BiasAdd", "BiasAddGrad", "Reciprocal",
    "Abs", "Sign", "Floor", "ClipByValue", "IsFinite", "FloorMod", "Cast_", "Gelu", "GeluGrad",
    "Softplus", "Fill", "BroadcastTo", "Tile", "Erfc", "_UnaryOpsComposition", "Square",
    "StatelessRandomUniformV2", "Round"))
_EMBEDDING_OPS = ("ResourceGather", "UnsortedSegmentSum", "SparseSegment")  # Gather: by scope
_TRANSPOSE_OPS = ("Transpose", "ConjugateTranspose")


def _op_type(name: str) -> str:
    op = name.rsplit(":", 1)[-1]
    for prefix in ("_MklNative", "_Mkl", "_Fused"):
        if op.startswith(prefix):
            op = op[len(prefix):]
    return op


def op_group(name: str) -> str:
    """The group of one profiled op, from its type and its node's name scope ("scope:Type").

    The op type decides first (a Cast is a cast wherever it is; oneDNN's _Mkl prefixes are
    dropped); then the Keras layer's scope in the node name: the gradient ops of a
    LayerNormalization or a softmax are plain Mul/Sub/Sum ops under that layer's scope. The
    embedding's sparse gradient, summed into rows (UnsortedSegmentSum) inside the optimizer's
    scope, counts as embedding: it is what the embedding table costs.
    """
    scope, _, raw = name.rpartition(":")
    op = _op_type(name)
    lowered = scope.lower()
    if op == "Cast":
        return "casts"
    if any(k in op for k in _MATMUL_OPS) and "BatchNorm" not in op:
        return "convolutions/matmuls"
    if "BatchNorm" in op or "LayerNorm" in op:
        return "BatchNorm/LayerNorm"
    if "Softmax" in op and "CrossEntropy" not in op:
        return "softmax"
    if op.startswith(_TRANSPOSE_OPS):
        return "layout reorders"
    if _NORM_SCOPE.search(lowered):
        return "BatchNorm/LayerNorm"
    if _SOFTMAX_SCOPE.search(lowered):
        return "softmax"
    if op.startswith(_EMBEDDING_OPS) or "embedding" in lowered:
        return "embedding"
    if op.startswith("ResourceApply") or _OPTIMIZER_SCOPE.search(lowered):
        return "optimizer"
    if op in _ELEMENTWISE or raw in _ELEMENTWISE:
        return "element-wise"
    return "other"


_NORM_SCOPE = re.compile(r"(^|/)[^/]*(norm|batch_normalization)[^/]*/")
_SOFTMAX_SCOPE = re.compile(r"(^|/)[^/]*softmax[^/]*/")
_OPTIMIZER_SCOPE = re.compile(r"(^|/)(adam|adamw|sgd|loss_scale_optimizer)(_\d+)?/")


def group_ops(ops: dict[str, float]) -> dict[str, float]:
    """Milliseconds per step by group (every group present, 0 where none of its ops ran)."""
    groups = dict.fromkeys(GROUPS, 0.0)
    for name, ms in ops.items():
        groups[op_group(name)] += ms
    return groups


def top_op_types(ops: dict[str, float], n: int = 10) -> list[tuple[str, float]]:
    """The `n` op types that took the most time (ms per step), over all their nodes."""
    by_type: dict[str, float] = {}
    for name, ms in ops.items():
        op = name.rsplit(":", 1)[-1]
        by_type[op] = by_type.get(op, 0.0) + ms
    return sorted(by_type.items(), key=lambda kv: -kv[1])[:n]


def summarize(report: dict) -> dict:
    """The step's ratio as a fraction of the ceiling, and each group's share of the gap.

    Gap: the bf16 step would reach the ceiling if every group's time shrank by the ceiling
    ratio C; a group holds `bf16 ms - float32 ms / C` of the difference (the sum over the
    groups is the bf16 step's op time minus the float32 step's op time / C). Shares in op time
    (summed over the executor threads).
    """
    ceiling = report["ceiling"]
    c = ceiling.get("ratio")
    out: dict = {"ceiling_ratio": c, "bf16_hardware": report["cpu"]["bf16_hardware"]}
    if not report["cpu"]["bf16_hardware"]:
        out["note"] = ("this CPU has no AVX512_BF16/AMX: bfloat16 runs emulated (oneDNN ISA: "
                       f"{report['cpu']['onednn_isa']}), so the ceiling is below 1 and "
                       "mixed_bfloat16 is no speed-up here; auto keeps float32")
    step = report["step"]
    for policy, row in step.items():
        ms = ceiling["ms_per_step"].get({"mixed_bfloat16": "bfloat16"}.get(policy, "float32"))
        if ms:  # the conv/matmul ops at their isolated speed, as a share of the whole step
            row["ceiling_ops_fraction_of_step"] = ms / row["step_ms"]
    bf16 = step.get("mixed_bfloat16", {})
    ratio = bf16.get("ratio_vs_float32")
    out["step_ratio"] = ratio
    out["fraction_of_ceiling"] = ratio / c if ratio and c else None
    pairs = zip(bf16.get("rounds_ratio_vs_float32") or [], ceiling.get("rounds_ratio") or [],
                strict=False)  # round k's step ratio over round k's ceiling: side by side
    fractions = [step_ratio / round_c for step_ratio, round_c in pairs]
    out["rounds_fraction_of_ceiling"] = fractions
    profiles = report["profiles"]
    if c and "float32" in profiles and "mixed_bfloat16" in profiles:
        f32, b16 = profiles["float32"]["groups_ms"], profiles["mixed_bfloat16"]["groups_ms"]
        gap = {g: b16[g] - f32[g] / c for g in GROUPS}
        total = sum(gap.values())
        out["gap_ms"] = gap
        out["gap_share"] = {g: v / total for g, v in gap.items()} if total > 0 else None
        out["group_ratio"] = {g: f32[g] / b16[g] if b16[g] else None for g in GROUPS}
        out["op_time_ratio"] = sum(f32.values()) / sum(b16.values()) if sum(b16.values()) else None
    return out


def _pct(x) -> str:
    return f"{x:.0%}" if x is not None else "–"


def _x(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}×" if x else "–"


def stem(report: dict) -> str:
    size = (f"_{report['sequence_length']}" if report["sequence_length"]
            else f"_{report['image_size']}")
    return (f"train_step_profile_{report['model']}{size}_{report['cpu_kind']}"
            + (f"_{report['tag']}" if report["tag"] else ""))


def write_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    name = stem(report)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2))
    text = "\n".join(markdown(report)) + "\n"
    (out / f"{name}.md").write_text(text)
    print(text)


def markdown(report: dict) -> list[str]:
    s, cpu = report["summary"], report["cpu"]
    size = (f"sequence {report['sequence_length']}" if report["sequence_length"]
            else f"{report['image_size']}²")
    git = report["git"]
    lines = [f"# Where a training step goes: {report['model']} at {size}, batch "
             f"{report['batch_size']} ({report['cpu_kind']}, shared host)", "",
             f"CPU: {cpu['model_name']}, {report['device']}; bf16 units: "
             f"{', '.join(cpu['bf16_units']) or 'none'}; oneDNN ISA: {cpu['onednn_isa']}; "
             f"SIMD flags: {' '.join(report['cpu_simd_flags'])}. TensorFlow "
             f"{report['tensorflow']}. Commit {str(git['commit'])[:12]}"
             + (f" (uncommitted changes in {', '.join(git['uncommitted_in'])})"
                if git["uncommitted_in"] else "") + ". Load average (1/5/15 min) "
             + "; ".join(f"{k} {v}" for k, v in report["load_average"].items())
             + ": **shared** host, numbers are ratios taken side by side.", ""]
    if s.get("note"):
        lines += [f"**{s['note']}.**", ""]
    lines += _ceiling_table(report) + _step_table(report) + _profile_table(report)
    lines += _verdict(report)
    return lines


def _ceiling_table(report: dict) -> list[str]:
    c = report["ceiling"]
    lines = ["## 1. The ceiling: the model's own conv/matmul ops alone (forward + both "
             "gradients)", "",
             f"Interleaved, {report['rounds']} round(s), median. Count = occurrences per step.", "",
             "| op | count | GFLOP each | float32 ms | float32 GFLOP/s | bf16 ms | bf16 GFLOP/s "
             "| bf16 / f32 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    rows = sorted(report["ceiling_ops"], key=lambda r: -r["count"] * r["float32"].get("ms", 0))
    for r in rows:
        cells = []
        for d in ("float32", "bfloat16"):
            m = r[d]
            cells += ([f"{m['ms']:.2f}", f"{m['gflops']:.0f}" if m.get("gflops") else "–"]
                      if "ms" in m else [m["error"][:60], ""])
        lines.append(f"| {r['label']} | {r['count']} | {r['gflop']:.2f} | " + " | ".join(cells)
                     + f" | {_x(r['bf16_speedup'])} |")
    ms, gf = c["ms_per_step"], c["gflops"]
    lines += ["", f"**Ceiling: {_x(c['ratio'])}** (median of the rounds' ratios: "
              + ", ".join(f"{x:.2f}" for x in c.get("rounds_ratio") or []) + ") — per step "
              "these ops take "
              f"{ms['float32']:.0f} ms in float32 ({gf['float32'] or 0:.0f} GFLOP/s) and "
              f"{ms['bfloat16']:.0f} ms in bf16 ({gf['bfloat16'] or 0:.0f} GFLOP/s), "
              f"{c['gflop_per_step']:.0f} GFLOP."]
    if c.get("softmax_ms_per_step"):
        sm = c["softmax_ms_per_step"]
        lines.append(f"Softmax alone (not in the ceiling: the model keeps it in float32): "
                     f"{sm['float32']:.0f} ms per step in float32, {sm['bfloat16']:.0f} in bf16.")
    return lines + [""]


def _step_table(report: dict) -> list[str]:
    item = report["item"]
    lines = ["## 2. The whole step per policy (the project's training path)", "",
             f"{report['path']}; {report['warmup_steps']} warm-up steps, then "
             f"{report['rounds']} interleaved round(s) × {report['steps_per_round']} steps.", "",
             f"| policy | {item}/s (median) | per round | step ms | × float32 (per-round median) "
             "| fraction of ceiling | ceiling ops / step |", "|---|---:|---:|---:|---:|---:|---:|"]
    c = report["ceiling"]["ratio"]
    for policy, r in report["step"].items():
        ratio = r.get("ratio_vs_float32")
        lines.append(f"| {policy} | {r['examples_per_sec']:.1f} | "
                     + ", ".join(f"{x:.1f}" for x in r["rounds_examples_per_sec"])
                     + f" | {r['step_ms']:.0f} | {_x(ratio) if ratio else '1.00×'} | "
                     f"{_pct(ratio / c) if ratio and c else '–'} | "
                     f"{_pct(r.get('ceiling_ops_fraction_of_step'))} |")
    for policy, why in report["skipped_policies"].items():
        lines.append(f"| {policy} | not measured: {why} | | | | | |")
    lines += ["", "*ceiling ops / step*: the conv/matmul ops' isolated time (table 1) as a "
              "share of the policy's whole step: the rest of the step is everything else.", ""]
    return lines


def _profile_table(report: dict) -> list[str]:
    profiles = report["profiles"]
    policies = list(profiles)
    s = report["summary"]
    head = " | ".join(f"{p} ms (share)" for p in policies)
    lines = ["## 3. Per-op profile (TF profiler), op time per step by group", "",
             f"{report['profiled_steps']} profiled step(s) per policy after the timing; op time "
             "summed over the executor threads. *gap*: the group's bf16 time minus its float32 "
             "time / the ceiling, i.e. what it holds of the distance to the ceiling.", "",
             f"| group | {head} | f32 / bf16 | gap ms | share of the gap |",
             "|---|" + "---:|" * (len(policies) + 3)]
    for g in [g for g in GROUPS if any(profiles[p]["groups_ms"][g] for p in policies)]:
        cells = []
        for p in policies:
            groups = profiles[p]["groups_ms"]
            total = sum(groups.values()) or 1.0
            cells.append(f"{groups[g]:.0f} ({groups[g] / total:.0%})")
        gap = (s.get("gap_ms") or {}).get(g)
        ratio = (s.get("group_ratio") or {}).get(g)
        share = (s.get("gap_share") or {}).get(g)
        lines.append(f"| {g} | " + " | ".join(cells) + f" | {_x(ratio)} | "
                     f"{f'{gap:.0f}' if gap is not None else '–'} | {_pct(share)} |")
    lines.append("| **all ops** | " + " | ".join(
        f"{sum(profiles[p]['groups_ms'].values()):.0f}" for p in policies)
        + f" | {_x(s.get('op_time_ratio'))} | | |")
    lines += ["", "Top op types (ms per step):", ""]
    for p in policies:
        lines.append(f"- {p}: " + ", ".join(f"{op} {ms:.0f}"
                                            for op, ms in top_op_types(profiles[p]["ops"])))
    onednn = report["onednn_primitives_ms"]
    if onednn:
        lines += ["", "oneDNN's own primitive times (ONEDNN_VERBOSE=profile_exec, a second "
                  "process, same steps; reorders are inside the TF ops above):", ""]
        for p, kinds in onednn.items():
            if "error" in kinds:
                lines.append(f"- {p}: {kinds['error']}")
                continue
            total = sum(kinds.values()) or 1.0
            lines.append(f"- {p}: " + ", ".join(
                f"{k} {ms:.0f} ms ({ms / total:.0%})"
                for k, ms in sorted(kinds.items(), key=lambda kv: -kv[1])))
    return lines + [""]


def _verdict(report: dict) -> list[str]:
    s = report["summary"]
    if s.get("step_ratio") is None or s.get("ceiling_ratio") is None:
        return ["## Verdict", "", "mixed_bfloat16 or the ceiling was not measured."]
    rounds = ", ".join(f"{f:.0%}" for f in s.get("rounds_fraction_of_ceiling") or [])
    lines = ["## Verdict", "",
             f"mixed_bfloat16 / float32: **{s['step_ratio']:.2f}×** against a ceiling of "
             f"**{s['ceiling_ratio']:.2f}×**: **{s['fraction_of_ceiling']:.0%} of the ceiling**"
             + (f" (round by round: {rounds})." if rounds else ".")]
    if s.get("gap_share"):
        held = sorted(((g, v) for g, v in s["gap_share"].items() if v > 0.02),
                      key=lambda kv: -kv[1])
        lines.append("What holds the rest (share of the gap): " + ", ".join(
            f"{g} {v:.0%}" for g, v in held) + ".")
    return lines
