"""The AMP check: does a model keep the precision chain under a policy, before any epoch runs.

The practical rules of mixed precision (docs/DESIGN.md, "Precision policy"): the output layer
computes in float32; every other layer computes in the policy's half type with float32
variables; a custom layer or a hand-set `dtype=` that computes in another type breaks that chain
with a Cast on each side of it, forward and backward. `check_amp` reads each layer's dtype
policy, then traces ONE train step (forward under a GradientTape, the loss, the gradients; no
optimizer update, nothing executed) and reads its graph:

- every floating-point `Cast` op, attributed to the layer whose name scope made it (each layer's
  `call` is wrapped while tracing to record the scope TF gave it: Keras 3 suffixes scopes, e.g.
  layer `dense_1` ran in `functional_1/dense_1_2`, so names alone are ambiguous). A gradient op
  is named `gradient_tape/<forward op>/...`, so a backward Cast belongs where its forward op
  does. Casts are sorted by what they cast: a variable read (Keras's autocast of a float32
  variable to the compute dtype, expected), a constant, a layer's input at a dtype boundary, or
  the layer's own math;
- Softmax, Log, Exp and large reductions that compute in float16 outside the head;
- attention (docs/how-to/text-models.md): a softmax over attention scores (the product of two
  computed tensors: an Einsum or batched MatMul, not a layer's weights) computed in float16 is
  named with the attention layer that owns it (Keras 3.15's `MultiHeadAttention` builds its
  `Softmax` under the layer's policy on its explicit path: attention dropout or returned
  scores); a half-precision constant the dtype cannot hold (a `-1e9` mask under
  `mixed_float16` is -inf, and `(1 - mask) * -inf` is NaN wherever the mask keeps a score) is
  named with the layer and the value; a float32 `Softmax` inside an attention layer is the
  rule kept (ampflow's `Float32SoftmaxAttention`), not a hand-set dtype.

Findings (`Finding.kind`; severity error / warning / info / fixed):
`half_precision_output`, `hard_coded_dtype`, `hand_set_dtype`, `float16_unsafe_op`,
`float16_attention_softmax`, `overflowing_constant` (an error where a Mul reads it: NaN is
certain), `float32_by_design`, `nested_input_cast`, `policy_not_applied`, `no_gradient`, and the
refusals `not_functional`, `input_shape`, `output_shape`, `no_trainable_variables`,
`half_precision_variables`, `trace_failed`. A report with `errors` means the model cannot train
under the policy; the caller raises ConfigError with them.

The counts are of the traced graph, before Grappler/XLA: XLA fuses a Cast into the kernels
around it, so what a Cast costs is memory traffic without XLA, and a broken chain's real price
is the float32 math it forces.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampflow.components.train.user_model import (
    children as _children,
)
from ampflow.components.train.user_model import (
    compute_dtype,
    output_layer,
    walk_layers,
)

AMP_REPORT_FILE = "amp_report.json"
HALF_DTYPES = ("float16", "bfloat16")
POLICY_DTYPES = {"float32": ("float32", "float32"), "mixed_float16": ("float16", "float32"),
                 "mixed_bfloat16": ("bfloat16", "float32")}
SEVERITIES = ("error", "warning", "fixed", "info")
# Ops whose float16 result overflows (exp: above 11.1; a sum of many terms: above 65504) or
# loses what the loss needs (softmax/log of small probabilities) when computed in float16.
UNSAFE_FLOAT16_OPS = ("Softmax", "LogSoftmax", "Log", "Log1p", "Exp", "Expm1")
REDUCTION_OPS = ("Sum", "Mean", "Prod", "EuclideanNorm")
# float16 has 11 significant bits: from 2**11 terms on, a running sum stops growing by terms of
# its own average size, and 2048 activations of about 32 overflow 65504.
LARGE_REDUCTION = 2048
# The largest finite value of each half type: a constant beyond it is ±inf in that type.
HALF_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}
# Ops that make attention scores from two computed tensors (a layer's weights on one side is a
# projection, not scores); and the ops between the scores and their softmax (scale, mask).
SCORE_OPS = ("Einsum", "BatchMatMulV2", "BatchMatMulV3", "BatchMatMul")
_SCORE_PATH_OPS = ("Identity", "Cast", "Mul", "AddV2", "Add", "Sub", "SelectV2", "Select",
                   "RealDiv", "Maximum", "Minimum", "Reshape", "Transpose")  # (a multi-axis
# softmax, as MultiHeadAttention's, is a transpose and reshape around the Softmax op)
_ATTENTION_BY_DESIGN = "the softmax of the attention scores in float32 (the AMP rule for attention)"
# Why a built-in layer casts to float32 inside itself (the classes Keras keeps in float32).
_BY_DESIGN = {
    "BatchNormalization": "mean/variance and the normalization in float32",
    "FusedBatchNormalization": "statistics in float32 (fused kernel)",
    "LayerNormalization": "mean/variance and the normalization in float32",
    "GroupNormalization": "statistics in float32",
    "RMSNormalization": "statistics in float32",
    "UnitNormalization": "norm in float32",
    "GlobalAveragePooling1D": "mean in float32 (keras.ops.mean upcasts half precision)",
    "GlobalAveragePooling2D": "mean in float32 (keras.ops.mean upcasts half precision)",
    "GlobalAveragePooling3D": "mean in float32 (keras.ops.mean upcasts half precision)",
    "MultiHeadAttention": "softmax of the attention scores in float32 (its fused "
                          "dot_product_attention path: no attention dropout)",
    "Float32SoftmaxAttention": _ATTENTION_BY_DESIGN,
}
_TABLE_ROWS = 20  # the log table stays short for any model; amp_report.json has every layer
_TABLE_WARNINGS = 8


@dataclass(frozen=True)
class Finding:
    """One thing the check found: what, how bad, in which layer, and the numbers behind it."""

    kind: str
    severity: str  # one of SEVERITIES
    message: str
    layer: str | None = None
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The finding as a JSON object."""
        return {"kind": self.kind, "severity": self.severity, "layer": self.layer,
                "message": self.message, **({"detail": self.detail} if self.detail else {})}


