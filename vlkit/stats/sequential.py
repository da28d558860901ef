"""Seeds until decided: a group-sequential rule that adds seeds to a comparison until each claim is decided,
keeping the family-wise error over the claims at ``alpha`` where its assumptions hold (pure numpy / scipy;
docs/compare-sequential.md says where they do not).

* Looks after ``n_1 < n_2 < ... < n_K`` seeds (`look_sizes`), information fraction ``t_k = n_k / n_K``.
* Per claim, a one-sided group-sequential test in the claim's pre-registered direction (`KINDS`: ``higher``,
  ``lower``; ``not_higher``: non-superiority against a margin; ``equivalent``: two one-sided tests, TOST, Schuirmann
  1987, J Pharmacokinet Biopharm 15:657-680, an intersection-union test, Berger 1982, Technometrics 24:295-300), with
  Lan-DeMets O'Brien-Fleming-type alpha spending ``alpha(t) = 2 - 2 Phi(z_{1-a/2} / sqrt(t))`` (spends exactly
  ``a`` at ``t = 1``; Lan & DeMets 1983, Biometrika 70:659-663; O'Brien & Fleming 1979, Biometrics 35:549-556).
  The z-boundaries follow from the joint law of the z statistics (`nominal_levels`, two-sided, by numerical
  integration; Armitage, McPherson & Rowe 1969); applied to the paired t-test at 2-5 degrees of freedom they spend
  more than ``a`` (Jennison & Turnbull 2000, ch. 11; tests/compare/test_sequential.py), so the rule uses exact t
  boundaries (Jennison & Turnbull 1991, Biometrika 78:133-141; `t_levels`): each look's boundary on t spends what
  the spending function allots under the t statistics' own joint null law (a seeded Monte Carlo).
* The sign-flip check (`decides`): where the exact sign-flip (paired permutation) test can reach a look's level
  (``2^-n <= level``), a decision needs its p at the level too; it is exact whenever the differences are symmetric
  about the null value, whatever their law. A decision below that is parametric-only (the t-test alone).
* Across claims, the graphical Holm procedure for group-sequential designs (Maurer & Bretz 2013, Statistics in
  Biopharmaceutical Research 5(4):311-320): each hypothesis starts at local level ``alpha / H``; at each look every
  open hypothesis that `decides` at its nominal level is decided, its local level is split equally among the open
  hypotheses, and those are retested at the same look until none is decided (`sequential_claims`). A claim's
  pre-registered contradiction test (``contradict``) is a hypothesis of its own; when either of a claim's two is
  decided, the other closes and keeps its level. With one look this is Holm's procedure (Holm 1979, Scand J Stat
  6:65-70).
* "Seeds needed": the power of the paired t-test from the noncentral t (`paired_power`, `seeds_for_power`).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
from scipy import optimize, special, stats


MAX_SEEDS = 100  # the most seeds a sequential design may look at


def look_sizes(initial: int, max_seeds: int, round_seeds: int) -> list[int]:
    """Seeds at each look: ``initial``, then ``round_seeds`` more a look, the last clipped to ``max_seeds``
    (3, 6, 1 -> [3, 4, 5, 6]; 3, 6, 2 -> [3, 5, 6]; ``initial >= max_seeds`` -> [max_seeds])."""
    if initial < 2:
        raise ValueError(f"initial seeds must be at least 2 (a paired t-test needs 2 differences), not {initial}")
    if not 2 <= max_seeds <= MAX_SEEDS:
        raise ValueError(f"max_seeds must be 2 to {MAX_SEEDS}, not {max_seeds} (the exact t boundaries are placed on "
                         f"{T_PATHS:,} simulated null sequences of that many seeds)")
    if round_seeds < 1:
        raise ValueError(f"round_seeds (seeds added per look) must be at least 1, not {round_seeds}")
    if initial >= max_seeds:
        return [max_seeds]
    return [*range(initial, max_seeds, round_seeds), max_seeds]


def spending(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending function: the two-sided error spent by information ``t``."""
    return float(2.0 - 2.0 * special.ndtr(special.ndtri(1 - alpha / 2) / math.sqrt(t))) if t > 0 else 0.0


