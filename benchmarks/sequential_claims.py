"""Seeds until decided: the group-sequential claims rule (`vlkit.stats.sequential`) against the fixed design
(a two-sided paired t-test at ``max_seeds`` with Holm over the claims), simulated; no training.

Each simulated comparison has 11 claims; every claim's paired differences ``a - b`` are drawn for
``max_seeds`` seeds at once (seeded numpy Generator) and the rule is applied look by look, vectorised over
comparisons; the vectorised rule is checked against `sequential_claims` on ``--check`` comparisons of every
scenario and design. Designs: looks ``look_sizes(initial, max_seeds, 1)`` (3, 4, 5, 6) and
``look_sizes(initial, max_seeds, 3)`` (3, 6), and the fixed design at ``max_seeds``. Scenarios:

    a  global null, normal differences
    b2 global null with UNITER's ITM "take-off": the two runs are interchangeable, and in each, per seed, the
       pre-training takes off with probability 0.25 (+35 points, within-mode SD 6): differences +35 / 0 / -35,
       symmetric, the null a "no difference" claim states
    b  (a limit, not a null of the claims) the take-off in one run only, shifted to mean 0: skewed differences of
       equal means, which no test of the mean over 6 seeds keeps at alpha, the fixed design included
    c  alternatives, normal: all 11 claims at effect / SD 0.5, 1, 1.5, 2, 3
    d  the take-off mixture with mean +30 points (UNITER's Meta-Sum lead: +29 / +36 / +25 / +64 over 4 seeds)
    a+ scenario a again over ``--null-sims`` comparisons (200,000): the FWER to a tenth of a point
    e  the power formula: fixed design at n = 3..6, one claim at effect / SD 1..4 among 10 null ones;
       `paired_power(effect, sd, n, alpha / 11)` against the simulated power of that claim under Holm

Reported per scenario and design: family-wise false decisions (any decision on a null claim, with its
Monte Carlo standard error), per-claim power (decisions in the true direction) and wrong-direction
decisions, mean seeds per claim (at its decision, ``max_seeds`` when undecided) and per comparison
(every run gets the seeds of the last look the comparison needs: the look deciding its last claim).

    OMP_NUM_THREADS=1 python benchmarks/sequential_claims.py [--sims 20000] [--seed 0] [--check 50]

Prints tables, writes benchmarks/results/sequential_claims.json.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import numpy as np
import scipy
from scipy import special

from vlkit.stats.sequential import look_sizes, nominal_levels, paired_power, sequential_claims, t_levels
from vlkit.io import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results" / "sequential_claims.json"
CLAIMS = 11
ALPHA = 0.05
TAKEOFF = {"p": 0.25, "jump": 35.0, "sd": 6.0}
EFFECTS = (0.5, 1.0, 1.5, 2.0, 3.0)
BIMODAL_MEAN = 30.0


def draw(rng: np.random.Generator, scenario: str, sims: int, seeds: int, effect: float = 0.0) -> np.ndarray:
    """Paired differences [sims, claims, seeds] of a scenario."""
    shape = (sims, CLAIMS, seeds)
    if scenario == "normal":
        return rng.normal(effect, 1.0, shape)
    takeoff = TAKEOFF["jump"] * (rng.random(shape) < TAKEOFF["p"])
    if scenario == "takeoff":  # skewed, mean `effect`
        return takeoff + rng.normal(effect - TAKEOFF["p"] * TAKEOFF["jump"], TAKEOFF["sd"], shape)
    if scenario == "takeoff_both":  # each run takes off on its own: symmetric differences
        return takeoff - TAKEOFF["jump"] * (rng.random(shape) < TAKEOFF["p"]) + rng.normal(effect, TAKEOFF["sd"], shape)
    raise ValueError(scenario)


def p_values(d: np.ndarray, sizes: list[int]) -> np.ndarray:
    """Two-sided one-sample t-test p of the first n differences at each look: [sims, claims, looks]."""
    n = np.array(sizes, dtype=float)
    s1, s2 = np.cumsum(d, -1)[..., n.astype(int) - 1], np.cumsum(d * d, -1)[..., n.astype(int) - 1]
    mean = s1 / n
    var = np.maximum(s2 - n * mean * mean, 0.0) / (n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(mean) / np.sqrt(var / n)
    p = 2.0 * special.stdtr(n - 1, -t)
    return np.where(var > 1e-20 * np.maximum(mean * mean, 1e-300), p, np.nan)


def normal_levels(sizes: list[int], alpha: float) -> list[float]:
    """The normal boundaries' nominal levels applied to t (the significance level approach), for comparison."""
    return nominal_levels([s / sizes[-1] for s in sizes], alpha)


