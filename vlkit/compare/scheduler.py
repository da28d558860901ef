"""The scheduler of a comparison's session: every unit not finished before runs on the executor (`drive`: a unit
starts once the unit it depends on finished, at most ``slots`` at a time; the dependents of a failed unit are
skipped; a died unit is retried up to ``compare.retries`` times), look after look under ``compare.until=decided``,
with a progress line (units done, elapsed, ETA) as each unit ends. A SIGTERM / SIGINT starts nothing new."""
from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from vlkit.compare.comparison import Comparison
from vlkit.compare.executor_base import checked_wait
from vlkit.compare.looks import next_look
from vlkit.compare.statistics import HEADLINE
from vlkit.compare.units import Unit, UnitFolder, rerun_reason, status


def run_session(comparison: Comparison, executor_cls: Any, plan_path: Path, settings: Any
                 ) -> tuple[dict[str, dict[str, Any]], list[int]]:
    """This session's work: every unit not finished before, look after look (a stop by SIGTERM / SIGINT starts
    nothing new). Returns the outcomes and the signals that stopped it."""
    executor = executor_cls(plan_path, settings)
    stop, stopped_by = threading.Event(), []

    def on_signal(signum: int, _frame: Any) -> None:
        stopped_by.append(signum)
        stop.set()

    handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)} \
        if threading.current_thread() is threading.main_thread() else {}
    outcomes: dict[str, dict[str, Any]] = {}
    try:
        while True:  # one pass per look: every unit of the current seeds, then (until=decided) the next look's
            outcomes.update(run_look(comparison, executor, settings, stop))
            if stopped_by or any(o["state"] != "finished" for o in outcomes.values()) or not next_look(comparison):
                break
    finally:
        executor.close()
        for s, handler in handlers.items():
            signal.signal(s, handler)
    return outcomes, stopped_by


def run_look(comparison: Comparison, executor: Any, settings: Any, stop: threading.Event) -> dict[str, dict[str, Any]]:
    """Run every unit of the comparison's current seeds that has not finished before; the outcome of each run."""
    compare = comparison.compare
    units = comparison.all_units()
    keys = {comparison.key(u): u for u in units}
    hashes = {k: comparison.unit_hash(u) for k, u in keys.items()}
    states = {k: UnitFolder(comparison.unit_dir(keys[k]), k).read() for k in keys}
    reused = [k for k in keys if status(states[k], hashes[k]) == "finished"]
    todo = [k for k in keys if k not in reused]
    for key in todo:  # a unit finished before that runs again says why
        reason = rerun_reason(states[key], hashes[key], comparison.unit_config(keys[key]))
        if reason:
            print(f"vlkit compare: {key} runs again: {reason}", file=sys.stderr, flush=True)
    seeds = len(comparison.all_seeds())
    comparison.say(f"{len(comparison.specs)} run(s) x {seeds} seed(s) = {len(units)} units of work"
                   + (f" ({len(reused)} finished before, reused)" if reused else "")
                   + f"; executor {compare.get('executor') or 'local'}, {executor.slots} at once x {settings.threads} thread(s)")
    progress = Progress(comparison, [keys[k] for k in todo], executor.slots)
    return drive(todo, {k: (comparison.key(keys[k].depends_on()) if keys[k].depends_on() else None) for k in keys},
                 executor, int(compare.get("retries") or 0),
                 lambda key, state, note: _ended(progress, comparison, keys[key], state, note, hashes[key]), stop)