@dataclass(frozen=True)
class LayerRow:
    """One layer: its dtypes under the policy and the Cast ops it put in the train step."""

    name: str
    path: str  # nested layers: "outer/inner/name"
    class_name: str
    origin: str  # "keras", "ampflow" or "custom"
    compute_dtype: str
    variable_dtype: str
    head: bool = False
    casts: dict = field(default_factory=dict)  # category -> {"forward", "backward", "pairs"}

    @property
    def cast_count(self) -> int:
        """Forward + backward Casts of every category."""
        return sum(c["forward"] + c["backward"] for c in self.casts.values())

    def to_json(self) -> dict:
        """The row as a JSON object."""
        return {"name": self.name, "path": self.path, "class": self.class_name,
                "origin": self.origin, "compute_dtype": self.compute_dtype,
                "variable_dtype": self.variable_dtype, "head": self.head,
                "casts": self.casts}


@dataclass(frozen=True)
class AmpReport:
    """What `check_amp` found; `errors` non-empty means the model cannot train under `policy`."""

    policy: str
    keras_model_name: str  # the checked keras.Model's .name (not a served or built-in name)
    layers: tuple[LayerRow, ...]
    findings: tuple[Finding, ...]
    fixes: tuple[str, ...] = ()
    casts: dict = field(default_factory=dict)  # totals: forward, backward, by category
    output_dtype: str | None = None
    trace_seconds: float | None = None
    notes: tuple[str, ...] = ()
    model: Any = field(default=None, compare=False, repr=False)  # the model that was checked

    @property
    def errors(self) -> list[str]:
        """Why the model cannot train under the policy (empty: it can)."""
        return [f.message for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[str]:
        """What breaks the precision chain or risks float16 overflow, without refusing."""
        return [f.message for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        """Whether the model can train under the policy."""
        return not self.errors

    def kinds(self) -> set[str]:
        """The finding kinds present (for tests and gates)."""
        return {f.kind for f in self.findings}

    def to_json(self) -> dict:
        """`amp_report.json`: every layer, every finding, the cast totals, the fixes."""
        return {"policy": self.policy, "keras_model_name": self.keras_model_name, "ok": self.ok,
                "errors": self.errors, "warnings": self.warnings, "fixes": list(self.fixes),
                "notes": list(self.notes), "output_dtype": self.output_dtype,
                "casts": self.casts, "trace_seconds": self.trace_seconds,
                "dtype_counts": self.dtype_counts(),
                "findings": [f.to_json() for f in self.findings],
                "layers": [row.to_json() for row in self.layers]}

    def dtype_counts(self) -> dict[str, int]:
        """Layers per "compute/variable" dtype pair."""
        return dict(Counter(f"{r.compute_dtype}/{r.variable_dtype}" for r in self.layers))

    def table(self) -> str:
        """A short fixed-width table for the log: notable layers, grouped by-design, a summary."""
        rows: list[tuple[str, str, str, str, str]] = []
        by_layer: dict[str | None, list[Finding]] = {}
        for f in self.findings:
            by_layer.setdefault(f.layer, []).append(f)
        row_of = {r.name: r for r in self.layers}
        by_design: dict[str, list[LayerRow]] = {}
        for f in self.findings:
            if f.kind == "float32_by_design" and f.layer in row_of:
                by_design.setdefault(row_of[f.layer].class_name, []).append(row_of[f.layer])
        for name, found in by_layer.items():
            notable = [f for f in found if f.kind != "float32_by_design"]
            if not notable or name is None:
                continue
            row = row_of.get(name)
            label = _class_label(row) if row else notable[0].detail.get("class", "-")
            rows.append((name, label, row.compute_dtype if row else "-",
                         _fwd_bwd(row), "; ".join(dict.fromkeys(f.kind for f in notable))))
        heads = [] if self.policy == "float32" else [r.name for r in self.layers if r.head]
        for name in sorted(n for n in heads if n not in by_layer):
            row = row_of[name]
            rows.append((name, _class_label(row), row.compute_dtype, _fwd_bwd(row), "head"))
        for cls, members in sorted(by_design.items()):
            casts = sum(r.cast_count for r in members)
            rows.append((f"{cls} ×{len(members)}", cls, members[0].compute_dtype,
                         f"{casts} total", "float32_by_design"))
        lines = [self.summary()]
        if rows:
            shown = rows[:_TABLE_ROWS]
            widths = [min(max(len(r[i]) for r in shown + [_HEADER]), 28) for i in range(4)]
            fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
            lines.append(fmt.format(*_HEADER))
            lines += [fmt.format(*(_clip(c, w) for c, w in zip(r[:4], widths, strict=True)),
                                 r[4]) for r in shown]
            if len(rows) > len(shown):
                lines.append(f"... and {len(rows) - len(shown)} more rows in {AMP_REPORT_FILE}")
        lines += [f"error: {m}" for m in self.errors]
        lines += [f"warning: {m}" for m in self.warnings[:_TABLE_WARNINGS]]
        if len(self.warnings) > _TABLE_WARNINGS:
            lines.append(f"... and {len(self.warnings) - _TABLE_WARNINGS} more warnings in "
                         f"{AMP_REPORT_FILE}")
        lines += [f"fixed: {m}" for m in self.fixes]
        lines += [f"note: {m}" for m in self.notes]
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: the verdict, the layers per dtype, the casts."""
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(self.dtype_counts().items()))
        c = self.casts or {}
        casts = (f"{c.get('forward', 0) + c.get('backward', 0)} casts in the train step "
                 f"({c.get('forward', 0)} forward, {c.get('backward', 0)} backward; "
                 f"{c.get('by_category', {}).get('variable', 0)} variable autocasts)"
                 if c else "no trace")
        verdict = "REFUSED" if self.errors else "ok"
        return (f"AMP check {verdict}: model {self.keras_model_name!r} under {self.policy}: "
                f"{len(self.layers)} layers (compute/variable: {counts}); {casts}; "
                f"{len(self.errors)} error(s), {len(self.warnings)} warning(s)")


# (the casts column leaves out variable autocasts, which every layer with weights has)
_HEADER = ("layer", "class", "compute", "casts fwd/bwd", "finding")


def write_amp_report(report: AmpReport, directory: str | Path) -> Path:
    """Write `amp_report.json` into `directory` (atomically); return its path."""
    from ampflow.files import write_json_atomic

    return write_json_atomic(Path(directory) / AMP_REPORT_FILE, report.to_json())


def check_amp(model, policy: str, *, input_shape, num_classes: int, batch_size: int = 2,
              fix_output: bool = False, large_reduction: int = LARGE_REDUCTION) -> AmpReport:
    """Check `model` (built under `policy`, uncompiled) against the rules of AMP.

    One train step is traced on a `[batch_size, *input_shape]` batch; nothing runs. With
    `fix_output`, a half-precision output is first fixed by `ensure_float32_output` (the fix is
    in `fixes`, and the fixed model, in `report.model`, is what gets traced).
    """
    import keras

    if policy not in POLICY_DTYPES:
        from ampflow.errors import ConfigError

        raise ConfigError(f"policy must be one of {tuple(POLICY_DTYPES)}. Received: "
                          f"policy={policy!r}")
    findings: list[Finding] = []
    notes: list[str] = []
    name = getattr(model, "name", type(model).__name__)
    if not isinstance(model, keras.Model) or not getattr(model, "inputs", None) \
            or not getattr(model, "outputs", None):
        findings.append(Finding("not_functional", "error",
                                "the model must be a functional or Sequential keras.Model with "
                                f"known inputs and outputs. Received: {type(model).__name__}"))
        return AmpReport(policy, name, (), tuple(findings), model=model)
    findings += _io_findings(model, tuple(int(d) for d in input_shape), int(num_classes))
    out_layer = output_layer(model)
    finding, model, fixes = _output_check(model, out_layer, fix_output and not any(
        f.severity == "error" for f in findings))
    findings += [finding] if finding else []
    layers = walk_layers(model)
    compute, variable = POLICY_DTYPES[policy]
    applied = _policy_applied(layers, compute, out_layer)
    head = _head_layers(model, compute) if applied else {id(output_layer(model))}
    if not applied:
        seen = sorted({compute_dtype(layer) for layer, _ in layers if not _is_model(layer)})
        findings.append(Finding(
            "policy_not_applied", "warning",
            f"no layer computes in {compute}: the model was built (or loaded) under another "
            f"policy than {policy}, so it would train in {'/'.join(seen)}; rebuild it under "
            f"{policy} (user_model.rebuild_with_policy)", None, {"compute_dtypes": seen}))
    findings += _variable_findings(model, layers, variable)
    trace = None
    if not any(f.severity == "error" for f in findings):
        trace = _trace(model, tuple(int(d) for d in input_shape), batch_size, policy)
        if trace.error:
            findings.append(Finding("trace_failed", "error",
                                    f"the train step does not trace under {policy}: "
                                    f"{trace.error}"))
    rows, totals = _rows(layers, head, trace, model)
    if applied:
        findings += _hand_set_findings(layers, rows, head, compute)
    if trace is not None and not trace.error:
        findings += _cast_findings(rows, compute, policy, trace.float32_attention)
        findings += _unsafe_findings(trace, head, policy, large_reduction, notes,
                                     _parents(layers))
        findings += _constant_findings(trace)
        findings += _gradient_findings(trace)
        if trace.loss_casts:
            findings.append(Finding(
                "float32_by_design", "info",
                f"the loss upcasts its {trace.output_dtype} input to float32 "
                f"({trace.loss_casts} casts)", None, {"where": "loss"}))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    return AmpReport(policy, model.name, tuple(rows), tuple(findings), fixes, totals,
                     trace.output_dtype if trace else None,
                     round(trace.seconds, 3) if trace else None, tuple(notes), model=model)


def _output_check(model, out_layer, fix: bool) -> tuple[Finding | None, Any, tuple[str, ...]]:
    """The half_precision_output finding (or None), and the model fixed if `fix`."""
    out_dtype = _output_dtype(model)
    if out_layer is None or out_dtype not in HALF_DTYPES:
        return None, model, ()
    detail = {"class": type(out_layer).__name__}
    message = (f"output layer {out_layer.name!r} ({type(out_layer).__name__}) computes in "
               f"{out_dtype}: the probabilities/logits the loss reads must be float32")
    if not fix:
        return (Finding("half_precision_output", "warning",
                        message + " (fix: ensure_float32_output)", out_layer.name, detail),
                model, ())
    model, done = ensure_float32_output(model)
    return (Finding("half_precision_output", "fixed", message, out_layer.name,
                    {**detail, "fix": done}), model, tuple(done))


def _policy_applied(layers, compute: str, out_layer) -> bool:
    """Whether any layer but the output computes in the policy's dtype (float32: always)."""
    return compute == "float32" or any(
        compute_dtype(layer) == compute for layer, _ in layers
        if not _is_model(layer) and layer is not out_layer)


def amp_check_of(model, info: dict, *, model_path: str | None = None,
                 image_size: int | None = None, sequence_length: int | None = None,
                 vocabulary_size: int | None = None):
    """The AMP report of `model` built under the current global policy on `info`'s shapes.

    `model` is `--model`'s text or its parsed user_model.ModelSpec (a config's `model_spec`).

    The model is checked as the user wrote it (so a half-precision output is named), with the
    float32 head that ampflow gives every model as its fix; the trace is of that fixed model,
    the one that trains. Text data (`info["modality"] == "text"`, components/prepare_data/
    text.py) builds a text model on token ids `[batch, sequence_length]` (the tokenizer's
    defaults where not given: the check needs shapes, not a fitted vocabulary).
    """
    from ampflow.components.train.models import make_model

    if info.get("modality") == "text":
        from ampflow.components.train.tokenizer import TokenizerConfig

        tokens = TokenizerConfig(**{k: v for k, v in (
            ("max_sequence_length", sequence_length), ("vocabulary_size", vocabulary_size))
            if v is not None})
        return text_amp_check_of(model, tokens.max_sequence_length, tokens.vocabulary_size,
                                 int(info["num_classes"]), model_path=model_path)
    built = make_model(model, tuple(info["image_shape"]), info["num_classes"],
                       image_size=image_size, model_path=model_path)
    return _checked(built, tuple(info["image_shape"]), int(info["num_classes"]))


def text_amp_check_of(model, sequence_length: int, vocabulary_size: int,
                      num_classes: int, *, model_path: str | None = None):
    """`amp_check_of` for a text model: int32 token ids `[batch, sequence_length]` in."""
    from ampflow.components.train.models import make_text_model

    built = make_text_model(model, sequence_length, vocabulary_size, num_classes,
                            model_path=model_path)
    return _checked(built, (int(sequence_length),), int(num_classes))


def _checked(built, input_shape: tuple[int, ...], num_classes: int):
    """The report of a `models.BuiltModel`: its original checked, its fixes added."""
    import dataclasses

    import keras

    report = check_amp(built.original, keras.mixed_precision.global_policy().name,
                       input_shape=input_shape, num_classes=num_classes, fix_output=True)
    extra = tuple(fix for fix in built.fixes if fix not in report.fixes)
    # report.model: the model as it trains (with ampflow's head), for the per-layer dtypes
    return dataclasses.replace(report, fixes=report.fixes + extra, model=built.model)


def ensure_float32_output(model) -> tuple[Any, list[str]]:
    """`model` with a float32 output, and what was changed (nothing if it already was float32).

    The fix is ampflow's one head rule, `user_model.standard_head`: a half-precision softmax
    (a Softmax/Activation layer, or a Dense with softmax activation) is recomputed in float32
    from the tensor before it — it has already lost what a cast after it cannot bring back —
    and any other output is taken as logits; then the float32 `logits`/`probabilities` head.
    """
    from ampflow.components.train.user_model import standard_head

    out_layer = output_layer(model)
    if out_layer is None or compute_dtype(out_layer) not in HALF_DTYPES:
        return model, []
    return standard_head(model)


# ---- structure -------------------------------------------------------------------------------


def _io_findings(model, input_shape: tuple[int, ...], num_classes: int) -> list[Finding]:
    found = []
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        return [Finding("not_functional", "error",
                        "the model must have one input and one output. Received: "
                        f"{len(model.inputs)} input(s), {len(model.outputs)} output(s)")]
    got_in, want_in = tuple(model.inputs[0].shape), (None, *input_shape)
    what = "token ids" if len(input_shape) == 1 else "images"
    if got_in != want_in:
        found.append(Finding("input_shape", "error",
                             f"the model must take the data's {what} {list(want_in)}. "
                             f"Received: a model whose input is {list(got_in)}"))
    got_out = tuple(model.outputs[0].shape)
    if len(got_out) != 2 or got_out[-1] != num_classes:
        found.append(Finding("output_shape", "error",
                             f"the model must return [batch, {num_classes}] (one logit or "
                             f"probability per class). Received: output shape {list(got_out)}"))
    if not model.trainable_variables:
        found.append(Finding("no_trainable_variables", "error",
                             "the model has no trainable variables: there is nothing to train"))
    return found


def _is_model(layer) -> bool:
    import keras

    return isinstance(layer, keras.Model)


def _origin(layer) -> str:
    """Whose code the layer's `call` is: "keras", "ampflow" or "custom".

    A user's subclass of a Keras layer that keeps Keras's `call` counts as Keras: its math is.
    """
    owner = next((cls for cls in type(layer).__mro__ if "call" in vars(cls)), type(layer))
    top = owner.__module__.split(".")[0]
    if top in ("keras", "tf_keras", "tensorflow"):
        return "keras"
    return "ampflow" if top == "ampflow" else "custom"


def _output_dtype(model) -> str:
    import keras

    return keras.backend.standardize_dtype(model.outputs[0].dtype)


def _top_output_op(model):
    history = getattr(model.outputs[0], "_keras_history", None)
    return history[0] if history is not None else None


def _inbound_layers(layer) -> list:
    nodes = getattr(layer, "_inbound_nodes", [])
    if len(nodes) != 1:
        return []
    return [t._keras_history[0] for t in nodes[0].input_tensors
            if getattr(t, "_keras_history", None) is not None]


def _head_layers(model, compute: str) -> set[int]:
    """The output layer and the float32 chain right before it (e.g. logits → probabilities)."""
    import keras

    out = output_layer(model)
    if out is None:
        return set()
    head, layer = {id(out)}, out
    if (not isinstance(out, keras.layers.Layer) or compute_dtype(out) != "float32"
            or compute == "float32"):
        return head
    while True:
        inbound = _inbound_layers(layer)
        if len(inbound) != 1:
            return head
        layer = inbound[0]
        if (type(layer).__name__ == "InputLayer" or _is_model(layer)
                or compute_dtype(layer) != "float32" or id(layer) in head):
            return head
        head.add(id(layer))


def _own_weights(layer) -> list:
    child = {id(w) for c in _children(layer) for w in c.weights}
    return [w for w in layer.weights if id(w) not in child]


def _variable_findings(model, layers, variable_dtype: str) -> list[Finding]:
    found = []
    for layer, _path in layers:
        if _is_model(layer):
            continue
        half = [w for w in _own_weights(layer) if str(w.dtype) in HALF_DTYPES]
        other = [w for w in _own_weights(layer)
                 if str(w.dtype) not in HALF_DTYPES and str(w.dtype) != variable_dtype
                 and str(w.dtype).startswith("float")]
        trainable = [w for w in half if w.trainable]
        if trainable:
            found.append(Finding(
                "half_precision_variables", "error",
                f"layer {layer.name!r} ({type(layer).__name__}) holds trainable variables in "
                f"half precision ({', '.join(f'{w.name}: {w.dtype}' for w in trainable)}): "
                "an update smaller than 1/2048 of a weight vanishes in float16 (11 significant "
                "bits, 8 in bfloat16), so those weights stop learning; create them as "
                f"{variable_dtype} (the policy's variable dtype, kept for this reason)",
                layer.name, {"variables": [w.name for w in trainable]}))
        elif half:
            found.append(Finding(
                "half_precision_variables", "warning",
                f"layer {layer.name!r} keeps non-trainable state in half precision "
                f"({', '.join(f'{w.name}: {w.dtype}' for w in half)}): moving averages lose "
                "their small updates there", layer.name))
        if other:
            found.append(Finding(
                "hard_coded_dtype", "warning",
                f"layer {layer.name!r} ({type(layer).__name__}) creates variables with a "
                f"hard-coded dtype ({', '.join(f'{w.name}: {w.dtype}' for w in other)}), not the "
                f"policy's {variable_dtype}", layer.name,
                {"variables": {w.name: str(w.dtype) for w in other}}))
    return found


def _hand_set_findings(layers, rows: list[LayerRow], head: set[int],
                       compute: str) -> list[Finding]:
    """Layers computing in another dtype than the policy's, outside the head (with the casts)."""
    odd = [(layer, path) for layer, path in layers
           if not _is_model(layer) and id(layer) not in head and compute_dtype(layer) != compute]
    casts = {row.path: row.casts.get("input") for row in rows}
    parents = _parents(layers)
    odd_ids = {id(layer) for layer, _ in odd}
    found = []
    for layer, path in odd:
        if _is_attention_softmax_layer(layer, parents):
            found.append(Finding("float32_by_design", "info",
                                 f"Softmax {path!r}: {_ATTENTION_BY_DESIGN}", layer.name,
                                 {"path": path}))
            continue
        parent = parents.get(id(layer))
        if id(parent) in odd_ids and compute_dtype(parent) == compute_dtype(layer):
            continue  # a sublayer given its parent's dtype: named (and counted) with it
        # the layer's own input casts and its sublayers' (a custom layer's first sublayer
        # reads the cast of the layer's input)
        n = sum(entry["forward"] + entry["backward"] for where, entry in casts.items()
                if entry and (where == path or where.startswith(f"{path}/")))
        found.append(Finding(
            "hand_set_dtype", "warning",
            f"layer {layer.name!r} ({type(layer).__name__}) computes in "
            f"{compute_dtype(layer)} while "
            f"the policy computes in {compute}: its dtype is set by hand, which breaks the "
            f"chain with a Cast at its input and after it ({n} input casts in the train step)",
            layer.name, {"compute_dtype": compute_dtype(layer), "path": path, "input_casts": n}))
    return found


def _is_attention_softmax_layer(layer, parents: dict[int, Any]) -> bool:
    """A float32 Softmax layer inside a MultiHeadAttention: the attention rule, kept."""
    return (type(layer).__name__ == "Softmax" and compute_dtype(layer) == "float32"
            and _is_multi_head_attention(parents.get(id(layer))))


# ---- the trace -------------------------------------------------------------------------------


@dataclass
class _Cast:
    name: str
    src: str
    dst: str
    backward: bool
    category: str  # variable, constant, input, boundary, internal
    owner: Any  # the layer (or model) it is attributed to


@dataclass
class _Trace:
    error: str | None = None
    seconds: float = 0.0
    casts: list[_Cast] = field(default_factory=list)
    ops: list[tuple[str, str, str, Any, int]] = field(default_factory=list)  # type,name,dtype,..
    output_dtype: str | None = None
    loss_casts: int = 0
    no_gradient: list[str] = field(default_factory=list)
    variables: int = 0
    # (op name, owner, value as written, dtype, NaN certain: the inf meets a Mul)
    constants: list[tuple[str, Any, float, str, bool]] = field(default_factory=list)
    attention_softmax: set[str] = field(default_factory=set)  # Softmax ops over scores
    float32_attention: set[str] = field(default_factory=set)  # layers softmaxing them in f32


@contextlib.contextmanager
def _recording_scopes(layers) -> Iterator[dict[str, Any]]:
    """While active, each layer's `call` records the TF name scope it runs in."""
    import tensorflow as tf

    scopes: dict[str, Any] = {}
    patched = []
    for layer in layers:
        original = layer.__dict__.get("call")
        call = layer.call

        def recorder(*args, _call=call, _layer=layer, **kwargs):
            scopes.setdefault(tf.get_current_name_scope(), _layer)
            return _call(*args, **kwargs)

        object.__setattr__(layer, "call", recorder)  # (not through Keras's attribute tracker)
        patched.append((layer, original))
    try:
        yield scopes
    finally:
        for layer, original in patched:
            if original is None:
                object.__delattr__(layer, "call")
            else:
                object.__setattr__(layer, "call", original)


def _trace(model, input_shape: tuple[int, ...], batch_size: int, policy: str) -> _Trace:
    """Trace one train step as components/train/loop.py runs it (loss scaled under float16)."""
    import keras
    import tensorflow as tf

    result = _Trace()
    scale = 2.0 ** 15 if policy == "mixed_float16" else None  # LossScaleOptimizer's start
    variables = model.trainable_variables
    outputs: dict[str, Any] = {}

    def step(images, labels):
        with tf.GradientTape() as tape:
            probabilities = model(images, training=True)
            outputs["dtype"] = keras.backend.standardize_dtype(probabilities.dtype)
            with tf.name_scope("amp_check_loss"):
                per_example = keras.losses.sparse_categorical_crossentropy(labels, probabilities)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch_size)
                if model.losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
                scaled = loss * scale if scale else loss
        return tape.gradient(scaled, variables)

    start = time.perf_counter()
    layers = [model] + [layer for layer, _ in walk_layers(model)]
    try:
        with _recording_scopes(layers) as scopes:
            concrete = tf.function(step, autograph=False).get_concrete_function(
                tf.TensorSpec([batch_size, *input_shape], model.inputs[0].dtype),
                tf.TensorSpec([batch_size], tf.int64))
    except Exception as e:  # anything a user's layer raises while tracing
        result.error = _error_line(e)
        result.seconds = time.perf_counter() - start
        return result
    result.output_dtype = outputs.get("dtype")
    result.variables = len(variables)
    grads = concrete.structured_outputs
    result.no_gradient = [v.path for v, g in zip(variables, grads, strict=True) if g is None]
    _read_graph(concrete.graph, scopes, result)
    result.seconds = time.perf_counter() - start
    return result


def _owner(name: str, scopes: dict[str, Any]):
    parts = name.split("/")
    for end in range(len(parts), 0, -1):
        owner = scopes.get("/".join(parts[:end]))
        if owner is not None:
            return owner
    return None


def _source_kind(op) -> str:
    """What a forward Cast reads: a variable, a constant, or a computed tensor."""
    for _ in range(8):
        if op.type in ("ReadVariableOp", "VarHandleOp", "ResourceGather"):
            return "variable"
        if op.type == "Const":
            return "constant"
        if op.type != "Identity" or not op.inputs:
            return "computed"
        op = op.inputs[0].op
    return "computed"


def _read_graph(graph, scopes: dict[str, Any], result: _Trace) -> None:
    import tensorflow as tf

    grad = "gradient_tape/"
    forward: dict[str, _Cast] = {}
    backward = []
    for op in graph.get_operations():
        is_backward = op.name.startswith(grad)
        name = op.name[len(grad):] if is_backward else op.name
        if op.type == "Cast":
            src, dst = op.get_attr("SrcT"), op.get_attr("DstT")
            if not (src.is_floating and dst.is_floating):
                continue
            if is_backward:
                backward.append((name, src.name, dst.name))
                continue
            if name.startswith("amp_check_loss/"):
                result.loss_casts += 1
                continue
            owner = _owner(name, scopes)
            category = _source_kind(op.inputs[0].op)
            if category == "computed":
                category = "internal"
                if owner is not None and _is_model(owner) and scopes.get(
                        name.rsplit("/", 1)[0]) is owner:
                    owner, category = _boundary_owner(op, scopes, owner)
            cast = _Cast(name, src.name, dst.name, False, category, owner)
            if category == "constant" and dst.name in HALF_MAX:
                _record_overflow(op, name, _constant_value(op.inputs[0].op), dst.name, owner,
                                 result)
            forward[name] = cast
            result.casts.append(cast)
        elif not is_backward and op.type == "Const" and op.outputs[0].dtype.name in HALF_MAX:
            _record_overflow(op, name, _constant_value(op), op.outputs[0].dtype.name,
                             _owner(name, scopes), result)
        elif not is_backward and op.outputs and op.type in UNSAFE_FLOAT16_OPS + REDUCTION_OPS:
            dtype = op.outputs[0].dtype
            if op.type == "Softmax" and _over_scores(op):
                result.attention_softmax.add(name)
                if dtype == tf.float32 and _owner(name, scopes) is not None:
                    result.float32_attention.add(_owner(name, scopes).name)
            if dtype in (tf.float16, tf.bfloat16):
                result.ops.append((op.type, name, dtype.name, _owner(name, scopes),
                                   _reduced_elements(op)))
    for name, src, dst in backward:
        parts = name.split("/")
        match = None
        for end in range(len(parts) - 1, 0, -1):
            match = forward.get("/".join(parts[:end]))
            if match is not None:
                break
        if name.startswith("amp_check_loss/"):
            result.loss_casts += 1
        elif match is not None:
            result.casts.append(_Cast(name, src, dst, True, match.category, match.owner))
        else:
            result.casts.append(_Cast(name, src, dst, True, "internal", _owner(name, scopes)))


def _constant_value(op) -> float | None:
    """The value of a small constant (through Identity ops) with the largest magnitude."""
    import numpy as np
    import tensorflow as tf

    for _ in range(8):
        if op.type == "Const":
            size = op.outputs[0].shape.num_elements()
            if size is None or not 0 < size <= 64 or not op.outputs[0].dtype.is_floating:
                return None  # a mask constant is a scalar; a table of weights is not one
            value = tf.make_ndarray(op.get_attr("value"))
            flat = value.astype(np.float64).reshape(-1)
            return float(flat[np.argmax(np.abs(np.nan_to_num(flat, nan=0.0, posinf=np.inf,
                                                              neginf=np.inf)))])
        if op.type != "Identity" or not op.inputs:
            return None
        op = op.inputs[0].op
    return None


def _record_overflow(op, name: str, value: float | None, dtype: str, owner,
                     result: _Trace) -> None:
    """Note a constant that `dtype` cannot hold (±inf there), and whether a Mul reads it."""
    import math

    if value is None or not (math.isinf(value) or abs(value) > HALF_MAX[dtype]):
        return
    multiplied = any(c.type in ("Mul", "MulNoNan") for c in op.outputs[0].consumers())
    result.constants.append((name, owner, value, dtype, multiplied))


def _over_scores(softmax) -> bool:
    """Whether a Softmax reads attention scores: a product of two computed tensors."""
    frontier, seen = [softmax.inputs[0].op], set()
    for _ in range(12):
        following = []
        for op in frontier:
            if op.name in seen:
                continue
            seen.add(op.name)
            if op.type in SCORE_OPS:
                return all(_source_kind(t.op) == "computed" for t in op.inputs[:2])
            if op.type in _SCORE_PATH_OPS:
                following += [t.op for t in op.inputs]
        frontier = following
        if not frontier:
            return False
    return False


def _boundary_owner(op, scopes, model):
    """A Cast in a model's own scope: the input cast of the layer that reads it, if any.

    A Cast read by another Cast of the same scope is a nested model's float32 Input round trip
    (compute dtype → float32 → compute dtype): that pair stays with the model.
    """
    source = op.inputs[0].op
    if source.type == "Cast" and _owner(source.name, scopes) is model:
        return model, "boundary"
    for consumer in op.outputs[0].consumers():
        owner = _owner(consumer.name, scopes)
        if owner is not None and owner is not model and not _is_model(owner):
            return owner, "input"
    return model, "boundary"


def _reduced_elements(op) -> int:
    """Elements summed into each output of a reduction (the batch axis left out), else 0."""
    import numpy as np
    import tensorflow as tf

    if op.type not in REDUCTION_OPS or len(op.inputs) < 2:
        return 0
    shape = op.inputs[0].shape
    axes = tf.get_static_value(op.inputs[1])
    if axes is None or shape.rank is None:
        return 0
    count = 1
    for axis in {int(a) % shape.rank for a in np.reshape(axes, -1)}:
        if axis != 0 and shape[axis] is not None:
            count *= int(shape[axis])
    return count


# ---- rows and findings -----------------------------------------------------------------------


def _rows(layers, head: set[int], trace: _Trace | None, model) -> tuple[list[LayerRow], dict]:
    per_layer: dict[int, dict[str, dict]] = {}
    totals = {"forward": 0, "backward": 0, "by_category": Counter()}
    for cast in (trace.casts if trace else []):
        key = id(cast.owner) if cast.owner is not None else 0
        entry = per_layer.setdefault(key, {}).setdefault(
            cast.category, {"forward": 0, "backward": 0, "pairs": Counter()})
        entry["backward" if cast.backward else "forward"] += 1
        entry["pairs"][f"{cast.src}→{cast.dst}"] += 1
        totals["backward" if cast.backward else "forward"] += 1
        totals["by_category"][cast.category] += 1
    rows = [LayerRow(layer.name, path, type(layer).__name__, _origin(layer), compute_dtype(layer),
                     layer.dtype_policy.variable_dtype, id(layer) in head,
                     _plain(per_layer.get(id(layer), {})))
            for layer, path in layers]
    if trace is None:
        return rows, {}
    top = per_layer.get(id(model), {})
    totals["model_boundary"] = _plain(top)
    totals["by_category"] = dict(totals["by_category"])
    totals["loss"] = trace.loss_casts
    return rows, totals


def _plain(casts: dict[str, dict]) -> dict:
    return {k: {**v, "pairs": dict(v["pairs"])} for k, v in casts.items()}


def _cast_findings(rows: list[LayerRow], compute: str, policy: str,
                   float32_attention: set[str] = frozenset()) -> list[Finding]:
    found = []
    for row in rows:
        internal = row.casts.get("internal")
        boundary = row.casts.get("boundary")
        if internal and row.origin == "custom" and row.name in float32_attention:
            n = internal["forward"] + internal["backward"]
            found.append(Finding(  # the rule kept by hand, as the attention warning advises
                "float32_by_design", "info",
                f"custom layer {row.name!r} ({row.class_name}) casts its attention scores to "
                f"float32 for the softmax: {_ATTENTION_BY_DESIGN} ({n} casts: "
                f"{_pairs(internal['pairs'])})", row.name,
                {"casts": n, "pairs": internal["pairs"]}))
        elif internal and row.origin == "custom":
            n = internal["forward"] + internal["backward"]
            found.append(Finding(
                "hard_coded_dtype", "warning",
                f"custom layer {row.name!r} ({row.class_name}) casts inside its call: {n} Cast "
                f"op(s) in the train step ({internal['forward']} forward, "
                f"{internal['backward']} backward: {_pairs(internal['pairs'])}); its math is "
                f"hard-coded to a dtype, so the {policy} chain breaks there (use "
                "self.compute_dtype, or give the layer dtype='float32' on purpose)",
                row.name, {"casts": n, "forward": internal["forward"],
                           "backward": internal["backward"], "pairs": internal["pairs"]}))
        elif internal and any(s in HALF_DTYPES and d == "float32"
                              for s, d in _pair_tuples(internal["pairs"])):
            found.append(Finding(
                "float32_by_design", "info",
                f"{row.class_name} {row.name!r} computes in float32 inside: "
                f"{_BY_DESIGN.get(row.class_name, 'Keras upcasts it on purpose')}",
                row.name, {"casts": internal["forward"] + internal["backward"]}))
        if boundary and row.class_name != "Sequential" and any(
                s in HALF_DTYPES and d == "float32" for s, d in _pair_tuples(boundary["pairs"])):
            found.append(Finding(
                "nested_input_cast", "info",
                f"nested model {row.name!r} declares a float32 Input: its {compute} input is "
                f"cast to float32 and back ({boundary['forward'] + boundary['backward']} casts);"
                " harmless (XLA folds them), set its Input dtype to avoid them", row.name))
    return found


def _pair_tuples(pairs: dict) -> list[tuple[str, str]]:
    return [tuple(p.split("→")) for p in pairs]


def _pairs(pairs: dict) -> str:
    return ", ".join(f"{p} ×{n}" for p, n in sorted(pairs.items()))


def _unsafe_findings(trace: _Trace, head: set[int], policy: str, large_reduction: int,
                     notes: list[str], parents: dict[int, Any]) -> list[Finding]:
    found: dict[tuple[str, str], Finding] = {}
    halves = []
    for op_type, name, dtype, owner, reduced in trace.ops:
        if owner is None or id(owner) in head:
            continue
        if op_type in REDUCTION_OPS and reduced < large_reduction:
            continue
        halves.append((op_type, owner.name))
        if dtype != "float16" or policy != "mixed_float16":
            continue
        key = (owner.name, op_type)
        if key in found:
            continue
        if op_type == "Softmax" and name in trace.attention_softmax:
            found[key] = _attention_softmax_finding(_attention_layer(owner, parents), name)
            continue
        what = (f"{op_type} over {reduced} elements" if op_type in REDUCTION_OPS else op_type)
        where = (f"a keras.ops call in model {owner.name!r}'s own graph" if _is_model(owner)
                 else f"layer {owner.name!r} ({type(owner).__name__})")
        found[key] = Finding(
            "float16_unsafe_op", "warning",
            f"{where} computes {what} in float16 outside the float32 head: float16 overflows "
            "above 65504 (exp above 11.1) and loses small probabilities; give the layer "
            "dtype='float32' or compute it in float32",
            owner.name, {"op": op_type, "tf_op": name, "reduced_elements": reduced,
                         "class": "(keras.ops)" if _is_model(owner) else type(owner).__name__})
    if halves and policy == "mixed_bfloat16":
        where = sorted({f"{t} in {n!r}" for t, n in halves})
        notes.append(f"{', '.join(where[:6])}{' …' if len(where) > 6 else ''} compute in "
                     "bfloat16 outside the head: fine, bfloat16 has float32's exponent range "
                     "(these would be float16_unsafe_op under mixed_float16)")
    return list(found.values())


def _parents(layers) -> dict[int, Any]:
    """id(layer) → the layer it is a sublayer of (top-level layers have none)."""
    by_path = {path: layer for layer, path in layers}
    return {id(layer): by_path[path.rsplit("/", 1)[0]] for layer, path in layers
            if "/" in path and path.rsplit("/", 1)[0] in by_path}


def _attention_layer(owner, parents: dict[int, Any]):
    """The layer to name for a softmax: a Keras Softmax/Activation's enclosing layer, if any."""
    parent = parents.get(id(owner))
    if type(owner).__name__ in ("Softmax", "Activation") and parent is not None \
            and not _is_model(parent):
        return parent
    return owner


def _attention_softmax_finding(layer, op_name: str) -> Finding:
    keras_mha = _is_multi_head_attention(layer)
    why = ("Keras's MultiHeadAttention builds its Softmax under the layer's policy: its "
           "explicit path (attention dropout > 0, or scores returned) runs the softmax in "
           "float16; with dropout=0 it takes the fused dot_product_attention path (softmax in "
           "float32), or use ampflow's Float32SoftmaxAttention (components/train/"
           "text_layers.py)" if keras_mha else
           "cast the scores to float32 before the softmax (and mask them there), then the "
           "probabilities back to self.compute_dtype")
    return Finding(
        "float16_attention_softmax", "warning",
        f"layer {layer.name!r} ({type(layer).__name__}) computes the softmax of its attention "
        "scores in float16: the scores round to 11 significant bits before exp (a score near "
        "100 moves by up to 0.03, 3 % of its probability), probabilities below 6e-8 flush to "
        f"0, and a score beyond 65504 is inf, NaN after the softmax; {why}",
        layer.name, {"op": "Softmax", "tf_op": op_name, "class": type(layer).__name__})


def _constant_findings(trace: _Trace) -> list[Finding]:
    """A half-precision constant beyond its dtype's range (a mask's -1e9 in float16 is -inf)."""
    import math

    found: dict[str, Finding] = {}
    for op_name, owner, value, dtype, multiplied in trace.constants:
        where = owner.name if owner is not None else None
        if where in found:
            continue
        what = (f"layer {owner.name!r} ({type(owner).__name__})" if owner is not None
                and not _is_model(owner) else "the model's own graph")
        largest = f"{dtype}'s largest value is {HALF_MAX[dtype]:g}"
        if math.isinf(value):  # the graph holds the overflowed value only
            what_happened = (f"holds the constant {value:g} in {dtype} ({largest}: a mask value "
                             "such as -1e9 becomes -inf when the graph is built)")
        else:
            what_happened = (f"casts the constant {value:g} to {dtype} ({largest}: it is "
                             f"{'-' if value < 0 else ''}inf there)")
        consequence = ("it is multiplied (as in scores + (1 - mask) * -1e9), and 0 × inf is NaN "
                       "wherever the mask keeps a score: every output and loss is NaN"
                       if multiplied else
                       "a row whose every score is masked gets a NaN softmax")
        found[where] = Finding(
            "overflowing_constant", "error" if multiplied else "warning",
            f"{what} {what_happened}; {consequence}; use a value {dtype} holds (e.g. -3e4 for "
            "float16, as Keras's Softmax does), or mask in float32", where,
            {"value": value if math.isfinite(value) else str(value), "dtype": dtype,
             "tf_op": op_name, "multiplied": multiplied})
    return list(found.values())


def _is_multi_head_attention(layer) -> bool:
    import keras

    return isinstance(layer, keras.layers.MultiHeadAttention)


def _gradient_findings(trace: _Trace) -> list[Finding]:
    if not trace.no_gradient:
        return []
    names = ", ".join(trace.no_gradient[:5]) + (" …" if len(trace.no_gradient) > 5 else "")
    everything = len(trace.no_gradient) == trace.variables
    what = ("no trainable variable gets a gradient from the loss" if everything else
            f"{len(trace.no_gradient)} of the {trace.variables} trainable variables get no "
            "gradient from the loss")
    return [Finding("no_gradient", "error" if everything else "warning",
                    f"{what} ({names}): a cast to an integer type or a stop_gradient cuts them "
                    "off", None, {"variables": trace.no_gradient})]


# ---- small helpers ---------------------------------------------------------------------------


def _class_label(row: LayerRow | None) -> str:
    if row is None:
        return "(replaced)"
    return f"{row.class_name}*" if row.origin == "custom" else row.class_name


def _fwd_bwd(row: LayerRow | None) -> str:
    if row is None:
        return "-"
    fwd = sum(c["forward"] for k, c in row.casts.items() if k != "variable")
    bwd = sum(c["backward"] for k, c in row.casts.items() if k != "variable")
    return f"{fwd}/{bwd}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _error_line(error: BaseException) -> str:
    """One line from a tracing error: its first message line, and the layer Keras names."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # Keras bolds its messages for terminals
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    where = next((line for line in lines if line.startswith("Exception encountered when")), "")
    message = next((line for line in lines if not line.startswith("Exception encountered when")
                    and not line.startswith(("Arguments received", "•"))), "")
    text = f"{type(error).__name__}: {message}"
    return f"{text} ({where.rstrip('.')})" if where else text