def decide(d: np.ndarray, sizes: list[int], alpha: float = ALPHA, levels=t_levels) -> np.ndarray:
    """The graphical Holm rule of `sequential_claims`, vectorised over comparisons: the 1-based look at which
    each claim is decided (0: never). All claims start at alpha / m; with equal splitting every undecided
    claim's local level is alpha / (number undecided). ``levels``: the rule's exact t boundaries, or
    `normal_levels`."""
    p = p_values(d, sizes)
    table = np.array([[0.0] * len(sizes)] + [levels(sizes, alpha / u) for u in range(1, CLAIMS + 1)])
    at = np.zeros(d.shape[:2], dtype=int)
    for k in range(len(sizes)):
        while True:
            open_ = at == 0
            level = table[open_.sum(1), k]
            hit = open_ & (p[..., k] <= level[:, None])
            if not hit.any():
                break
            at[hit] = k + 1
    return at


def summarise(d: np.ndarray, sizes: list[int], at: np.ndarray, null: np.ndarray, sign: np.ndarray) -> dict:
    """FWER over null claims, power / wrong direction over the others, seeds per claim and per comparison."""
    n_at = np.array([sizes[-1], *sizes])[at]  # undecided: max seeds
    cums = np.cumsum(d, -1)
    mean_at = np.take_along_axis(cums, (n_at - 1)[..., None], -1)[..., 0] / n_at
    direction = np.where(at > 0, np.sign(mean_at), 0)
    sims = d.shape[0]
    out = {"looks": sizes, "sims": sims, "seeds_per_claim": float(n_at.mean()),
           "seeds_per_comparison": float(n_at.max(1).mean())}
    if null.any():
        fwer = float((at[:, null] > 0).any(1).mean())
        out.update(fwer=fwer, fwer_se=math.sqrt(fwer * (1 - fwer) / sims),
                   per_null_claim=float((at[:, null] > 0).mean()))
    if (~null).any():
        out.update(power=float((direction[:, ~null] == sign[~null]).mean()),
                   wrong_direction=float((direction[:, ~null] == -sign[~null]).mean()))
    return out


