"""Training parity: does AMP *training* reach the accuracy of float32 training, and how much faster.

The twin check sees inference rounding only; damage done while training in half precision is
in the weights, and only a model trained in float32 on the same data and seed shows it. Two
trainings differ by run-to-run noise, so the comparison is a paired test (exact McNemar) with a
cap on the drop, beside the speedup and the peak memory of the two runs. The statistics:
docs/explanation/design-notes.md, "evaluate_parity/training.py".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from ampflow.artifacts.verdict import Check
from ampflow.components.evaluate_parity.config import MIN_POWER
from ampflow.components.evaluate_parity.parity import ModelScores

EXACT_LIMIT = 1000  # discordant images up to which the binomial tail is summed exactly


@dataclass(frozen=True)
class PairedTest:
    """The per-image comparison of two models on the same labelled examples."""

    num_examples: int
    amp_only: int  # images only the AMP-trained model classifies correctly
    baseline_only: int  # images only the float32-trained model classifies correctly
    p_value: float  # one-sided: P(AMP loses >= baseline_only discordant images | equal accuracy)
    method: str

    @property
    def delta_points(self) -> float:
        """AMP accuracy minus baseline accuracy, in percentage points."""
        return 100.0 * (self.amp_only - self.baseline_only) / self.num_examples

    @property
    def stderr_points(self) -> float:
        """Standard error of the paired accuracy difference, in points."""
        n, d = self.num_examples, self.amp_only - self.baseline_only
        discordant = self.amp_only + self.baseline_only
        return 100.0 * math.sqrt(max(discordant - d * d / n, 0.0)) / n


def paired_test(amp: ModelScores, baseline: ModelScores) -> PairedTest:
    """McNemar's test of AMP vs baseline correctness on the same examples (one-sided)."""
    if not np.array_equal(amp.labels, baseline.labels):
        raise ValueError("both models must be scored on the same labelled examples")
    amp_right = amp.predictions == amp.labels
    base_right = baseline.predictions == baseline.labels
    amp_only = int(np.sum(amp_right & ~base_right))
    base_only = int(np.sum(~amp_right & base_right))
    p_value, method = binomial_upper_tail(base_only, amp_only + base_only)
    return PairedTest(int(amp.labels.shape[0]), amp_only, base_only, p_value, method)


def binomial_upper_tail(k: int, n: int) -> tuple[float, str]:
    """P(X >= k) for X ~ Binomial(n, 1/2), and the method used (exact up to EXACT_LIMIT)."""
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, n]. Received: k={k}, n={n}")
    if n == 0:
        return 1.0, "no discordant examples"
    if n <= EXACT_LIMIT:
        tail = sum(math.comb(n, i) for i in range(k, n + 1))
        return tail / 2**n, "exact binomial"
    z = (k - 0.5 - n / 2) / math.sqrt(n / 4)  # continuity-corrected
    return 0.5 * math.erfc(z / math.sqrt(2)), "normal approximation (continuity-corrected)"


@dataclass(frozen=True)
class Speedup:
    """AMP / float32 training throughput from the two runs' per-epoch measurements."""

    ratio: float
    stderr: float
    amp_img_per_s: tuple[float, ...]
    baseline_img_per_s: tuple[float, ...]

    def as_metrics(self) -> dict[str, Any]:
        """Flat entries for metrics.json."""
        amp, base = self.amp_img_per_s, self.baseline_img_per_s
        return {
            "training_speedup": self.ratio,
            "training_speedup_stderr": self.stderr,
            "amp_train_img_per_s": _mean(amp),
            "amp_train_img_per_s_stdev": _stdev(amp),
            "baseline_train_img_per_s": _mean(base),
            "baseline_train_img_per_s_stdev": _stdev(base),
            "training_speedup_epochs_measured": float(min(len(amp), len(base))),
        }


def training_speedup(amp_meta: dict[str, Any], base_meta: dict[str, Any]) -> Speedup:
    """Ratio of mean epoch throughputs and its standard error (NaN where not measurable)."""
    amp, base = epoch_throughputs(amp_meta), epoch_throughputs(base_meta)
    if not amp or not base:
        return Speedup(math.nan, math.nan, amp, base)
    mean_a, mean_b = _mean(amp), _mean(base)
    ratio = mean_a / mean_b
    relative_var = _sem(amp) ** 2 / mean_a**2 + _sem(base) ** 2 / mean_b**2
    return Speedup(ratio, ratio * math.sqrt(relative_var), amp, base)


