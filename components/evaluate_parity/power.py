"""What a paired comparison on n examples can detect, and the non-inferiority test (no TF).

The gate's paired test is McNemar's one-sided exact test (training.py). A test that finds
nothing on a small split proves little, so every comparison also states the smallest drop it
detects with 80 % power at its alpha, computed exactly over the discordant count, under a
stated assumption about how often the two models disagree. The non-inferiority rule uses
Tango's score test for paired proportions. The statistics, and why these tests:
docs/explanation/design-notes.md, "power.py", and docs/explanation/parity.md.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ampflow.components.evaluate_parity.release import _log_pmf, _normal_quantile, _upper_tails
from ampflow.components.evaluate_parity.training import EXACT_LIMIT, binomial_upper_tail

DEFAULT_POWER = 0.8
_TOLERANCE_POINTS = 0.05  # the bisection stops within this much of the detectable drop
_NEGLIGIBLE = 1e-13  # P(D = d) below this (relative to the mode) is left out of the sum


@lru_cache(maxsize=65536)
def critical_count(d: int, alpha: float) -> int | None:
    """The test's least count c (of d discordant) with p < alpha; None: none is significant."""
    if d == 0 or 0.5**d >= alpha:
        return None
    if d <= EXACT_LIMIT:
        tails = _upper_tails(d, 0.5)
        return int(np.argmax(tails < alpha))
    z = _normal_quantile(1.0 - alpha)  # the normal approximation the test uses above the limit
    k = min(max(0, int(d / 2 + 0.5 + z * math.sqrt(d) / 2) - 2), d + 1)
    while k <= d and binomial_upper_tail(k, d)[0] >= alpha:
        k += 1
    return k if k <= d else None  # an alpha below what the approximation resolves


def mcnemar_power(n: int, drop: float, discordant: float, alpha: float) -> float:
    """Power of the one-sided exact McNemar test on n pairs against a drop (both fractions).

    `discordant` is the share psi of examples the two models disagree on (>= drop).
    """
    if n <= 0 or drop <= 0.0:
        return 0.0
    psi = min(1.0, max(discordant, drop))
    against = min(1.0, (1.0 + drop / psi) / 2.0)
    weights = np.exp(_log_pmf(n, psi)) if psi < 1.0 else np.eye(1, n + 1, n)[0]
    power = 0.0
    for d in np.nonzero(weights > _NEGLIGIBLE * weights.max())[0]:
        k = critical_count(int(d), alpha)
        if k is not None:
            power += weights[d] * (1.0 if against >= 1.0 else _upper_tails(int(d), against)[k])
    return min(1.0, float(power))


def detectable_drop(n: int, discordant: float, alpha: float,
                    power: float = DEFAULT_POWER) -> float | None:
    """The smallest drop, in points, that the test finds with probability >= power; None: none.

    `discordant` is the observed share of discordant examples (the stated assumption above).
    """
    if mcnemar_power(n, 1.0, 1.0, alpha) < power:
        return None
    low, high = 0.0, 1.0
    while 100.0 * (high - low) > _TOLERANCE_POINTS:
        mid = (low + high) / 2.0
        if mcnemar_power(n, mid, discordant, alpha) >= power:
            high = mid
        else:
            low = mid
    return 100.0 * high


def detectable_drop_points(n: int, new_only: int, old_only: int, alpha: float,
                           power: float = DEFAULT_POWER) -> float:
    """`detectable_drop` for a pair's counts, as metrics.json keeps it (inf: no drop)."""
    drop = detectable_drop(n, (new_only + old_only) / n, alpha, power)
    return math.inf if drop is None else drop


def noninferiority_p_value(new_only: int, old_only: int, n: int, margin: float) -> float:
    """One-sided p of H0: acc_new - acc_old <= -margin (margin a fraction), Tango's score test.

    Small p: the data show the new model is not worse by `margin` or more.
    """
    if not 0 <= new_only + old_only <= n or n <= 0:
        raise ValueError(f"the counts must fit in n. Received: new_only={new_only}, "
                         f"old_only={old_only}, n={n}")
    if not 0.0 < margin < 1.0:
        raise ValueError(f"margin must be in (0, 1). Received: margin={margin}")
    p_old = _restricted_old_only(new_only, old_only, n, margin)
    variance = n * (2.0 * p_old - margin - margin**2)  # n (p_new + p_old - margin**2) under H0
    excess = new_only - old_only + n * margin
    if variance <= 0.0:
        return 0.0 if excess > 0 else 1.0
    return 0.5 * math.erfc(excess / math.sqrt(variance) / math.sqrt(2.0))


def _restricted_old_only(new_only: int, old_only: int, n: int, margin: float) -> float:
    """The MLE of P(only the old model right) under p_new_only = p_old_only - margin.

    The likelihood's stationary point solves 2n x**2 - B x + c m (1 + m) = 0; its larger root
    lies in the feasible [m, (1 + m) / 2] (clipped there for counts on the boundary).
    """
    rest, discordant = n - new_only - old_only, new_only + old_only
    b = 2 * rest * margin + discordant * (1 + margin) + 2 * old_only * margin
    root = (b + math.sqrt(max(b * b - 8 * n * old_only * margin * (1 + margin), 0.0))) / (4 * n)
    return min(max(root, margin), (1 + margin) / 2)
