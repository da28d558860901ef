"""Family-wise error and power of the claims rule (`vlkit.stats.sequential`: one-sided exact-t group-sequential tests,
non-superiority / TOST claims, the sign-flip check, graphical Holm over the claims), simulated; no training.

Every simulated comparison has 11 claims whose paired differences ``a - b`` are drawn for all seeds at once (seeded
numpy Generator) and decided look by look by `vlkit.stats.simulate.simulate_claims`, which `--check` comparisons
replay through `sequential_claims` itself. Designs (looks): ``6``: 3, 4, 5, 6 (``compare.max_seeds=6``, one seed a
round); ``9``: 3, 4, ..., 9 (from 8 seeds the sign-flip test can reach 0.05 / 11). Rows:

    null    all 11 claims null (``expect: higher``, true mean 0): any decision is a family-wise error
            normal; symmetric heavy-tailed (t with 3 df, Laplace; take-off in either run: both runs may take off,
            symmetric differences); skewed with equal means: exponential, lognormal (sigma 1), and the take-off fitted
            to this project's UNITER seeds, each with its long tail in the claimed direction ("right": the run the
            claim favours is the one that can take off) or against it ("left": only b can take off)
            ``t alone``: the same draws decided by the t-test without the sign-flip check
    mixture 4 true claims (effect / SD 2), 3 null superiority claims, 2 non-superiority (kind not_higher) and 2
            equivalence (TOST) claims at their null's edge (true a - b = the margin, 1 SD): errors among the 7 nulls
    power   all 11 claims at effect / SD 1, 2, 3: one-sided (the design) against two-sided (every claim with its
            contradiction test pre-registered, alpha split over 22 hypotheses: the old two-sided design's levels)
    seeds   the take-off against the claim (left), looks every 3 seeds up to 12, 21, 30: from how many seeds
            the rule keeps the family-wise error at 0.05
    formula one claim among 11 at effect / SD 1..4, fixed design at n = 3..6 (Holm): the one-sided power formula
            `paired_power(effect, 1, n, 0.05 / 11, sides=1)` against its simulated power

The fitted take-off: UNITER's Meta-Sum lead over scratch per seed in this project's claims comparison at 4 seeds
(docs/compare-claims.md, commit 645c1b9): +29.1, +36.4, +24.8 and +64.4; seed 3's pre-training took off (held-out ITM
accuracy 90.8 against 77.8-79.1). A two-mode fit: take-off probability 1/4 (1 seed of 4), jump 64.4 - mean(29.1,
36.4, 24.8) = 34.3 points, within-mode SD 5.86 (the SD of the three others); the t statistic depends only on
jump / SD = 5.85 and the probability. Each figure with its Monte Carlo standard error; "controlled": within two
standard errors of 0.05 or below.

    OMP_NUM_THREADS=1 python benchmarks/sequential_fwer.py [--sims 20000] [--seed 0] [--check 200]

Prints tables, writes benchmarks/results/sequential_fwer.json.
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

from vlkit.io import atomic_write_text
from vlkit.stats.sequential import paired_power, sequential_claims
from vlkit.stats.simulate import simulate_claims

RESULTS = Path(__file__).resolve().parent / "results" / "sequential_fwer.json"
CLAIMS, ALPHA = 11, 0.05
DESIGNS = {"6": [3, 4, 5, 6], "9": list(range(3, 10))}
UNITER_LEADS = (29.1, 36.4, 24.8, 64.4)  # Meta-Sum points, seeds 0-3; seed 3 took off
BASE = UNITER_LEADS[:3]
TAKEOFF = {"p": 0.25, "jump": UNITER_LEADS[3] - float(np.mean(BASE)), "sd": float(np.std(BASE, ddof=1))}
NULLS = ("normal", "t3", "laplace", "takeoff either", "exponential right", "exponential left", "lognormal right",
         "lognormal left", "takeoff right", "takeoff left")


def standard(rng: np.random.Generator, law: str, shape: tuple[int, ...]) -> np.ndarray:
    """Differences of mean 0 and SD 1 (skewed laws: long tail to the right, i.e. in the claimed direction)."""
    if law == "normal":
        return rng.standard_normal(shape)
    if law == "t3":
        return rng.standard_t(3, shape) / math.sqrt(3)
    if law == "laplace":
        return rng.laplace(0, 1 / math.sqrt(2), shape)
    if law == "exponential":
        return rng.exponential(1.0, shape) - 1.0
    if law == "lognormal":
        return (rng.lognormal(0.0, 1.0, shape) - math.exp(0.5)) / math.sqrt((math.e - 1) * math.e)
    p, ratio = TAKEOFF["p"], TAKEOFF["jump"] / TAKEOFF["sd"]
    if law == "takeoff":
        x = ratio * ((rng.random(shape) < p) - p) + rng.standard_normal(shape)
        return x / math.sqrt(ratio ** 2 * p * (1 - p) + 1)
    if law == "takeoff either":
        x = ratio * ((rng.random(shape) < p).astype(float) - (rng.random(shape) < p)) + rng.standard_normal(shape)
        return x / math.sqrt(2 * ratio ** 2 * p * (1 - p) + 1)
    raise ValueError(law)


def null_draw(rng: np.random.Generator, scenario: str, shape: tuple[int, ...]) -> np.ndarray:
    law, _, side = scenario.rpartition(" ") if scenario.endswith((" right", " left")) else (scenario, "", "")
    x = standard(rng, law, shape)
    return -x if side == "left" else x


def rate(hits: np.ndarray) -> dict[str, float]:
    f = float(hits.mean())
    return {"rate": f, "se": math.sqrt(max(f * (1 - f), 1e-12) / hits.size)}


def seeds_used(direction: np.ndarray, look: np.ndarray, sizes: list[int]) -> float:
    return float(np.asarray(sizes)[np.where(direction != 0, look, len(sizes) - 1)].mean())


def check(rng: np.random.Generator, count: int) -> int:
    """Comparisons where the vectorised rule and `sequential_claims` disagree (mixed kinds, both designs)."""
    kinds = ["higher"] * 7 + ["not_higher"] * 2 + ["equivalent"] * 2
    margins, contradict = [0.0] * 7 + [1.0] * 4, [False, True] * 3 + [False] * 5
    bad = 0
    for sizes in DESIGNS.values():
        d = rng.normal(rng.choice([0.0, 1.0, 2.5, -1.5], (count, CLAIMS, 1)), 1.0, (count, CLAIMS, sizes[-1]))
        direction, look, parametric = simulate_claims(d, sizes, ALPHA, kinds, margins, contradict)
        for s in range(count):
            ref = sequential_claims(d[s].tolist(), sizes, ALPHA, kinds, margins, contradict)
            bad += ([r["direction"] for r in ref] != direction[s].tolist()
                    or [r["parametric_only"] for r in ref] != parametric[s].tolist())
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sims", type=int, default=20_000, help="simulated comparisons per null row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", type=int, default=200, help="comparisons replayed through sequential_claims")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    rows: list[dict] = []

    def add(section: str, scenario: str, design: str, **figures) -> None:
        rows.append({"section": section, "scenario": scenario, "design": design, **figures})

    for scenario in NULLS:
        for design, sizes in DESIGNS.items():
            d = null_draw(rng, scenario, (args.sims, CLAIMS, sizes[-1]))
            direction, look, parametric = simulate_claims(d, sizes, ALPHA)
            add("null", scenario, design, fwer=rate((direction != 0).any(1)),
                parametric_share=float(parametric[direction != 0].mean()) if (direction != 0).any() else None)
            if scenario.endswith(("right", "left")) and design == "9":
                alone, _, _ = simulate_claims(d, sizes, ALPHA, sign_flip=False)
                add("null", scenario + " (t alone)", design, fwer=rate((alone != 0).any(1)))
    kinds = ["higher"] * 7 + ["not_higher"] * 2 + ["equivalent"] * 2
    means = np.array([2.0] * 4 + [0.0] * 3 + [1.0] * 4)  # the non-superiority / TOST nulls at their margin
    nulls = np.arange(4, CLAIMS)
    for law in ("normal", "takeoff either", "takeoff left"):
        for design, sizes in DESIGNS.items():
            d = means[None, :, None] + null_draw(rng, law, (args.sims, CLAIMS, sizes[-1]))
            direction, look, _ = simulate_claims(d, sizes, ALPHA, kinds, [0.0] * 7 + [1.0] * 4)
            add("mixture", f"4 true, 7 null ({law} noise)", design, fwer=rate((direction[:, nulls] != 0).any(1)),
                power=rate(direction[:, :4] == 1))
    power_sims = max(1, args.sims // 4)
    for effect in (1.0, 2.0, 3.0):
        for design, sizes in DESIGNS.items():
            d = rng.normal(effect, 1.0, (power_sims, CLAIMS, sizes[-1]))
            for sided, contradict in (("one-sided", None), ("two-sided", [True] * CLAIMS)):
                direction, look, _ = simulate_claims(d, sizes, ALPHA, contradict=contradict)
                add("power", f"effect / SD {effect:g}, {sided}", design, power=rate(direction == 1),
                    seeds_per_claim=seeds_used(direction, look, sizes))
    seed_sims = max(1, args.sims // 2)
    for last in (12, 21, 30):
        sizes = list(range(3, last + 1, 3))
        d = null_draw(rng, "takeoff left", (seed_sims, CLAIMS, last))
        direction, _, _ = simulate_claims(d, sizes, ALPHA)
        add("seeds", "takeoff left", f"3, 6, ..., {last}", fwer=rate((direction != 0).any(1)))
    formula = []
    for n in range(3, 7):
        for effect in (1.0, 2.0, 3.0, 4.0):
            d = rng.standard_normal((power_sims, CLAIMS, n))
            d[:, 0] += effect
            direction, _, _ = simulate_claims(d, [n], ALPHA)
            formula.append({"n": n, "effect": effect, "simulated": float((direction[:, 0] == 1).mean()),
                            "formula": paired_power(effect, 1.0, n, ALPHA / CLAIMS, sides=1)})
    mismatches = check(rng, args.check)
    seconds = time.perf_counter() - start

    def cell(f: dict | None) -> str:
        return "–" if f is None else f"{100 * f['rate']:.2f} ± {100 * f['se']:.2f}"

    for r in rows:
        f = r.get("fwer")
        r["controlled"] = None if f is None else f["rate"] - 2 * f["se"] <= ALPHA
    print(f"{CLAIMS} claims, {args.sims:,} comparisons per null / mixture row ({power_sims:,} power, {seed_sims:,} "
          f"seeds rows), seed {args.seed}, alpha {ALPHA}; take-off fit: p {TAKEOFF['p']}, jump {TAKEOFF['jump']:.1f}, "
          f"SD {TAKEOFF['sd']:.2f} points (jump / SD {TAKEOFF['jump'] / TAKEOFF['sd']:.2f})")
    print("| section | scenario | looks | FWER % (± MC SE) | controlled | power % per claim | seeds / claim |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['section']} | {r['scenario']} | {r['design']} | {cell(r.get('fwer'))} | "
              f"{'–' if r['controlled'] is None else 'yes' if r['controlled'] else '**no**'} | {cell(r.get('power'))} | "
              f"{r['seeds_per_claim']:.2f} |" if "seeds_per_claim" in r else
              f"| {r['section']} | {r['scenario']} | {r['design']} | {cell(r.get('fwer'))} | "
              f"{'–' if r['controlled'] is None else 'yes' if r['controlled'] else '**no**'} | {cell(r.get('power'))} | – |")
    worst = max(abs(f["simulated"] - f["formula"]) for f in formula) * 100
    print(f"one-sided power formula against simulation (one claim among 11, fixed design n 3-6): largest difference "
          f"{worst:.2f} points; vectorised rule vs sequential_claims: {mismatches} mismatches in "
          f"{2 * args.check} comparisons; {seconds:.0f} s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS, json.dumps({
        "inputs": {"sims": args.sims, "power_sims": power_sims, "seed_sims": seed_sims, "seed": args.seed,
                   "claims": CLAIMS, "alpha": ALPHA, "designs": DESIGNS, "takeoff": TAKEOFF,
                   "uniter_leads": UNITER_LEADS, "check": args.check},
        "rows": rows, "power_formula": {"cells": formula, "max_abs_diff_points": worst},
        "check": {"comparisons": 2 * args.check, "mismatches": mismatches}, "seconds": seconds,
        "numpy": np.__version__, "scipy": scipy.__version__, "machine": platform.processor() or platform.machine()},
        indent=1))


if __name__ == "__main__":
    main()
