"""The loss-scale guard's rule: when the loss, the loss scale and the skipped steps say "broken".

Dynamic loss scaling expects overflows, so a short-run skip rate cannot tell a healthy run from
a broken model. The guard decides on evidence that does not depend on the run's length: a
non-finite loss; the scale under `floor`; more than `max_consecutive_skipped` skips in a row; a
sustained rate over a full window after the warm-up. Plain Python, no TensorFlow: tests feed it
recorded sequences. The rules and their numbers: docs/explanation/design-notes.md, "guard.py",
and docs/explanation/amp-checks.md.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass

from ampflow.errors import TrainingDivergedError

LIKELY_CAUSES = (
    "likely causes: an output layer computing in float16 (keep logits/softmax float32), "
    "a learning rate too high, or an op that is unsafe in float16 (exp/log/large reductions "
    "without a float32 cast)"
)
INITIAL_SCALE = 2.0**15  # keras.optimizers.LossScaleOptimizer's default initial_scale


@dataclass(frozen=True)
class GuardLimits:
    """The guard's thresholds (TrainConfig's defaults come from here; the module says why)."""

    floor: float = 1.0
    max_skipped_fraction: float = 0.05
    warmup_steps: int = 50
    window_steps: int = 200
    min_skipped_steps: int = 10
    max_consecutive_skipped: int = 15

    def to_json(self) -> dict:
        """The `guard` entry of metadata.json's loss_scale block."""
        return asdict(self)


@dataclass(frozen=True)
class _Mark:
    step: int
    skipped: int


class LossScaleGuard:
    """Judge a run's observations in step order; raise `TrainingDivergedError` when broken."""

    def __init__(self, limits: GuardLimits):
        self.limits = limits
        self.consecutive = 0  # skipped steps in a row, up to the latest observation
        self.longest_run = 0  # the most skipped steps in a row seen so far
        self._last: _Mark | None = None
        self._marks: deque[_Mark] = deque()  # observations after warm-up, oldest first

    def observe(self, step: int, loss: float | None, scale: float | None = None,
                skipped: int | None = None) -> None:
        """Judge one step: its loss and, under loss scaling, its scale and skipped-step count.

        `skipped` is cumulative (steps so far minus the optimizer's iterations).
        """
        if loss is not None and not math.isfinite(loss):
            raise TrainingDivergedError(
                f"the training loss became non-finite ({loss}) at step {step}: the forward pass "
                "overflowed or the weights are no longer finite, which no loss scale can fix "
                "(it scales the backward pass only), so one such step stops the run; "
                + LIKELY_CAUSES)
        if scale is None or skipped is None:  # no loss scaling: nothing else to watch
            return
        limits = self.limits
        if scale < limits.floor:
            raise TrainingDivergedError(
                f"the dynamic loss scale fell to {scale:g}, below the floor {limits.floor:g}, "
                f"at step {step} ({skipped} steps skipped for non-finite gradients): each "
                f"overflow halves the scale, so from {INITIAL_SCALE:g} it gets there only when "
                "the gradients overflow float16 at every scale, not by loss scaling doing its "
                "job (a handful of halvings); " + LIKELY_CAUSES)
        if self._last is not None and step <= self._last.step:
            return  # seen already (a resumed epoch's end): the counts below are per step
        self._count_consecutive(step, skipped)
        if self.consecutive > limits.max_consecutive_skipped:
            raise TrainingDivergedError(
                f"{self.consecutive} steps in a row were skipped for non-finite gradients, up "
                f"to step {step} (limit {limits.max_consecutive_skipped}; the loss scale is now "
                f"{scale:g}): the weights have not been updated since step "
                f"{step - self.consecutive}, and a healthy run's scale search needs at most "
                f"{math.log2(INITIAL_SCALE):.0f} halvings, from {INITIAL_SCALE:g} to 1; "
                + LIKELY_CAUSES)
        self._check_rate(step, skipped)

    def _count_consecutive(self, step: int, skipped: int) -> None:
        last = self._last or _Mark(0, 0)
        gap, newly_skipped = step - last.step, skipped - last.skipped
        if newly_skipped >= gap:  # every step since the last observation was skipped
            self.consecutive += gap
        else:  # some step in the gap was applied; its trailing skips are not known: none
            self.consecutive = 0
        self.longest_run = max(self.longest_run, self.consecutive)
        self._last = _Mark(step, skipped)

    def _check_rate(self, step: int, skipped: int) -> None:
        limits = self.limits
        if step < limits.warmup_steps:
            return
        self._marks.append(_Mark(step, skipped))
        start = step - limits.window_steps
        while len(self._marks) > 1 and self._marks[1].step <= start:
            self._marks.popleft()  # the latest mark at or before the window's start stays
        base = self._marks[0]
        if base.step > start:  # fewer than window_steps steps observed after warm-up
            return
        window, count = step - base.step, skipped - base.skipped
        if count >= limits.min_skipped_steps and count / window > limits.max_skipped_fraction:
            raise TrainingDivergedError(
                f"{count} of the last {window} steps (to step {step}) were skipped for "
                f"non-finite gradients, {count / window:.1%} (limit "
                f"{limits.max_skipped_fraction:.1%} over {limits.window_steps} steps after the "
                f"{limits.warmup_steps}-step warm-up, at least {limits.min_skipped_steps} "
                "skips): loss scaling doing its job costs one skip per halving, a handful, "
                "not a sustained rate; " + LIKELY_CAUSES)
