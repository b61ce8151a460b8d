"""Input-bound or not: the share of an epoch's training time its steps waited for batches.

TrainLoop (loop.py) times the wait inside each step's graph and reads the sum once per epoch;
these turn it into the epoch's `input_wait_fraction` and its log line (loop.py's module
docstring says how it is measured and why the run's first step is left out).
"""

from __future__ import annotations

import logging

log = logging.getLogger("ampflow.components.train.run.loop")  # the epoch's lines, as before

# An epoch that spent this share of its training time waiting for batches is input-bound: the
# accelerator (or the CPU's training threads) idled that long; a faster model would not help.
INPUT_BOUND_FRACTION = 0.2
INPUT_BOUND_ADVICE = ("the input pipeline is the bottleneck: see docs/explanation/performance.md "
                      "(prepare-data at a smaller --image-size so that the decoded images fit "
                      "in memory and are cached, --no-augment, more CPU cores for the input)")


def input_wait_fraction(waited_seconds: float, train_seconds: float) -> float:
    """The share of an epoch's training time spent waiting for batches, 0..1."""
    if train_seconds <= 0:
        return 0.0
    return min(max(waited_seconds / train_seconds, 0.0), 1.0)


def is_input_bound(fraction: float) -> bool:
    """Whether an epoch with this input-wait share was held back by its input pipeline."""
    return fraction >= INPUT_BOUND_FRACTION


def log_input_wait(epoch: int, epochs: int, fraction: float, train_seconds: float) -> None:
    """The epoch's input verdict: a warning when input-bound, an info line otherwise."""
    if is_input_bound(fraction):
        log.warning("epoch %d/%d was input-bound: %.0f%% of its %.1f s of training waited for "
                    "the next batch; %s", epoch + 1, epochs, 100 * fraction, train_seconds,
                    INPUT_BOUND_ADVICE)
    else:
        log.info("epoch %d/%d: not input-bound (%.0f%% of %.1f s waited for batches)",
                 epoch + 1, epochs, 100 * fraction, train_seconds)