def speedup_text(metrics: dict[str, Any], detail: str = "") -> str:
    """The AMP training speedup as printed: `1.31x ± 0.04 (SE; detail)`, never `± nan`.

    The standard error needs two timed epochs in each run (the first, which compiles, is left
    out of a longer run): a 1- or 2-epoch run has one, so the line says there is no interval
    and why, rather than `0.291x ± nan`.
    """
    ratio, stderr = metrics.get("training_speedup"), metrics.get("training_speedup_stderr")
    if not _finite(ratio):
        return "not measured (no training throughput recorded)"
    if _finite(stderr):
        return f"{ratio:.3g}x ± {stderr:.2g} (SE{'; ' + detail if detail else ''})"
    return (f"{ratio:.3g}x ({detail + '; ' if detail else ''}no interval: one timed epoch per "
            "run, the first left out of longer runs; 3 epochs or more give one)")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def epoch_throughputs(meta: dict[str, Any]) -> tuple[float, ...]:
    """Training examples/s of each epoch, without the first (compilation) when there are more.

    Falls back to the metadata's single `throughput_examples_per_sec` when no per-epoch figures
    were recorded (then the speedup has no error estimate).
    """
    values = [float(e["examples_per_sec"]) for e in meta.get("epochs") or []
              if isinstance(e, dict) and isinstance(e.get("examples_per_sec"), (int, float))
              and e["examples_per_sec"] > 0]
    if len(values) > 1:
        return tuple(values[1:])
    if values:
        return tuple(values)
    overall = meta.get("throughput_examples_per_sec")
    return (float(overall),) if isinstance(overall, (int, float)) and overall > 0 else ()


def training_metrics(amp: ModelScores, baseline: ModelScores, amp_meta: dict[str, Any],
                     base_meta: dict[str, Any]) -> dict[str, Any]:
    """The flat training-parity entries of metrics.json (power.py adds what it could detect)."""
    test = paired_test(amp, baseline)
    amp_secs, base_secs = amp_meta.get("train_seconds"), base_meta.get("train_seconds")
    return {
        "baseline_accuracy": baseline.accuracy,
        "baseline_accuracy_delta_points": test.delta_points,
        "baseline_delta_stderr_points": test.stderr_points,
        "baseline_amp_only_correct": float(test.amp_only),
        "baseline_only_correct": float(test.baseline_only),
        "baseline_mcnemar_p_value": test.p_value,
        "baseline_argmax_agreement": float(np.mean(amp.predictions == baseline.predictions)),
        **training_speedup(amp_meta, base_meta).as_metrics(),
        "train_time_ratio": base_secs / amp_secs if amp_secs and base_secs else math.nan,
        "baseline_mcnemar_method": test.method,
        **training_memory(amp_meta, base_meta),
    }


def peak_memory(meta: dict[str, Any]) -> tuple[int, str] | None:
    """(peak bytes, what measured it) of a run's training, or None where not recorded."""
    block = meta.get("memory")
    peak = block.get("peak_bytes") if isinstance(block, dict) else None
    if not isinstance(peak, (int, float)) or isinstance(peak, bool) or not peak > 0:
        return None
    return int(peak), str(block.get("source") or "unknown")


def training_memory(amp_meta: dict[str, Any], base_meta: dict[str, Any]) -> dict[str, Any]:
    """Peak training memory of each run and AMP / float32; only the entries that were recorded."""
    amp, base = peak_memory(amp_meta), peak_memory(base_meta)
    out: dict[str, Any] = {}
    if amp:
        out["amp_train_peak_memory_bytes"] = float(amp[0])
        out["amp_train_peak_memory_source"] = amp[1]
    if base:
        out["baseline_train_peak_memory_bytes"] = float(base[0])
        out["baseline_train_peak_memory_source"] = base[1]
    if amp and base:
        out["train_peak_memory_ratio"] = amp[0] / base[0]
    return out


def training_checks(metrics: dict[str, Any], max_drop: float, alpha: float,
                    min_speedup: float | None, power: float = MIN_POWER,
                    item: str = "examples") -> list[Check]:
    """The gate's training-parity checks (see the module docstring), in the data's `item`."""
    checks = [
        Check("baseline_accuracy_delta_points", metrics["baseline_accuracy_delta_points"], ">=",
              -drop_cap_points(max_drop, alpha, metrics.get("num_examples")),
              "AMP-trained minus float32-trained accuracy, points (a net loss under "
              f"{min_evidence_images(alpha)} {item} passes: it could never be significant)"),
        Check("baseline_mcnemar_p_value", metrics["baseline_mcnemar_p_value"], ">=", alpha,
              f"one-sided paired (McNemar) test: chance of AMP losing this many {item} by luck "
              "if AMP and float32 training were equally accurate",
              reason=_paired_sentence(metrics, alpha, power, item)),
    ]
    if min_speedup is not None:
        checks.append(Check("training_speedup", metrics["training_speedup"], ">=", min_speedup,
                            "training throughput AMP / float32 baseline"))
    return checks


