"""Which seeds a comparison runs under ``compare.until=decided``: after each look, the runs that undecided claims read
get the next look's seeds (`next_look`); a comparison read back from its folder replays the same looks
(`replay_looks`). With ``compare.max_device_hours`` a look starts only when what the comparison's current units spent
plus the look's seeds, priced from the plan and corrected by what finished units spent (`within_budget`), fits.
The rule itself is `vlkit.stats.sequential`."""
from __future__ import annotations

from typing import Any

import numpy as np

from vlkit.compare import records
from vlkit.compare.account import account, spent_costs
from vlkit.compare.claims import POINTS, claim_runs, kind_of, verdicts
from vlkit.compare.comparison import Comparison
from vlkit.compare.config import look_sizes_of
from vlkit.compare.costs import seed_costs
from vlkit.compare.preregistration import max_device_hours, seeds_cost, spend_factor
from vlkit.compare.report import figure, markdown_table
from vlkit.stats.paired import ALPHA
from vlkit.stats.sequential import sign_flip_seeds
from vlkit.stats.simulate import final_seeds, simulate_claims


def next_look(comparison: Comparison) -> bool:
    """Once every claim still running was tested at the current look, give the runs those claims read the next look's
    seeds (`Comparison.add_seeds`); False when nothing is added (a fixed comparison, every claim decided or at the
    last look, or a look still waiting for results)."""
    sizes = look_sizes_of(comparison.compare)
    if sizes is None:
        return False
    entries = verdicts(records.finished_records(comparison), comparison.compare["claims"], sizes,
                       comparison.compare.get("alpha", ALPHA))
    running = [e for e in entries if e["verdict"] == "running"]
    index = {spec.name: i for i, spec in enumerate(comparison.specs)}
    runs = {index[name] for e in running for name in claim_runs(e)}
    if not runs:
        return False
    current = min(len(comparison.seeds_of(i)) for i in runs)
    later = [size for size in sizes if size > current]
    if not later or any(e["rule"]["n"] < current for e in running) or not within_budget(comparison, runs, later[0]):
        return False
    return comparison.add_seeds(runs, later[0])


def within_budget(comparison: Comparison, runs: set[int], size: int) -> bool:
    """Whether the look that takes ``runs`` to ``size`` seeds fits ``compare.max_device_hours`` (always, without
    one): the device-hours the current units spent (`vlkit.compare.account`) plus the look's seeds at the plan's
    hours per seed (`vlkit.compare.costs.seed_costs`) times what finished units spent over what the plan gave them.
    Only the current look's units count, so a replay stops where the run stopped."""
    budget = max_device_hours(comparison.compare)
    if budget is None:
        return True
    costs = spent_costs(comparison, records.finished_results(comparison))
    acct = account(comparison, costs)
    names = {i: comparison.specs[i].name for i in runs}
    price = seeds_cost(seed_costs(comparison, costs)["seed_hours"], {names[i]: len(comparison.seeds_of(i)) for i in runs},
                       {names[i]: size for i in runs}, spend_factor(acct))
    if acct["device_hours"] + price <= budget:
        return True
    comparison.say(f"the look at {size} seeds would bring the comparison to {acct['device_hours'] + price:.3g} "
                   f"device-hours, beyond compare.max_device_hours={budget:g}: no more seeds")
    return False


DRY_RUN_SIMS = 2000  # simulated comparisons behind the dry run's expected cost at the paper effects
DRY_RUN_SEED = 0


