"""The AMP check's report: its findings, its rows per layer, the table and amp_report.json."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampflow.artifacts.model_dir import AMP_REPORT_FILE
from ampflow.modeling.user_model import compute_dtype

if TYPE_CHECKING:
    from ampflow.components.train.preflight.graph import Trace



SEVERITIES = ("error", "warning", "fixed", "info")


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


def _origin(layer) -> str:
    """Whose code the layer's `call` is: "keras", "ampflow" or "custom".

    A user's subclass of a Keras layer that keeps Keras's `call` counts as Keras: its math is.
    """
    owner = next((cls for cls in type(layer).__mro__ if "call" in vars(cls)), type(layer))
    top = owner.__module__.split(".")[0]
    if top in ("keras", "tf_keras", "tensorflow"):
        return "keras"
    return "ampflow" if top == "ampflow" else "custom"


def layer_rows(layers, head: set[int], trace: Trace | None, model) -> tuple[list[LayerRow], dict]:
    """The report's row per layer, with its Casts by kind, and the totals of the trace."""
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