def check(d: np.ndarray, sizes: list[int], at: np.ndarray) -> int:
    """Comparisons where the vectorised rule and `sequential_claims` disagree (decided look or state)."""
    bad = 0
    for diffs, looks in zip(d, at):
        ref = sequential_claims(diffs.tolist(), sizes, ALPHA)
        want = [o["look"] if o["state"] == "decided" else 0 for o in ref]
        states_ok = all(o["state"] in ("decided", "inconclusive") for o in ref)
        bad += int(want != looks.tolist() or not states_ok)
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=20000, help="simulated comparisons per scenario (>= 10,000)")
    ap.add_argument("--null-sims", type=int, default=200000, help="comparisons of the precise null row (a+)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--initial", type=int, default=3)
    ap.add_argument("--max-seeds", type=int, default=6)
    ap.add_argument("--check", type=int, default=50, help="comparisons per scenario and design replayed by "
                                                            "sequential_claims")
    args = ap.parse_args()
    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    designs = {"sequential, round 1": look_sizes(args.initial, args.max_seeds, 1),
               "sequential, round 3": look_sizes(args.initial, args.max_seeds, 3),
               "fixed, Holm": [args.max_seeds]}
    scenarios = [("a", "null, normal", "normal", 0.0), ("b", "null, take-off (skewed)", "takeoff", 0.0),
                 ("b2", "null, take-off in either run", "takeoff_both", 0.0),
                 *[("c", f"normal, effect/SD {e:g}", "normal", e) for e in EFFECTS],
                 ("d", f"take-off, mean +{BIMODAL_MEAN:g}", "takeoff", BIMODAL_MEAN),
                 ("a+", f"null, normal, {args.null_sims:,} comparisons", "normal", 0.0)]
    rows, mismatches, checked = [], 0, 0
    for key, label, kind, effect in scenarios:
        d = draw(rng, kind, args.null_sims if key == "a+" else args.sims, args.max_seeds, effect)
        null = np.full(CLAIMS, effect == 0.0)
        sign = np.full(CLAIMS, np.sign(effect))
        for design, sizes in designs.items():
            at = decide(d, sizes)
            mismatches += check(d[:args.check], sizes, at[:args.check])
            checked += min(args.check, len(d))
            rows.append({"scenario": key, "label": label, "design": design, **summarise(d, sizes, at, null, sign)})
        if key in ("a", "a+"):  # why exact t boundaries: the normal ones spend more than alpha on t
            sizes = designs["sequential, round 1"]
            at = decide(d, sizes, levels=normal_levels)
            rows.append({"scenario": key, "label": label, "design": "sequential, round 1, normal levels",
                         **summarise(d, sizes, at, null, sign)})
    sd_mix = math.sqrt(TAKEOFF["sd"] ** 2 + TAKEOFF["jump"] ** 2 * TAKEOFF["p"] * (1 - TAKEOFF["p"]))
    formula = []  # (e): one claim with an effect among 10 null ones, the fixed design at n seeds
    for n in range(args.initial, args.max_seeds + 1):
        for effect in (1.0, 2.0, 3.0, 4.0):
            d = rng.normal(0.0, 1.0, (args.sims, CLAIMS, n))
            d[:, 0] += effect
            at = decide(d, [n])
            simulated = float((at[:, 0] > 0).mean())
            formula.append({"n": n, "effect_sd": effect, "simulated": simulated,
                            "formula": paired_power(effect, 1.0, n, ALPHA / CLAIMS),
                            "se": math.sqrt(simulated * (1 - simulated) / args.sims)})
    max_diff = max(abs(r["simulated"] - r["formula"]) for r in formula) * 100
    seconds = time.perf_counter() - start

    def pct(r: dict, key: str) -> str:
        if key not in r:
            return "–"
        return f"{100 * r[key]:.2f}" + (f" ± {100 * r[key + '_se']:.2f}" if key + "_se" in r else "")

    print(f"{CLAIMS} claims, {args.sims:,} comparisons per scenario (a+: {args.null_sims:,}), seed {args.seed}, "
          f"alpha {ALPHA}; looks {designs}")
    print("| scenario | design | FWER % (± MC SE) | power % | wrong direction % | seeds / claim | "
          "seeds / comparison |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scenario']} {r['label']} | {r['design']} | {pct(r, 'fwer')} | {pct(r, 'power')} | "
              f"{pct(r, 'wrong_direction')} | {r['seeds_per_claim']:.2f} | {r['seeds_per_comparison']:.2f} |")
    print(f"take-off mixture SD {sd_mix:.1f} points: scenario d's effect / SD = {BIMODAL_MEAN / sd_mix:.2f}")
    print("\n(e) power of one claim among 11, fixed design, Holm: simulated vs paired_power(effect, 1, n, 0.05/11)")
    print("| n | " + " | ".join(f"effect/SD {e:g}" for e in (1, 2, 3, 4)) + " |")
    print("|---|---|---|---|---|")
    for n in range(args.initial, args.max_seeds + 1):
        cells = [f"{100 * r['simulated']:.1f} vs {100 * r['formula']:.1f}" for r in formula if r["n"] == n]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print(f"max |simulated - formula|: {max_diff:.2f} points; vectorised rule vs sequential_claims: "
          f"{mismatches} mismatches in {checked} comparisons; {seconds:.0f} s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS, json.dumps({
        "inputs": {"sims": args.sims, "null_sims": args.null_sims, "seed": args.seed, "claims": CLAIMS, "alpha": ALPHA,
                   "initial": args.initial, "max_seeds": args.max_seeds, "designs": designs, "takeoff": TAKEOFF,
                   "effects": EFFECTS, "bimodal_mean": BIMODAL_MEAN, "check": args.check},
        "rows": rows, "power_formula": {"cells": formula, "max_abs_diff_points": max_diff,
                                        "within_5_points": max_diff <= 5},
        "takeoff_sd": sd_mix, "check": {"comparisons": checked, "mismatches": mismatches},
        "seconds": seconds, "numpy": np.__version__, "scipy": scipy.__version__,
        "machine": platform.processor() or platform.machine()}, indent=1))


if __name__ == "__main__":
    main()