def _paired_sentence(metrics: dict[str, Any], alpha: float, power: float, item: str) -> str:
    """The paired test in words with what it could detect; "" where that was not measured."""
    drop = metrics.get("baseline_detectable_drop_points")
    if drop is None or "num_examples" not in metrics:
        return ""
    p = metrics["baseline_mcnemar_p_value"]
    found = ("could not detect any drop" if math.isinf(drop)
             else f"detects a drop of {drop:.1f} points or more with {power:.0%} power")
    return (f"AMP-trained minus float32-trained accuracy "
            f"{metrics['baseline_accuracy_delta_points']:+.2f} points, one-sided McNemar "
            f"p = {p:.3g} {'<' if p < alpha else '>='} alpha {alpha:g}; on "
            f"{metrics['num_examples']} {item} the test {found}")


def power_notes(metrics: dict[str, Any], max_drop: float, alpha: float, item: str,
                power: float = MIN_POWER) -> list[str]:
    """A note when the split is too small for the training-parity checks to tell much.

    That is when the drop cap had to rise to the test's least evidence (`drop_cap_points`):
    decided by the split's size alone, never by how two trainings happened to differ. It
    says, in the verdict and the run's table, how large a loss the paired test could find.
    """
    from ampflow.components.evaluate_parity.release import hold_out_more

    n = metrics["num_examples"]
    cap = min(drop_cap_points(max_drop, alpha, n), 100.0)  # past 100 points no cap is tighter
    if cap <= max_drop:  # so a cap of 100 (the check turned off) never rises
        return []
    drop = metrics["baseline_detectable_drop_points"]
    found = ("could not detect any loss, however large" if drop is None or math.isinf(drop)
             else f"detects only a loss of {drop:.1f} points or more with {power:.0%} power")
    return [f"on {n} {item} the paired test of AMP-trained against float32-trained accuracy "
            f"({metrics['baseline_accuracy_delta_points']:+.2f} points, McNemar p = "
            f"{metrics['baseline_mcnemar_p_value']:.3g}) {found}, and the drop cap rises from "
            f"{max_drop:g} to {cap:.1f} points (the test's least evidence); "
            f"{hold_out_more(item)}"]


def min_evidence_images(alpha: float) -> int:
    """The fewest net images AMP must lose before the paired test can call it significant.

    Even with every discordant image against AMP, k of them give p = 2**-k: so k >= log2(1/alpha)
    (7 at alpha 0.01). A smaller net loss is no evidence of damage, however many points it is.
    """
    return math.ceil(math.log2(1 / alpha))


def drop_cap_points(max_drop: float, alpha: float, num_examples: int | None) -> float:
    """The maximum drop, in points: `max_drop`, but never under min_evidence_images - 1 images.

    On the 359-image digits split the 3-point cap is 10.8 images; on a split under 200 images
    it would be fewer than 7, and on one under 34 images a single image, a verdict on a handful
    of samples (issue 37): there the cap is 6 images' worth of points instead.
    """
    if not num_examples:
        return max_drop
    return max(max_drop, 100.0 * (min_evidence_images(alpha) - 1) / num_examples)


def comparability_notes(meta: dict[str, Any], base_meta: dict[str, Any]) -> list[str]:
    """Differences that make the training comparison less fair (same data and seed expected)."""
    notes = []
    for key in ("seed", "architecture", "image_size"):
        if meta.get(key) != base_meta.get(key):
            notes.append(f"{key} differs: {meta.get(key)!r} (AMP) vs {base_meta.get(key)!r}")
    for key in ("epochs", "batch_size", "learning_rate", "optimizer"):
        a, b = (meta.get("config") or {}).get(key), (base_meta.get("config") or {}).get(key)
        if a != b:
            notes.append(f"{key} differs: {a!r} (AMP) vs {b!r} (baseline)")
    amp_memory, base_memory = peak_memory(meta), peak_memory(base_meta)
    if amp_memory and base_memory and amp_memory[1] != base_memory[1]:
        notes.append(f"peak memory measured differently: {amp_memory[1]} (AMP) vs "
                     f"{base_memory[1]} (baseline)")
    if meta.get("devices") != base_meta.get("devices"):
        notes.append(f"devices differ: {meta.get('devices')} (AMP) vs {base_meta.get('devices')} "
                     "(baseline): the speedup compares different hardware")
    return notes


def _mean(values: tuple[float, ...]) -> float:
    return statistics.fmean(values) if values else math.nan


def _stdev(values: tuple[float, ...]) -> float:
    return statistics.stdev(values) if len(values) > 1 else math.nan


def _sem(values: tuple[float, ...]) -> float:
    """Standard error of the mean; NaN from one value (no spread to estimate it from)."""
    return _stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
