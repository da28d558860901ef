"""The group-sequential claims rule (`vlkit.stats.sequential.sequential_claims`) over many simulated comparisons at
once, vectorised in numpy: its family-wise error and power (benchmarks/sequential_fwer.py) and the expected seeds of
a design at stated effects (the dry run of ``compare.until=decided``). Same decisions as the rule itself
(tests/compare/test_sequential.py checks them against each other)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from vlkit.stats.sequential import one_sided_tests, sign_flip_floor, sign_flip_ps, t_levels, upper_p


def simulate_claims(diffs: np.ndarray, sizes: Sequence[int], alpha: float = 0.05,
                    kinds: Sequence[str] | None = None, margins: Sequence[float] | None = None,
                    contradict: Sequence[bool] | None = None, sign_flip: bool = True
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`sequential_claims` over ``diffs`` [comparisons, claims, seeds >= sizes[-1]]: returns ``direction``
    [comparisons, claims] (1 decided as claimed, -1 contradicted, 0 undecided), ``look`` (0-based index of the
    deciding look, ``len(sizes) - 1`` when undecided) and ``parametric_only`` (decided where the sign-flip test could
    not reach the level). ``sign_flip=False``: the t-test alone decides (the rule without its sign-flip check).

    Every open hypothesis of a comparison holds the same local level (all start at ``alpha / H`` and a decision's
    level is split equally among the open ones), so each round needs one level per comparison."""
    diffs = np.asarray(diffs, dtype=float)
    sims, m, _ = diffs.shape
    kinds = list(kinds or ["higher"] * m)
    margins = list(margins or [0.0] * m)
    contradict = list(contradict or [False] * m)
    hyps = [(i, False) for i in range(m)] + [(i, True) for i in range(m) if contradict[i]]
    tests = [one_sided_tests(kinds[i], margins[i], opp) for i, opp in hyps]
    owner = np.array([i for i, _ in hyps])
    against = np.array([opp for _, opp in hyps])
    n_h = len(hyps)
    direction = np.zeros((sims, m), dtype=int)
    look = np.full((sims, m), len(sizes) - 1)
    parametric = np.zeros((sims, m), dtype=bool)
    open_ = np.ones((sims, n_h), dtype=bool)
    local = np.full(sims, alpha / n_h)
    levels_of: dict[float, list[float]] = {}
    for k, n in enumerate(sizes):
        shifted = [[sign * (diffs[:, i, :n] - shift) for sign, shift in tests[h]] for h, (i, _) in enumerate(hyps)]
        p = np.stack([np.max(np.stack([upper_p(e) for e in es]), 0) for es in shifted], 1)  # [sims, H]
        p = np.where(np.isnan(p), np.inf, p)
        sf = np.full((sims, n_h), np.nan)
        floor = sign_flip_floor(n)
        while True:
            keys = np.round(local, 15)
            level = np.empty(sims)
            for a in np.unique(keys[open_.any(1)]):
                if a not in levels_of:
                    levels_of[a] = t_levels(sizes, float(a))
                level[keys == a] = levels_of[a][k]
            level[~open_.any(1)] = -1.0
            cand = open_ & (p <= level[:, None])
            check = cand & (floor <= level[:, None]) if sign_flip else np.zeros_like(cand)
            todo = check & np.isnan(sf)
            for h in np.flatnonzero(todo.any(0)):
                rows = np.flatnonzero(todo[:, h])
                sf[rows, h] = np.max(np.stack([sign_flip_ps(e[rows]) for e in shifted[h]]), 0)
            hits = cand & (~check | (sf <= level[:, None]))
            if not hits.any():
                break
            before = open_.sum(1)
            for h in range(n_h):  # the claim's first hit decides it (its primary hypothesis first)
                rows = np.flatnonzero(hits[:, h] & (direction[:, owner[h]] == 0))
                direction[rows, owner[h]] = -1 if against[h] else 1
                look[rows, owner[h]] = k
                parametric[rows, owner[h]] = ~check[rows, h]
            closed = (direction[:, owner] != 0)
            n_hits = hits.sum(1)
            open_ &= ~closed
            after = open_.sum(1)
            grow = after > 0
            local[grow] = local[grow] * (after[grow] + n_hits[grow]) / after[grow]
            if not (before > after).any():
                break
    return direction, look, parametric


def final_seeds(look: np.ndarray, sizes: Sequence[int], claim_runs: Sequence[Sequence[int]], runs: int,
                initial: int) -> np.ndarray:
    """Seeds each run ends with [comparisons, runs]: the look that decides the last claim reading it (``initial``
    for a run no claim reads); ``claim_runs[c]``: the runs claim c reads."""
    at = np.asarray(sizes)[look]
    out = np.full((look.shape[0], runs), initial)
    for c, reads in enumerate(claim_runs):
        for r in reads:
            out[:, r] = np.maximum(out[:, r], at[:, c])
    return out


__all__ = ["final_seeds", "simulate_claims"]
