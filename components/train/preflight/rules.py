"""The AMP check: does a model keep the precision chain under a policy, before any epoch runs.

`check_amp` reads each layer's dtype policy, then traces one train step (nothing executed) and
reads its graph: floating-point Casts attributed to the layer that made them, float16-unsafe
ops, attention softmaxes in float16, constants the half type cannot hold. A report with
`errors` means the model cannot train under the policy. By role: amp_graph.py traces and walks
the graph, amp_report.py holds the report, this module the rules. The rules and each finding's
kind: docs/explanation/design-notes.md, "amp_check.py".
"""

from __future__ import annotations

from typing import Any

from ampflow.components.train.preflight.graph import (
    HALF_MAX,
    REDUCTION_OPS,
    Trace,
    is_model,
    trace_step,
)
from ampflow.components.train.preflight.report import (  # noqa: F401  (AMP_REPORT_FILE, write_amp_report: re-exported)
    AMP_REPORT_FILE,
    SEVERITIES,
    AmpReport,
    Finding,
    LayerRow,
    layer_rows,
    write_amp_report,
)
from ampflow.modeling.user_model import (
    children as _children,
)
from ampflow.modeling.user_model import (
    compute_dtype,
    output_layer,
    walk_layers,
)

HALF_DTYPES = ("float16", "bfloat16")
POLICY_DTYPES = {"float32": ("float32", "float32"), "mixed_float16": ("float16", "float32"),
                 "mixed_bfloat16": ("bfloat16", "float32")}
# float16 has 11 significant bits: from 2**11 terms on, a running sum stops growing by terms of
# its own average size, and 2048 activations of about 32 overflow 65504.
LARGE_REDUCTION = 2048
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
        seen = sorted({compute_dtype(layer) for layer, _ in layers if not is_model(layer)})
        findings.append(Finding(
            "policy_not_applied", "warning",
            f"no layer computes in {compute}: the model was built (or loaded) under another "
            f"policy than {policy}, so it would train in {'/'.join(seen)}; rebuild it under "
            f"{policy} (user_model.rebuild_with_policy)", None, {"compute_dtypes": seen}))
    findings += _variable_findings(model, layers, variable)
    trace = None
    if not any(f.severity == "error" for f in findings):
        trace = trace_step(model, tuple(int(d) for d in input_shape), batch_size, policy)
        if trace.error:
            findings.append(Finding("trace_failed", "error",
                                    f"the train step does not trace under {policy}: "
                                    f"{trace.error}"))
    rows, totals = layer_rows(layers, head, trace, model)
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
        if not is_model(layer) and layer is not out_layer)


def amp_check_of(model, info: dict, *, model_path: str | None = None,
                 image_size: int | None = None, sequence_length: int | None = None,
                 vocabulary_size: int | None = None, checkpoint=None,
                 weights: str | None = None):
    """The AMP report of `model` built under the current global policy on `info`'s shapes.

    `model` is `--model`'s text or its parsed user_model.ModelSpec (a config's `model_spec`).

    The model is checked as the user wrote it (so a half-precision output is named), with the
    float32 head that ampflow gives every model as its fix; the trace is of that fixed model,
    the one that trains. Text data builds a text model on token ids `[batch, sequence_length]`
    (the tokenizer's defaults where not given: components/train/modalities.py); a pretrained
    checkpoint `model` names is `checkpoint` when read already.
    """
    return check_built(*model_to_check(model, info, model_path=model_path,
                                       image_size=image_size, sequence_length=sequence_length,
                                       vocabulary_size=vocabulary_size, checkpoint=checkpoint,
                                       weights=weights))


def model_to_check(model, info: dict, *, model_path: str | None = None,
                   image_size: int | None = None, sequence_length: int | None = None,
                   vocabulary_size: int | None = None, checkpoint=None,
                   weights: str | None = None):
    """(`models.BuiltModel`, input shape, classes): what `amp_check_of` builds, not checked yet.

    Apart from `check_built` so that train (step.py) can build it under its seed and its
    strategy's scope and then train this very model (report.model), not build a second one.
    """
    from ampflow.components.train.modalities import training_of

    return training_of(info).model_to_check(
        model, info, model_path=model_path, image_size=image_size,
        sequence_length=sequence_length, vocabulary_size=vocabulary_size,
        checkpoint=checkpoint, weights=weights)


def text_amp_check_of(model, sequence_length: int, vocabulary_size: int,
                      num_classes: int, *, model_path: str | None = None):
    """`amp_check_of` for a text model: int32 token ids `[batch, sequence_length]` in."""
    from ampflow.modeling.models import make_text_model

    built = make_text_model(model, sequence_length, vocabulary_size, num_classes,
                            model_path=model_path)
    return check_built(built, (int(sequence_length),), int(num_classes))


def check_built(built, input_shape: tuple[int, ...], num_classes: int):
    """The report of a `models.BuiltModel`: its original checked, its fixes added.

    Nothing of `built.model` changes (the trace runs nothing): it can train afterwards.
    """
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
    from ampflow.modeling.user_model import standard_head

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
    # token ids of any length (ampflow's encoders: batches cut to their length bucket)
    if got_in != want_in and not (what == "token ids" and got_in == (None, None)):
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
        if (type(layer).__name__ == "InputLayer" or is_model(layer)
                or compute_dtype(layer) != "float32" or id(layer) in head):
            return head
        head.add(id(layer))


def _own_weights(layer) -> list:
    child = {id(w) for c in _children(layer) for w in c.weights}
    return [w for w in layer.weights if id(w) not in child]


def _variable_findings(model, layers, variable_dtype: str) -> list[Finding]:
    found = []
    for layer, _path in layers:
        if is_model(layer):
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
           if not is_model(layer) and id(layer) not in head and compute_dtype(layer) != compute]
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


# ---- rows and findings -----------------------------------------------------------------------


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


def _unsafe_findings(trace: Trace, head: set[int], policy: str, large_reduction: int,
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
        where = (f"a keras.ops call in model {owner.name!r}'s own graph" if is_model(owner)
                 else f"layer {owner.name!r} ({type(owner).__name__})")
        found[key] = Finding(
            "float16_unsafe_op", "warning",
            f"{where} computes {what} in float16 outside the float32 head: float16 overflows "
            "above 65504 (exp above 11.1) and loses small probabilities; give the layer "
            "dtype='float32' or compute it in float32",
            owner.name, {"op": op_type, "tf_op": name, "reduced_elements": reduced,
                         "class": "(keras.ops)" if is_model(owner) else type(owner).__name__})
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
            and not is_model(parent):
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


def _constant_findings(trace: Trace) -> list[Finding]:
    """A half-precision constant beyond its dtype's range (a mask's -1e9 in float16 is -inf)."""
    import math

    found: dict[str, Finding] = {}
    for op_name, owner, value, dtype, multiplied in trace.constants:
        where = owner.name if owner is not None else None
        if where in found:
            continue
        what = (f"layer {owner.name!r} ({type(owner).__name__})" if owner is not None
                and not is_model(owner) else "the model's own graph")
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


def _gradient_findings(trace: Trace) -> list[Finding]:
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


