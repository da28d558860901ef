"""Which seeds a comparison runs under ``compare.until=decided``: after each look, the runs that undecided claims read
get the next look's seeds (`next_look`); a comparison read back from its folder replays the same looks
(`replay_looks`). With ``compare.max_device_hours`` a look starts only when what the comparison's current units spent
plus the look's seeds, priced from the plan and corrected by what finished units spent (`within_budget`), fits.
The rule itself is `vlkit.stats.sequential`."""
from __future__ import annotations

from vlkit.compare import records
from vlkit.compare.account import account, spent_plan
from vlkit.compare.comparison import Comparison
from vlkit.compare.config import look_sizes_of
from vlkit.compare.plan import seed_costs
from vlkit.compare.preregistration import max_device_hours, seeds_cost, spend_factor
from vlkit.stats.paired import ALPHA


def next_look(comparison: Comparison) -> bool:
    """Once every claim still running was tested at the current look, give the runs those claims read the next look's
    seeds (`Comparison.add_seeds`); False when nothing is added (a fixed comparison, every claim decided or at the
    last look, or a look still waiting for results)."""
    from vlkit.compare.claims import claim_runs, verdicts

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
    hours per seed (`vlkit.compare.plan.seed_costs`) times what finished units spent over what the plan gave them.
    Only the current look's units count, so a replay stops where the run stopped."""
    budget = max_device_hours(comparison.compare)
    if budget is None:
        return True
    plan = spent_plan(comparison, records.finished_results(comparison))
    acct = account(comparison, plan)
    names = {i: comparison.specs[i].name for i in runs}
    price = seeds_cost(seed_costs(comparison, plan)["seed_hours"], {names[i]: len(comparison.seeds_of(i)) for i in runs},
                       {names[i]: size for i in runs}, spend_factor(acct))
    if acct["device_hours"] + price <= budget:
        return True
    comparison.say(f"the look at {size} seeds would bring the comparison to {acct['device_hours'] + price:.3g} "
                   f"device-hours, beyond compare.max_device_hours={budget:g}: no more seeds")
    return False


def replay_looks(comparison: Comparison) -> None:
    """Bring a comparison read from its folder to the look its finished units reached (the same looks its run took)."""
    while next_look(comparison):
        pass
