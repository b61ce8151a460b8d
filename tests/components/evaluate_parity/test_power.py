"""What the paired test can detect, and the non-inferiority test: power.py, against independent
computations (a direct double sum over every outcome, the likelihood on a grid)."""

from __future__ import annotations

import math

import pytest

from ampflow.components.evaluate_parity import power
from ampflow.components.evaluate_parity.training import EXACT_LIMIT, binomial_upper_tail


@pytest.mark.parametrize("d", [7, 8, 20, 101, EXACT_LIMIT, EXACT_LIMIT + 1, 4000])
def test_the_critical_count_is_where_the_test_itself_turns_significant(d):
    k = power.critical_count(d, 0.01)
    assert binomial_upper_tail(k, d)[0] < 0.01 <= binomial_upper_tail(k - 1, d)[0]


def test_no_count_is_significant_below_the_tests_least_evidence():
    assert power.critical_count(6, 0.01) is None  # 2**-6 = 0.016: even 6 of 6 is not
    assert power.critical_count(7, 0.01) == 7
    # an alpha the demo opens to 1e-300: above the exact limit the normal tail cannot reach it
    assert power.critical_count(EXACT_LIMIT + 1, 1e-300) is None
    assert power.detectable_drop(359, 0.05, 1e-300) is None


def _power_by_enumeration(n: int, drop: float, discordant: float, alpha: float) -> float:
    """Every (d discordant, c of them against the new model) weighed by its probability."""
    psi = max(discordant, drop)
    q = (1 + drop / psi) / 2
    total = 0.0
    for d in range(n + 1):
        p_d = math.comb(n, d) * psi**d * (1 - psi) ** (n - d)
        total += p_d * sum(math.comb(d, c) * q**c * (1 - q) ** (d - c) for c in range(d + 1)
                           if binomial_upper_tail(c, d)[0] < alpha)
    return total


@pytest.mark.parametrize("n, drop, discordant, alpha", [
    (18, 0.3, 0.4, 0.01), (40, 0.1, 0.15, 0.05), (60, 0.2, 0.0, 0.01), (25, 0.5, 0.5, 0.01)])