@lru_cache(maxsize=1024)
def _boundaries(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """Two-sided z-boundaries ``c_k``: P(|Z_j| < c_j for j < k, |Z_k| >= c_k) = alpha(t_k) - alpha(t_{k-1}),
    by recursive integration of the continuation density on a Simpson grid."""
    t = np.asarray(fractions)
    spent = np.array([spending(x, alpha) for x in t])
    gaps = np.diff(t) / t[1:]  # 1 - t_{k-1}/t_k: the variance of Z_k given Z_{k-1}
    h = min(0.02, float(np.sqrt(gaps.min())) / 10) if len(t) > 1 else 0.02

    def grid(c: float) -> tuple[np.ndarray, np.ndarray]:
        c = min(c, 12.0)  # beyond: no mass worth integrating
        n = 2 * int(math.ceil(c / h)) + 1
        z = np.linspace(-c, c, n)
        w = np.ones(n)
        w[1:-1:2], w[2:-1:2] = 4, 2
        return z, w * (z[1] - z[0]) / 3

    bounds = [float(stats.norm.isf(spent[0] / 2)) if spent[0] > 0 else math.inf]
    z, w = grid(bounds[0])
    mass = w * stats.norm.pdf(z)  # continuation density x quadrature weights
    for k in range(1, len(t)):
        r = t[k - 1] / t[k]
        mu, s = z * math.sqrt(r), math.sqrt(1 - r)
        target = spent[k] - spent[k - 1]

        def crossing(c: float) -> float:
            return float(mass @ (stats.norm.cdf((-c - mu) / s) + stats.norm.cdf((mu - c) / s))) - target

        c = math.inf if target <= 1e-15 else float(optimize.brentq(crossing, 0.0, 40.0, xtol=1e-10))
        bounds.append(c)
        z, w = grid(c)
        mass = w * (stats.norm.pdf((z[:, None] - mu[None]) / s) / s @ mass)
    return tuple(bounds)


def nominal_levels(fractions: Sequence[float], alpha: float) -> list[float]:
    """The two-sided nominal significance level of each look, ``2 (1 - Phi(c_k))``, for the spending
    function at total ``alpha`` and information fractions ``0 < t_1 < ... < t_K <= 1`` (cached)."""
    key = tuple(round(float(f), 12) for f in fractions)
    if not key or key[0] <= 0 or key[-1] > 1 or any(b <= a for a, b in zip(key, key[1:])):
        raise ValueError(f"information fractions must increase within (0, 1], not {list(fractions)}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), not {alpha}")
    return list(_levels(key, round(float(alpha), 15)))


@lru_cache(maxsize=4096)
def _levels(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    return tuple(2.0 * float(special.ndtr(-c)) for c in _boundaries(fractions, alpha))


T_PATHS = 2 ** 20  # null sequences of the Monte Carlo that places the t boundaries (`t_levels`)
T_SEED = 20261205  # its fixed seed: the boundaries, and so every decision, are the same on every run


@lru_cache(maxsize=8)
def _null_t(sizes: tuple[int, ...]) -> np.ndarray:
    """The one-sample t statistic after each look's seeds, over `T_PATHS` sequences of standard normal differences
    (the null; t does not depend on the SD): [paths, looks], drawn in blocks of paths (the same draws as one array)."""
    rng = np.random.default_rng(T_SEED)
    idx = np.array(sizes) - 1
    n = np.array(sizes, dtype=float)
    out = np.empty((T_PATHS, len(sizes)))
    block = 2 ** 16
    for start in range(0, T_PATHS, block):
        d = rng.standard_normal((block, sizes[-1]))
        mean = np.cumsum(d, 1)[:, idx] / n
        var = (np.cumsum(d * d, 1)[:, idx] - n * mean * mean) / (n - 1)
        out[start:start + block] = mean / np.sqrt(var / n)
    return out


def t_levels(sizes: Sequence[int], alpha: float, sides: int = 1) -> list[float]:
    """The nominal level of the paired t-test at each look after ``sizes`` seeds, one-sided (``sides=1``: the
    p of ``t`` in the pre-registered direction) or two-sided (``|t|``), from exact t boundaries (Jennison & Turnbull
    1991, Biometrika 78:133-141): the boundary at look k is placed so that the null's chance of first crossing there
    is what the spending function (`spending`, information ``n_k / n_K``) allots to it, the joint law of the t
    statistics taken from a seeded Monte Carlo of `T_PATHS` null sequences. Normal levels (`nominal_levels`)
    applied to t at 2-5 degrees of freedom spend more than ``alpha`` (benchmarks/sequential_fwer.py)."""
    key = tuple(int(s) for s in sizes)
    if not key or key[0] < 2 or any(b <= a for a, b in zip(key, key[1:])):
        raise ValueError(f"look sizes must increase from at least 2 seeds, not {list(sizes)}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), not {alpha}")
    if sides not in (1, 2):
        raise ValueError(f"sides must be 1 or 2, not {sides}")
    return [float(alpha)] if len(key) == 1 else list(_t_levels(key, round(float(alpha), 15), sides))


TAIL_ALPHA = 0.05  # levels up to this total are placed on the paths that could cross at it (`_tail_t`)


@lru_cache(maxsize=16)
def _tail_t(sizes: tuple[int, ...], sides: int) -> np.ndarray:
    """The null paths of `_null_t` (``|t|`` when two-sided) that could cross a boundary of a total level up to
    `TAIL_ALPHA`: a boundary at look k is at least the ``TAIL_ALPHA * T_PATHS``-th largest value there (no more paths
    than that cross in all), so paths below it at every look never cross, nor change which boundary is placed."""
    t = _null_t(sizes)
    t = np.abs(t) if sides == 2 else t
    top = int(TAIL_ALPHA * len(t))
    floor = np.partition(t, len(t) - top, axis=0)[len(t) - top]
    return t[(t >= floor).any(1)]


@lru_cache(maxsize=4096)
def _t_levels(sizes: tuple[int, ...], alpha: float, sides: int) -> tuple[float, ...]:
    if alpha <= TAIL_ALPHA:
        t = _tail_t(sizes, sides)
    else:
        t = np.abs(_null_t(sizes)) if sides == 2 else _null_t(sizes)
    alive = np.ones(len(t), dtype=bool)
    crossed, levels = 0, []
    for k, n in enumerate(sizes):
        due = int(round(spending(n / sizes[-1], alpha) * T_PATHS)) - crossed  # paths this look may reject
        if due < 1:
            levels.append(0.0)
            continue
        values = t[alive, k]
        c = float(np.partition(values, len(values) - due)[len(values) - due])  # the due-th largest t (|t|)
        hit = alive & (t[:, k] >= c)
        crossed += int(hit.sum())
        alive &= ~hit
        levels.append(float(sides * special.stdtr(n - 1, -c)))
    return tuple(levels)


def p_value(d: Sequence[float]) -> float:
    """Two-sided one-sample t-test of the differences ``d`` against 0 (= `vlkit.stats.paired.paired_p_value`): NaN
    with fewer than 2 differences or none with spread, rounding aside."""
    p = p_upper(d)
    return math.nan if math.isnan(p) else 2.0 * min(p, 1.0 - p)


def upper_p(e: np.ndarray) -> np.ndarray:
    """One-sided one-sample t-test of each row of ``e`` [..., n] against 0, alternative: mean above 0; NaN for a row
    with fewer than 2 values or none with spread, rounding aside (all within ``1e-9`` relative, ``1e-12`` absolute, of
    the first: the t statistic is undefined there, not infinitely sure)."""
    e = np.asarray(e, dtype=float)
    n = e.shape[-1]
    if n < 2:
        return np.full(e.shape[:-1], np.nan)
    first = e[..., :1]
    flat = (np.abs(e - first) <= np.maximum(1e-9 * np.maximum(np.abs(e), np.abs(first)), 1e-12)).all(-1)
    mean = e.mean(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = special.stdtr(n - 1, -mean / e.std(-1, ddof=1) * math.sqrt(n))
    return np.where(flat, np.nan, p)


def p_upper(e: Sequence[float]) -> float:
    """`upper_p` of one sequence of differences."""
    return float(upper_p(np.asarray(e, dtype=float)[None])[0])


SIGN_FLIP_EXACT = 16  # up to this many differences the sign-flip test enumerates every sign pattern
SIGN_FLIP_DRAWS = 2 ** 16  # beyond: this many seeded random patterns (a valid permutation p, (1 + hits) / (1 + draws))
SIGN_FLIP_BLOCK = 2 ** 22  # rows x patterns summed at once


@lru_cache(maxsize=64)
def sign_patterns(n: int) -> np.ndarray:
    """The sign patterns of the sign-flip test over ``n`` differences: all ``2^n``, or `SIGN_FLIP_DRAWS` seeded ones."""
    if n <= SIGN_FLIP_EXACT:
        return 1.0 - 2.0 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
    return np.random.default_rng(T_SEED).choice([-1.0, 1.0], size=(SIGN_FLIP_DRAWS, n))


def sign_flip_ps(e: np.ndarray) -> np.ndarray:
    """Exact one-sided sign-flip (paired permutation) p of the sum of each row of ``e`` [rows, n] (alternative: above
    0): the share of sign patterns whose sum of ``±|e_i|`` reaches the observed one. Valid whenever each difference
    is symmetric about 0 under the null, whatever its law; its smallest value is ``2^-n`` (`sign_flip_floor`)."""
    e = np.asarray(e, dtype=float)
    signs = sign_patterns(e.shape[-1])
    hits = np.empty(len(e))
    step = max(1, SIGN_FLIP_BLOCK // len(signs))
    for i in range(0, len(e), step):
        block = e[i:i + step]
        reach = block.sum(-1, keepdims=True) - 1e-12 * np.maximum(1.0, np.abs(block).sum(-1, keepdims=True))
        hits[i:i + step] = (np.abs(block) @ signs.T >= reach).sum(-1)
    return hits / len(signs) if e.shape[-1] <= SIGN_FLIP_EXACT else (1 + hits) / (1 + len(signs))


def sign_flip_p(e: Sequence[float]) -> float:
    """`sign_flip_ps` of one sequence of differences; NaN for none."""
    return float(sign_flip_ps(np.asarray(e, dtype=float)[None])[0]) if len(e) else math.nan


def sign_flip_floor(n: int) -> float:
    """The smallest one-sided sign-flip p over ``n`` differences, ``2^-n`` (``1 / (1 + draws)`` when drawn)."""
    return 2.0 ** -n if n <= SIGN_FLIP_EXACT else 1.0 / (1 + SIGN_FLIP_DRAWS)


def sign_flip_seeds(level: float) -> int:
    """The fewest differences at which the one-sided sign-flip test can reach ``level`` (``2^-n <= level``)."""
    return max(2, math.ceil(-math.log2(level) - 1e-12))


# A claim's kind -> its one-sided tests, each ``(sign, shift)`` testing ``sign (d - shift margin) > 0`` on the
# differences d = a - b; several tests are an intersection-union test (each must pass: TOST). "opposite": the
# test that contradicts the claim, when the design pre-registers it.
KINDS = {"higher": ((1, 0),), "lower": ((-1, 0),), "not_higher": ((-1, 1),), "equivalent": ((-1, 1), (1, -1))}
OPPOSITE = {"higher": ((-1, 0),), "lower": ((1, 0),), "not_higher": ((1, 1),)}


def one_sided_tests(kind: str, margin: float, opposite: bool) -> tuple[tuple[int, float], ...]:
    table = OPPOSITE if opposite else KINDS
    if kind not in table:
        raise ValueError(f"kind {kind!r}: one of {sorted(table)}" + (" (a contradiction test)" if opposite else ""))
    if kind in ("not_higher", "equivalent") and not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"kind {kind!r} needs a positive margin, not {margin!r}")
    return tuple((sign, shift * margin) for sign, shift in table[kind])


def hypothesis_test(d: Sequence[float], kind: str = "higher", margin: float = 0.0, opposite: bool = False
                    ) -> dict[str, float]:
    """One claim's test on its differences ``d``: ``p`` the one-sided t-test's p in the claim's direction (TOST:
    the larger of the two), ``sign_flip_p`` the same test's exact sign-flip p, ``sign_flip_floor`` the smallest
    sign-flip p these seeds allow; ``opposite``: the test that would contradict the claim."""
    tests = one_sided_tests(kind, margin, opposite)
    shifted = [[sign * (float(x) - shift) for x in d] for sign, shift in tests]
    ps = [p_upper(e) for e in shifted]
    return {"p": math.nan if any(math.isnan(p) for p in ps) else max(ps),
            "sign_flip_p": max(sign_flip_p(e) for e in shifted) if len(d) else math.nan,
            "sign_flip_floor": sign_flip_floor(len(d)) if len(d) else math.nan}


def decides(test: dict[str, float], level: float) -> bool:
    """The rule's decision at a nominal ``level``: the t-test's p reaches it and, where the sign-flip test could
    reach it (``2^-n <= level``), the sign-flip p does too (a decision the sign-flip test could not check stands on
    the t-test alone: parametric-only)."""
    return test["p"] <= level and (test["sign_flip_p"] <= level or test["sign_flip_floor"] > level)


def _entry(state: str, look: int, n: int, test: dict[str, float], level: float, alpha: float, d: Sequence[float],
           direction: int = 0) -> dict[str, Any]:
    return {"state": state, "look": look, "n": n, **test, "level": level, "alpha": alpha,
            "effect": float(np.mean(d[:n])) if n else math.nan, "direction": direction,
            "parametric_only": bool(direction and test["sign_flip_floor"] > level)}


def sequential_claims(diffs: Sequence[Sequence[float]], sizes: Sequence[int] | None, alpha: float = 0.05,
                      kinds: Sequence[str] | None = None, margins: Sequence[float] | None = None,
                      contradict: Sequence[bool] | None = None) -> list[dict[str, Any]]:
    """Replay the looks ``sizes`` over each claim's paired differences ``a - b`` (seed order), with the graphical
    Holm procedure over the claims' hypotheses (``sizes=None``: one look at each claim's own seeds, Holm's
    procedure). Each claim's hypothesis is one-sided in its pre-registered direction (``kinds``: `KINDS`, default
    ``higher``; ``not_higher`` / ``equivalent`` against ``margins``, TOST for ``equivalent``); a claim with
    ``contradict`` adds the opposite test as a hypothesis of its own with its own share of ``alpha``. Every
    hypothesis starts at ``alpha / (number of hypotheses)``; a decision passes the decided hypothesis's local
    level on to the open hypotheses of other claims (a decided claim's other hypothesis keeps its own).

    Per claim: ``state`` ``decided`` (at ``look``, frozen there), ``inconclusive`` (tested at the last look, not
    decided) or ``running`` (a look waits for seeds: it is processed only when every undecided claim has its seeds);
    ``look`` (1-based; 0: none), ``n``, ``p`` / ``sign_flip_p`` / ``sign_flip_floor`` (`hypothesis_test` of the claim
    on the first ``n``; NaN: untestable, never decided), ``level`` (nominal level compared with), ``alpha`` (local
    level then), ``effect`` (mean of the first ``n``), ``direction`` (1: decided as claimed, -1: contradicted, 0:
    undecided), ``parametric_only`` (decided where the sign-flip test could not reach the level: `decides`)."""
    m = len(diffs)
    if sizes is not None:
        sizes = [int(s) for s in sizes]
        if not sizes or sizes[0] < 2 or any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise ValueError(f"look sizes must increase from at least 2 seeds, not {sizes}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), not {alpha}")
    kinds = list(kinds or ["higher"] * m)
    margins = list(margins or [0.0] * m)
    contradict = list(contradict or [False] * m)
    hyps = [(i, False) for i in range(m)] + [(i, True) for i in range(m) if contradict[i]]
    for i, opposite in hyps:
        one_sided_tests(kinds[i], margins[i], opposite)  # a bad kind or margin fails before any test
    if not m:
        return []
    local = [alpha / len(hyps)] * len(hyps)
    blank = {"p": math.nan, "sign_flip_p": math.nan, "sign_flip_floor": math.nan}
    out = [_entry("running", 0, 0, blank, math.nan, local[h], diffs[i]) for h, (i, _) in enumerate(hyps[:m])]
    looks = sizes or [None]
    for k, size in enumerate(looks):
        open_ = [h for h, (i, _) in enumerate(hyps) if out[i]["state"] != "decided"]
        n = {h: size or len(diffs[hyps[h][0]]) for h in open_}
        if not open_ or any(len(diffs[hyps[h][0]]) < n[h] for h in open_):
            return out  # all decided, or waiting for seeds: undecided claims stay running
        tests = {h: hypothesis_test(diffs[i][:n[h]], kinds[i], margins[i], opp) for h, (i, opp) in
                 ((h, hyps[h]) for h in open_)}
        levels: dict[int, float] = {}
        while open_:
            levels = {h: (t_levels(sizes, local[h])[k] if sizes else local[h]) for h in open_}
            hits = [h for h in open_ if decides(tests[h], levels[h])]
            if not hits:
                break
            done = set()
            for h in hits:
                i, opp = hyps[h]
                if i not in done:
                    done.add(i)
                    out[i] = _entry("decided", k + 1, n[h], tests[h], levels[h], local[h], diffs[i], -1 if opp else 1)
            open_ = [h for h in open_ if hyps[h][0] not in done]
            if open_:
                share = sum(local[h] for h in hits) / len(open_)
                for h in open_:
                    local[h] += share
        state = "inconclusive" if k == len(looks) - 1 else "running"
        for h in open_:
            i, opp = hyps[h]
            if not opp:
                out[i] = _entry(state, k + 1, n[h], tests[h], levels[h], local[h], diffs[i])
    return out


def paired_power(effect: float, sd: float, n: int, alpha: float, sides: int = 2) -> float:
    """Power of the paired t-test at level ``alpha`` over ``n`` seeds when the differences have mean ``effect`` and
    SD ``sd`` (noncentral t, noncentrality ``effect sqrt(n) / sd``): two-sided (``sides=2``, either sign) or
    one-sided (``sides=1``, the alternative: ``effect > 0``); NaN below 2 seeds."""
    if n < 2 or not (math.isfinite(effect) and math.isfinite(sd)) or sd < 0:
        return math.nan
    if sd == 0:
        return (1.0 if effect > 0 or (sides == 2 and effect != 0) else 0.0) if effect != 0 else math.nan
    df, nc = n - 1, (abs(effect) if sides == 2 else effect) * math.sqrt(n) / sd
    crit = stats.t.isf(alpha / sides, df)
    wrong_tail = float(stats.nct.cdf(-crit, df, nc)) if sides == 2 else 0.0  # scipy: NaN where it is below ~1e-13
    return float(stats.nct.sf(crit, df, nc)) + (wrong_tail if math.isfinite(wrong_tail) else 0.0)


def seeds_for_power(effect: float, sd: float, alpha: float, power: float = 0.8, max_n: int = 1000, sides: int = 2
                    ) -> int | None:
    """The fewest seeds (>= 2) whose paired t-test reaches ``power`` (`paired_power`), by doubling then
    bisection; None when ``effect`` is 0 or NaN (one-sided: not above 0), ``sd`` NaN, or more than ``max_n`` seeds
    would be needed."""
    if not (math.isfinite(effect) and math.isfinite(sd)) or effect == 0 or sd < 0 or (sides == 1 and effect < 0):
        return None
    if sd == 0:
        return 2
    enough = lambda n: paired_power(effect, sd, n, alpha, sides) >= power  # noqa: E731
    low, high = 1, 2  # enough(low) is False (1 seed: no test)
    while not enough(high):
        if high >= max_n:
            return None
        low, high = high, min(2 * high, max_n)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


__all__ = ["KINDS", "OPPOSITE", "decides", "hypothesis_test", "look_sizes", "nominal_levels", "one_sided_tests",
           "p_upper", "p_value", "paired_power", "seeds_for_power", "sequential_claims", "sign_flip_floor",
           "sign_flip_p", "sign_flip_ps", "sign_flip_seeds", "sign_patterns", "spending", "t_levels", "upper_p"]
