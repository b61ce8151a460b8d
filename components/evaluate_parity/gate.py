"""The parity gate: named checks of a measured value against a threshold, and the verdict.

A gate is an artifact, not a side effect (docs/DESIGN.md, "Architecture"): every check keeps its
measured value, its threshold and its operator, so the verdict file says why it passed or
failed, and the export step can refuse a model by reading it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampflow.artifacts.verdict import Check

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
