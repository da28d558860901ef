"""Paired comparisons over seeds, pure numpy / scipy: means with t confidence intervals, the paired t-test,
Holm's correction and the minimum detectable effect."""
from __future__ import annotations

import math
from typing import Any, Sequence

from vlkit.stats.sequential import paired_power

ALPHA = 0.05
POWER = 0.8


def finite(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its t-distribution confidence interval (NaN for a single value)."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n))


def paired_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided paired t-test over seeds; NaN (not significant) when it cannot be computed: fewer than
    two seeds, or differences without spread, rounding aside (the t statistic is undefined, not infinitely sure)."""
    from scipy import stats

    if len(a) != len(b) or len(a) < 2:
        return float("nan")
    diffs = [x - y for x, y in zip(a, b)]
    if all(math.isclose(d, diffs[0], rel_tol=1e-9, abs_tol=1e-12) for d in diffs):  # equal up to rounding
        return float("nan")
    return float(stats.ttest_rel(a, b).pvalue)


def paired_test(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """``a - b`` paired by seed: mean difference, its 95% CI half-width, SD of the differences, p-value."""
    diffs = [x - y for x, y in zip(a, b)]
    effect, ci = mean_ci(diffs)
    sd = math.sqrt(sum((d - effect) ** 2 for d in diffs) / (len(diffs) - 1)) if len(diffs) > 1 else float("nan")
    return {"effect": effect, "ci95": ci, "sd": sd, "n": len(diffs), "p": paired_p_value(a, b)}


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1); NaN (a test that could not
    be computed) stays NaN and does not count towards the number of tests."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m = len(order)
    adjusted = [float("nan")] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def min_detectable_effect(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference a two-sided paired t-test over ``n`` seeds detects with probability
    ``power`` at level ``alpha``, when the differences have standard deviation ``sd`` (noncentral t)."""
    from scipy import optimize

    if n < 2 or not math.isfinite(sd) or sd <= 0:
        return float("nan")

    def shortfall(effect: float) -> float:
        return paired_power(effect, sd, n, alpha) - power if effect > 0 else -power

    high = sd
    while shortfall(high) < 0:
        high *= 2
    return float(optimize.brentq(shortfall, 0.0, high))


__all__ = ["ALPHA", "POWER", "finite", "holm", "mean_ci", "min_detectable_effect", "paired_p_value", "paired_test"]