def drive(units: list[str], depends: dict[str, str | None], executor: Any, retries: int,
          ended: Callable[[str, str, str], None], stop: threading.Event) -> dict[str, dict[str, Any]]:
    """Run ``units`` (keys, in start order) on ``executor``; ``depends[key]`` is the unit it waits for.
    Returns ``key -> outcome`` (``state``: finished, failed, died or skipped, ``error``), calling
    ``ended(key, state, note)`` as each ends. ``stop`` set: nothing new starts and the call returns."""
    outcomes: dict[str, dict[str, Any]] = {}
    attempts: dict[str, int] = {}
    scheduled = set(units)  # a unit depended on but not scheduled here has finished before
    waiting = list(units)
    running: set[str] = set()
    while (waiting or running) and not stop.is_set():
        for key in list(waiting):
            parent = depends.get(key) if depends.get(key) in scheduled else None
            if parent is not None and parent in outcomes and outcomes[parent]["state"] != "finished":
                waiting.remove(key)
                outcomes[key] = {"state": "skipped", "error": f"{parent} did not finish"}
                ended(key, "skipped", outcomes[key]["error"])
            elif len(running) < executor.slots and (parent is None or parent in outcomes):
                waiting.remove(key)
                running.add(key)
                attempts[key] = attempts.get(key, 0) + 1
                executor.submit(key)
        if not running:
            if waiting:
                raise RuntimeError(f"compare: {waiting[0]} waits for {depends.get(waiting[0])}, which never runs")
            continue
        for key, outcome in checked_wait(executor, 1.0, running):
            running.discard(key)
            if outcome["state"] == "died" and attempts[key] <= retries:
                ended(key, "retrying", f"{outcome.get('error')}; retry {attempts[key]} of {retries}")
                waiting.insert(0, key)
                continue
            outcomes[key] = outcome
            ended(key, outcome["state"], outcome.get("error") or "")
    return outcomes


def _ended(progress: Progress, comparison: Comparison, unit: Any, state: str, note: str, unit_hash: str) -> None:
    folder = UnitFolder(comparison.unit_dir(unit), comparison.key(unit))
    result = folder.finished(unit_hash) if state == "finished" else None
    if state in ("died", "retrying"):  # units.md and a resumed comparison say why (the executor's reason)
        folder.died(unit_hash, note)
    if state == "retrying":  # its process died: it runs again and stays among the remaining units
        comparison.say(f"{comparison.key(unit)} died ({note})")
        return
    progress.finished(unit, state, result, note)


class Progress:
    """Units done of the total, elapsed time and an ETA: each remaining unit costs its step count times the
    seconds per step of finished units of its kind (pre-training of a run, fine-tuning of a task), else of
    its stage, else of any unit; spread over the slots that run units side by side."""

    def __init__(self, comparison: Comparison, units: list[Unit], slots: int):
        self.comparison, self.remaining = comparison, list(units)
        self.total, self.slots = len(units), max(1, slots)
        self.start = time.perf_counter()
        self.per_step: dict[Any, list[float]] = {}

    @staticmethod
    def kinds(unit: Unit) -> tuple[Any, ...]:
        """The unit's kind, its stage, and everything: from the most to the least specific."""
        return (("pretrain", unit.run), "pretrain", "all") if unit.is_pretrain else \
            (("finetune", unit.run, unit.task), "finetune", "all")

    def estimate(self, unit: Unit) -> float:
        for kind in self.kinds(unit):
            if kind in self.per_step:
                return self.comparison.unit_steps(unit) * sum(self.per_step[kind]) / len(self.per_step[kind])
        return 0.0

    def finished(self, unit: Unit, state: str, result: dict[str, Any] | None, note: str = "") -> None:
        """Say that ``unit`` ended (``finished``, ``failed``, ``skipped``, or reused from an earlier attempt)."""
        self.remaining.remove(unit)
        if result is not None and state == "finished":
            for kind in self.kinds(unit):
                self.per_step.setdefault(kind, []).append(result["wall_s"] / max(1, self.comparison.unit_steps(unit)))
        done = self.total - len(self.remaining)
        elapsed = time.perf_counter() - self.start
        eta = sum(self.estimate(u) for u in self.remaining) / self.slots
        what = self.comparison.key(unit)
        if state == "finished" and result is not None:
            shown = ", ".join(f"{k} {100 * v:.1f}" for k, v in result.get("metrics", {}).items() if k in HEADLINE)
            what += f" {result['wall_s']:.0f} s" + (f" ({shown})" if shown else "")
        else:
            what += f" {state}" + (f": {note}" if note else "")
        self.comparison.say(f"{done}/{self.total} units done; {what}; elapsed {_clock(elapsed)}"
                            + (f", ETA {_clock(eta)}" if self.remaining else ""))


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s"
