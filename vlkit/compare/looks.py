"""Which seeds a comparison runs under ``compare.until=decided``: after each look, the runs that undecided claims read
get the next look's seeds (`next_look`); a comparison read back from its folder replays the same looks
(`replay_looks`). The rule itself is `vlkit.stats.sequential`."""
from __future__ import annotations

from vlkit.compare import records
from vlkit.compare.comparison import Comparison
from vlkit.compare.config import look_sizes_of
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
    if not later or any(e["rule"]["n"] < current for e in running):
        return False
    return comparison.add_seeds(runs, later[0])


def replay_looks(comparison: Comparison) -> None:
    """Bring a comparison read from its folder to the look its finished units reached (the same looks its run took)."""
    while next_look(comparison):
        pass