def test_mcnemar_power_is_the_exact_sum_over_every_outcome(n, drop, discordant, alpha):
    assert power.mcnemar_power(n, drop, discordant, alpha) == pytest.approx(
        _power_by_enumeration(n, drop, discordant, alpha), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("n, discordant", [(18, 3 / 18), (100, 0.06), (359, 0.04), (1000, 0.1)])
def test_the_detectable_drop_is_the_smallest_with_the_stated_power(n, discordant):
    drop = power.detectable_drop(n, discordant, 0.01, 0.8)
    assert power.mcnemar_power(n, drop / 100, discordant, 0.01) >= 0.8
    assert power.mcnemar_power(n, (drop - 0.1) / 100, discordant, 0.01) < 0.8


def test_the_eighteen_text_split_cannot_detect_even_a_twenty_point_drop():
    """Issue 46: 18 test texts, 3 discordant (1 new only, 2 served only): p = 0.5."""
    drop = power.detectable_drop(18, 3 / 18, 0.01)
    assert drop > 40.0
    assert power.mcnemar_power(18, 0.20, 3 / 18, 0.01) < 0.2


def test_more_examples_detect_smaller_drops_and_too_few_detect_none():
    drops = [power.detectable_drop(n, 0.05, 0.01) for n in (50, 200, 1000, 5000)]
    assert drops == sorted(drops, reverse=True) and drops[-1] < 2.0
    assert power.detectable_drop(6, 0.05, 0.01) is None  # under log2(1/alpha) examples


def _log_likelihood(b: int, c: int, n: int, p_old: float, margin: float) -> float:
    p_new, rest = p_old - margin, 1 - 2 * p_old + margin
    terms = [(b, p_new), (c, p_old), (n - b - c, rest)]
    if any(count > 0 and p <= 0 for count, p in terms):
        return -math.inf
    return sum(count * math.log(p) for count, p in terms if count > 0)


@pytest.mark.parametrize("b, c, n, margin", [(1, 2, 18, 0.3), (0, 0, 50, 0.05),
                                             (30, 10, 100, 0.1), (5, 0, 5, 0.2)])
def test_the_score_tests_restricted_estimate_maximizes_the_likelihood(b, c, n, margin):
    found = power._restricted_old_only(b, c, n, margin)
    grid = [margin + i * (1 - margin) / 2 / 20000 for i in range(20001)]
    best = max(grid, key=lambda x: _log_likelihood(b, c, n, x, margin))
    assert found == pytest.approx(best, abs=1e-4)


def test_noninferiority_of_two_identical_models_is_shown_only_with_enough_examples():
    # never a disagreement: the statistic is sqrt(n m / (1 - m)) (the variance under H0)
    for n, margin in ((18, 0.05), (400, 0.05)):
        expected = 0.5 * math.erfc(math.sqrt(n * margin / (1 - margin)) / math.sqrt(2))
        assert power.noninferiority_p_value(0, 0, n, margin) == pytest.approx(expected)
    assert power.noninferiority_p_value(0, 0, 18, 0.05) > 0.1
    assert power.noninferiority_p_value(0, 0, 400, 0.05) < 1e-4


def test_noninferiority_decides_by_the_margin_in_the_right_direction():
    # 20,000 examples, 0.5 points worse: within a 1-point margin, not within 0.25
    assert power.noninferiority_p_value(200, 300, 20_000, 0.01) < 1e-4
    assert power.noninferiority_p_value(200, 300, 20_000, 0.0025) > 0.5
    # the same counts the other way round (better by 0.5 points) are non-inferior at 0.25
    assert power.noninferiority_p_value(300, 200, 20_000, 0.0025) < 1e-4


def test_noninferiority_refuses_counts_and_margins_it_cannot_test():
    with pytest.raises(ValueError, match="the counts must fit in n"):
        power.noninferiority_p_value(10, 10, 15, 0.1)
    with pytest.raises(ValueError, match=r"margin must be in \(0, 1\)"):
        power.noninferiority_p_value(1, 1, 15, 0.0)


def test_the_power_table_in_the_docs_is_what_power_py_computes():
    from pathlib import Path

    text = (Path(__file__).parents[3] / "docs" / "explanation" / "parity.md").read_text()
    table = text.split("<!-- power-table: alpha 0.01, power 0.8 -->\n", 1)[1].split("\n\n")[0]
    header, _, *rows = table.splitlines()
    shares = [0.0, 0.05, 0.10, 0.20]  # "discordance <= delta": the most favourable case
    assert header.count("|") == len(shares) + 2
    assert len(rows) >= 5
    for row in rows:
        n, *cells = [cell.strip() for cell in row.strip("|").split("|")]
        for share, cell in zip(shares, cells, strict=True):
            drop = power.detectable_drop(int(n), share, 0.01, 0.8)
            assert cell == ("none" if drop is None else f"{drop:.1f}"), (n, share)


def _exact_size(n: int, discordant: float, margin: float, alpha: float) -> float:
    """P(the score test shows non-inferiority) when the model is exactly `margin` worse."""
    p_old = (discordant + margin) / 2
    p_new, rest = p_old - margin, 1 - discordant
    total = 0.0
    for b in range(n + 1):
        for c in range(n + 1 - b):
            if power.noninferiority_p_value(b, c, n, margin) <= alpha:
                total += (math.factorial(n) // (math.factorial(b) * math.factorial(c)
                                                * math.factorial(n - b - c))
                          * p_new**b * p_old**c * rest ** (n - b - c))
    return total


@pytest.mark.parametrize("n, discordant, margin", [(18, 0.5, 0.2), (50, 0.2, 0.1),
                                                   (100, 0.3, 0.05)])
def test_the_score_tests_exact_size_stays_near_its_alpha(n, discordant, margin):
    """Enumerated over every outcome at the boundary of H0 (docs/explanation/parity.md)."""
    assert _exact_size(n, discordant, margin, 0.01) <= 0.0125