def looks_plan(comparison: Comparison, hours: float, costs: dict[str, Any]) -> list[str]:
    """The dry run's lines for ``compare.until=decided`` (empty for a fixed comparison): every look up to
    ``compare.max_seeds`` with the most the comparison can cost by then (every claim undecided until that look) and
    the expected cost at the paper effects (`vlkit.stats.simulate.simulate_claims` over claims with ``paper_effect``
    and ``planning_sd``; the others counted undecided to the last look), from ``hours``, the device-hours of the
    planned units (the first look), and ``costs``: ``{"device": its name, "seed_hours": {run: device-hours per
    seed}}`` (FLOP costs: `vlkit.compare.costs.seed_costs`; or a probe's timed steps); the seeds from which the
    sign-flip test can check a decision; the budget."""
    sizes = look_sizes_of(comparison.compare)
    if sizes is None:
        return []
    compare = comparison.compare
    claims = compare["claims"]
    names = [spec.name for spec in comparison.specs]
    read = sorted({run for c in claims for run in claim_runs(c)}, key=names.index)
    start = {run: sizes[0] for run in read}
    most = [hours + seeds_cost(costs["seed_hours"], start, {run: n for run in read}) for n in sizes]
    known = [c for c in claims if c.get("paper_effect") is not None and c.get("planning_sd")]
    rng = np.random.default_rng(DRY_RUN_SEED)
    diffs = np.stack([rng.normal(c["paper_effect"] / POINTS, c["planning_sd"] / POINTS, (DRY_RUN_SIMS, sizes[-1]))
                      if c in known else np.zeros((DRY_RUN_SIMS, sizes[-1])) for c in claims], 1)
    alpha = compare.get("alpha", ALPHA)
    direction, look, _ = simulate_claims(diffs, sizes, alpha, [kind_of(c) for c in claims],
                                         [(c.get("margin") or 0.0) / POINTS for c in claims],
                                         [bool(c.get("contradict")) for c in claims])
    look[:, [i for i, c in enumerate(claims) if c not in known]] = len(sizes) - 1
    seeds = final_seeds(look, sizes, [[read.index(r) for r in claim_runs(c)] for c in claims], len(read), sizes[0])
    expected = hours + float(np.mean([seeds_cost(costs["seed_hours"], start, dict(zip(read, row)))
                                           for row in seeds]))
    reached = [(look >= k).any(1).mean() for k in range(len(sizes))]
    hypotheses = len(claims) + sum(bool(c.get("contradict")) for c in claims)
    check = sign_flip_seeds(alpha / hypotheses)
    device = costs["device"]
    lines = ["", f"Seeds until decided: looks after {sizes} seeds (compare.max_seeds={compare['max_seeds']}, "
             f"compare.round_seeds={compare['round_seeds']}). The units above are the first look; each later look adds "
             f"seeds to the runs of the claims still undecided ({', '.join(read)}), at {device}-hours per seed "
             + ", ".join(f"{run} {figure(costs['seed_hours'][run])}" for run in read) + ".", "",
             markdown_table(["look", "seeds", f"most it can cost ({device}-h, all looks so far)",
                             "chance the rule gets there at the paper effects"],
                            [[str(k + 1), str(n), figure(h), f"{r:.0%}"] for k, (n, h, r) in
                             enumerate(zip(sizes, most, reached))]), "",
             f"At most: {figure(most[-1])} {device}-hours (every claim undecided to the last look). Expected at the paper "
             f"effects: {figure(expected)} {device}-hours, over {DRY_RUN_SIMS:,} simulated comparisons of the rule with "
             f"{len(known)} claim(s) at their paper_effect and planning_sd; {len(claims) - len(known)} without both "
             "counted undecided to the last look.",
             f"The exact sign-flip test can check a decision from {check} seeds on (2^-n <= alpha / {hypotheses}); below "
             "that a decision stands on the t-test alone (parametric-only, reported as decided under normality)"
             + (f": with compare.max_seeds={compare['max_seeds']} every decision would be parametric-only unless alpha "
                "is recycled to it." if compare["max_seeds"] < check else ".")
             + " The family-wise error is controlled for symmetric differences and for skew in a claim's direction, "
             "not for equal-mean differences skewed against it (a take-off only b can have) at any seeds measured "
             "(docs/compare-sequential.md)."]
    budget = max_device_hours(compare)
    if budget is not None:
        fits = [n for n, h in zip(sizes, most) if h <= budget]
        lines.append(f"Budget compare.max_device_hours={budget:g}: " + (
            f"looks up to {fits[-1]} seeds fit even if every claim stays undecided" if fits else
            "not even the first look fits") + " (priced from this plan; the run corrects the price by what finished "
            "units spent).")
    return lines


def replay_looks(comparison: Comparison) -> None:
    """Bring a comparison read from its folder to the look its finished units reached (the same looks its run took)."""
    while next_look(comparison):
        pass
