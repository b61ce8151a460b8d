"""The parity gate: named checks of a measured value against a threshold, and the verdict.

A gate is an artifact, not a side effect (docs/DESIGN.md, "Architecture"): every check keeps its
measured value, its threshold and its operator, so the verdict file says why it passed or
failed, and the export step can refuse a model by reading it.
"""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass
from typing import Any

_OPS = {"<=": operator.le, ">=": operator.ge}

# Unit roundoff (half the machine epsilon) of each compute dtype: 2**-(significand bits).
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}
# The auto bound on max |logit diff| / max |logit| is this many units of roundoff. Measured on
# the small CNN (docs in step.py): float16 0.8 units, bfloat16 1.0 unit. Rounding errors grow
# with depth (about sqrt(layers) for independent errors), so 20 units leaves room for a
# ResNet-50's ~50 layers while a real defect (an overflow, a layer computing in the wrong
# dtype, a broken kernel) is orders of magnitude beyond it.
ROUNDOFF_UNITS = 20.0


def default_relative_logit_bound(compute_dtype: str) -> float:
    """The auto threshold of the relative logit check for a compute dtype."""
    return ROUNDOFF_UNITS * UNIT_ROUNDOFF.get(compute_dtype, UNIT_ROUNDOFF["float16"])


@dataclass(frozen=True)
class Check:
    """One gate check: `value op threshold` must hold; a non-finite value always fails."""

    name: str
    value: float
    op: str
    threshold: float
    description: str = ""
    reason: str = ""  # the outcome in words with its numbers, where a sentence says more


    @property
    def passed(self) -> bool:
        """Whether the measured value satisfies the threshold (NaN/inf never pass)."""
        return math.isfinite(self.value) and _OPS[self.op](self.value, self.threshold)

    def as_dict(self) -> dict[str, Any]:
        """JSON form, as written into metrics.json and verdict.json."""
        out = asdict(self)
        out["value"] = self.value if math.isfinite(self.value) else str(self.value)
        out["passed"] = self.passed
        return out

    def explain(self) -> str:
        """`name: reason`, else `name: measured X vs threshold op Y`: what a failed gate prints."""
        if self.reason:
            return f"{self.name}: {self.reason}"
        measured, bound = _fmt(self.value), _fmt(self.threshold)
        return f"{self.name}: measured {measured} vs threshold {self.op} {bound}"


@dataclass(frozen=True)
class Verdict:
    """All checks of one evaluation and whether they all passed."""

    checks: tuple[Check, ...]
    notes: tuple[str, ...] = ()  # what the checks cannot say (a split too small to decide)

    @property
    def passed(self) -> bool:
        """True only if every check passed."""
        return all(check.passed for check in self.checks)

    @property
    def failed(self) -> tuple[Check, ...]:
        """The checks that did not pass, in gate order."""
        return tuple(check for check in self.checks if not check.passed)

    def message(self) -> str:
        """One line per failed check (or a pass line), naming measured value and threshold."""
        if self.passed:
            return f"parity gate passed ({len(self.checks)} checks)"
        lines = "; ".join([check.explain() for check in self.failed]
                          + [f"note: {note}" for note in self.notes])
        return f"parity gate failed {len(self.failed)}/{len(self.checks)} checks: {lines}"


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == 0 or 1e-3 <= abs(value) < 1e4:
        return f"{value:.4g}"
    return f"{value:.3e}"
