"""`vlkit compare`: head-to-head runs on identical data -> tables, plots and a manifest to rerun them.

A comparison is a list of runs (``conf/compare/*.yaml``, or ``compare=<path.yaml>``): each names a
model, an objective mix (or none) and optional overrides (its own task options included); every run is
pre-trained on the same examples in the same order with the same seeds and step budget, then
fine-tuned and evaluated on the same tasks, next to a no-pre-training baseline of the same model.
Results are reported per seed and as mean ± 95% CI.

    vlkit compare                          # the default comparison on the embedded shapes world
    vlkit compare compare=smoke            # tiny and quick
    vlkit compare compare=my_runs.yaml     # a comparison file of your own
    vlkit compare ... output_dir=D resume=true      # go on where a killed or failed comparison stopped
    vlkit compare ... dry_run=true         # the units, their resources and a measured cost estimate
    vlkit compare-report output_dir=D      # the report from the folder, also while units still run

Each unit of work (a pre-training, or one fine-tuning of one variant on one task) records its state and
result in its own folder the moment it ends (`units`), wherever it ran (`executors`: local processes,
SLURM through submitit, Ray); the report is always rebuilt from those folders (`report_from_folder`).

Modules: `config` (runs, task configs), `units` (units and their state on disk), `scheduling` (the work of
each unit), `worker` (a unit in its process), `executors` (where units run), `estimate` (dry run), `plan`,
`flops` and `devices` (its FLOP plan), `statistics`, `claims` and `sequential` (tests, verdicts, seeds until
decided), `report` and `plots` (outputs), `manifest` (what reruns a comparison), `account` (what it spent, across
every session, beside its plan).
"""
from __future__ import annotations

import json
import shlex
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from vlkit.compare.account import Session, heartbeat_s
from vlkit.compare.claims import check_claims
from vlkit.compare.config import (RunSpec, drop_preset_title, look_sizes_of, objective_mix, resolve_config, run_specs,
                                  task_cfg)
from vlkit.compare.plan import plan_settings
from vlkit.compare.scheduling import Comparison, Progress, digest
from vlkit.compare.statistics import HEADLINE, mean_ci, paired_p_value, summarize
from vlkit.compare.units import PLAN_FILE, UnitFolder, changed_keys, rerun_reason, status

# Keys a resumed comparison may change: where and how units run, not what they compute (with each executor's
# resume-safe keys of its block, `vlkit.compare.executors.run_keys`).
RESUME_SAFE = ("output_dir", "resume", "dry_run", "progress", "workers", "cache_dir", "manifest",
               "expected_data_hash", "compare.retries", "compare.executor", "compare.plan",
               "compare.probe", "compare.until", "compare.max_seeds", "compare.round_seeds", "compare.claims",
               "compare.heartbeat_s")
# (the claims and until / max_seeds / round_seeds decide what is tested and which seeds run, not what a unit
# computes: a finished fixed comparison may go on with compare.until=decided; decide on it before reading the
# results for its error guarantee)


def _check_seeds(seeds: Any) -> None:
    if not isinstance(seeds, list) or not seeds:
        raise ValueError(f"compare.seeds={seeds!r}: give a non-empty list of seeds, e.g. compare.seeds=[0,1,2]")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"compare.seeds={seeds}: seed(s) {repeated} repeated; each seed is one independent replicate")


def _saved_plan(cfg: dict[str, Any], output_dir: Path, resume: bool) -> dict[str, Any] | None:
    """The checks of `_plan`, which write nothing: the plan saved in ``output_dir`` when resuming (None for a new
    comparison); a folder that holds something else, or a changed configuration, is refused."""
    from vlkit.compare.executor_base import run_keys
    from vlkit.compare.report import dump_json
    from vlkit.compare.units import PLAN_DAMAGED
    from vlkit.io import read_json

    path = output_dir / PLAN_FILE
    if not (output_dir.exists() and any(output_dir.iterdir())):
        return None
    if not resume:
        raise FileExistsError(f"{output_dir} is not empty: pass resume=true to go on with the comparison in it, "
                              "or choose another output_dir= (results are never overwritten)")
    if not path.is_file():
        raise FileNotFoundError(f"resume=true: {output_dir} holds no {PLAN_FILE}, so it is not a vlkit comparison")
    saved = read_json(path, PLAN_DAMAGED)
    changed = changed_keys(saved["config"], json.loads(dump_json(_planned(cfg))), RESUME_SAFE + run_keys())
    if changed:
        raise ValueError(f"resume=true: the configuration differs from the one {output_dir} was started with "
                         f"({path}); changed: " + "; ".join(changed) + ". Rerun with the original settings, or "
                         "use another output_dir")
    return saved


def _planned(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k not in ("output_dir", "resume", "dry_run")}


def _plan(cfg: dict[str, Any], output_dir: Path, argv: list[str], resume: bool,
          digests: dict[str, Any] | None = None) -> Path:
    """Write ``plan.json`` (the resolved config, the command and the ``digests`` of the input files, `vlkit.digests`)
    or, resuming, check the saved one (`_saved_plan`): a changed configuration is refused naming each key that
    changed (`RESUME_SAFE` keys may change, and the plan then holds their new values and the resuming command).
    Every check comes before the first write."""
    from vlkit.compare.report import dump_json
    from vlkit.io import atomic_write_text

    path = output_dir / PLAN_FILE
    saved = _saved_plan(cfg, output_dir, resume)
    record = {"config": _planned(cfg), "argv": argv, "digests": digests or {}}
    if saved is None:
        output_dir.mkdir(parents=True, exist_ok=True)
        record["created"] = time.time()
    # resuming: the resume-safe keys as this session sets them (its workers and later reports read them from here)
    atomic_write_text(path, dump_json({**(saved or {}), **record}))
    return path


def main(cfg: Any, overrides: list[str] | None = None, started: float | None = None) -> int:
    """Run the comparison ``cfg`` (``overrides``: the command line's, for the retry command; ``started``: when the
    command began, else now: the session's start in the account, `vlkit.compare.account`)."""
    import torch

    from vlkit.compare.executors import ExecutorSettings, check_executor, retry_command
    from vlkit.digests import known, remember
    from vlkit.registry import EXECUTORS
    from vlkit.runtime import every

    started = time.time() if started is None else started
    from vlkit.train.commands import explicit_keys

    cfg = resolve_config(cfg, explicit_keys(overrides) if overrides is not None else None)
    compare = cfg["compare"]
    if not cfg.get("manifest"):
        from vlkit.train.commands import explicit_keys

        drop_preset_title(compare, explicit_keys(overrides))
    _check_seeds(compare.get("seeds"))
    settings = ExecutorSettings(cfg)
    plan_settings(compare)
    heartbeat = heartbeat_s(compare)
    torch.set_num_threads(settings.threads)
    comparison = Comparison(cfg, Path(cfg.get("output_dir") or "."), progress=cfg.get("progress", True))
    check_claims(compare.get("claims") or [], [s.name for s in comparison.specs])
    look_sizes_of(compare)
    comparison.check_models()
    comparison.check_task_sources()
    comparison.check_trainers()
    executor_cls = EXECUTORS.get(compare.get("executor") or "local")
    if not cfg.get("dry_run"):  # a dry run plans for the machines it will run on, not for this one
        check_executor(executor_cls, settings)  # its extra importable, its settings known: before any file is written
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    output_dir = Path(cfg.get("output_dir") or Path("outputs") / "compare" / stamp)
    if cfg.get("resume") and (output_dir / PLAN_FILE).is_file():  # the digests of the last session: big files read once
        remember(_saved_plan(cfg, output_dir, True).get("digests"))
    for unit in comparison.all_units():  # every unit's identity: its settings and the content of its input files
        comparison.unit_hash(unit)
    if cfg.get("dry_run"):
        from vlkit.compare.estimate import dry_run

        print(dry_run(comparison, settings))
        return 0
    comparison.output_dir = output_dir
    argv = list(overrides if overrides is not None else sys.argv[2:])
    _saved_plan(cfg, output_dir, bool(cfg.get("resume")))  # the folder's checks, before the data work
    _prepare_environments(comparison, settings)
    plan_path = _plan(cfg, output_dir, argv, bool(cfg.get("resume")), known())
    session = Session.begin(output_dir, started, shlex.join(["vlkit", "compare", *argv]), compare.get("executor") or "local")
    try:
        with every(heartbeat, session.beat):
            outcomes, stopped_by = _run_session(comparison, executor_cls, plan_path, settings)
        bad = {k: o for k, o in outcomes.items() if o["state"] != "finished"}
        how = (f"stopped by {signal.Signals(stopped_by[0]).name}" if stopped_by else
               f"{len(bad)} unit(s) did not finish" if bad else "finished")
        table = report_from_folder(comparison, session, how)
    except BaseException as err:
        if session.record["ended"] is None:
            session.end(f"error: {type(err).__name__}")
        raise
    retry = retry_command(argv, output_dir)
    if stopped_by:
        print(f"vlkit compare: {how}; finished units are kept in {output_dir}. Go on with:\n  {retry}", file=sys.stderr)
        return 128 + stopped_by[0]
    print(f"\n{table}\n\nresults in {output_dir} (tests, chance levels and verdicts: {output_dir / 'results.md'})")
    if bad:
        lines = [f"  {k}: {o['state']}: {o.get('error') or ''}" for k, o in bad.items()]
        print(f"vlkit compare: {how} (every other unit did):\n" + "\n".join(lines)
              + f"\nEach failed unit's traceback.txt and unit.log are in its folder under {output_dir / 'runs'}. "
              f"After fixing the cause, rerun them (and their dependents only) with:\n  {retry}", file=sys.stderr)
        return 1
    return 0


def _prepare_environments(comparison: Comparison, settings: Any) -> None:
    """Every run's data, the shared features extracted once (into the cache, not the output folder), before the plan
    is written: data that cannot be read fails here and leaves the output folder as it was."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(settings.workers * settings.threads)  # no unit runs yet: the extraction takes their cores
    try:
        for spec in comparison.specs:
            comparison.environment(spec)
    finally:
        torch.set_num_threads(previous)


def _run_session(comparison: Comparison, executor_cls: Any, plan_path: Path, settings: Any
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
            outcomes.update(_run_look(comparison, executor, settings, stop))
            if stopped_by or any(o["state"] != "finished" for o in outcomes.values()) or not next_look(comparison):
                break
    finally:
        executor.close()
        for s, handler in handlers.items():
            signal.signal(s, handler)
    return outcomes, stopped_by


def _run_look(comparison: Comparison, executor: Any, settings: Any, stop: threading.Event) -> dict[str, dict[str, Any]]:
    """Run every unit of the comparison's current seeds that has not finished before; the outcome of each run."""
    from vlkit.compare.executors import drive

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


def finished_results(comparison: Comparison, states: list | None = None) -> dict[Any, dict[str, Any]]:
    """Unit -> result of every finished unit (``states``: `unit_states`, read here when not given)."""
    states = unit_states(comparison) if states is None else states
    return {u: s["result"] for u, (_, st, s) in zip(comparison.all_units(), states) if st == "finished"}


def finished_records(comparison: Comparison) -> list[dict[str, Any]]:
    """The records of the comparison's finished units (`Comparison.collect`)."""
    done = finished_results(comparison)
    return comparison.collect(done)[0] if done else []


def next_look(comparison: Comparison) -> bool:
    """``compare.until=decided``: once every claim still running was tested at the current look, give the runs those
    claims read the next look's seeds (`Comparison.add_seeds`); False when nothing is added (a fixed comparison,
    every claim decided or at the last look, or a look still waiting for results)."""
    from vlkit.compare.claims import claim_runs, sequential_verdicts

    sizes = look_sizes_of(comparison.compare)
    if sizes is None:
        return False
    entries = sequential_verdicts(finished_records(comparison), comparison.compare["claims"], sizes)
    running = [e for e in entries if e["verdict"] == "running"]
    index = {spec.name: i for i, spec in enumerate(comparison.specs)}
    runs = {index[name] for e in running for name in claim_runs(e)}
    if not runs:
        return False
    current = min(len(comparison.seeds_of(i)) for i in runs)
    later = [size for size in sizes if size > current]
    if not later or any(e["sequential"]["n"] < current for e in running):
        return False
    return comparison.add_seeds(runs, later[0])


def replay_looks(comparison: Comparison) -> None:
    """Bring a comparison read from its folder to the look its finished units reached (the same looks its run took)."""
    while next_look(comparison):
        pass


def _ended(progress: Progress, comparison: Comparison, unit: Any, state: str, note: str, unit_hash: str) -> None:
    result = UnitFolder(comparison.unit_dir(unit), comparison.key(unit)).finished(unit_hash) if state == "finished" else None
    if state == "retrying":  # its process died: it runs again and stays among the remaining units
        comparison.say(f"{comparison.key(unit)} died ({note})")
        return
    progress.finished(unit, state, result, note)


def unit_states(comparison: Comparison) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(key, status, state) of every unit of the comparison, in start order (see `units.status`; a unit that
    never started because the unit it depends on did not finish is ``skipped``)."""
    out, seen = [], {}
    for unit in comparison.all_units():  # a unit comes after the one it depends on
        key = comparison.key(unit)
        state = UnitFolder(comparison.unit_dir(unit), key).read()
        seen[key] = status(state, comparison.unit_hash(unit))
        parent = unit.depends_on() and comparison.key(unit.depends_on())
        if seen[key] == "missing" and parent and seen[parent] in ("failed", "died", "skipped"):
            seen[key], state = "skipped", {"error": f"after {parent}"}
        out.append((key, seen[key], state))
    return out


def report_from_folder(comparison: Comparison, session: Any = None, how: str = "finished") -> str:
    """Rebuild the report (``results.*``, plots, ``manifest.json``, ``units.md``) from the units' folders and the
    sessions' records; the units that are not finished are listed as missing, running, failed or stale. ``session``:
    this process's `vlkit.compare.account.Session`, ended ``how`` as the report takes the account. Returns the table
    and the account's line."""
    from vlkit.compare.account import account, spent_plan
    from vlkit.compare.manifest import write_manifest
    from vlkit.compare.plots import plot_alignment
    from vlkit.compare.report import account_line, units_markdown, write_outputs
    from vlkit.io import atomic_write_text
    from vlkit.objectives.mix import mix_objectives
    from vlkit.registry import OBJECTIVES
    from vlkit.train import pipeline

    cfg, output_dir = comparison.cfg, comparison.output_dir
    replay_looks(comparison)
    states = unit_states(comparison)
    done = finished_results(comparison, states)
    plan = spent_plan(comparison, done)
    unfinished = sum(st != "finished" for _, st, _ in states)
    if not done:
        if session is not None:
            session.end(how)
        units = units_markdown(output_dir, states, account(comparison, plan))
        atomic_write_text(output_dir / "units.md", units)
        return units
    records, audit, curves = comparison.collect(done)
    expected = cfg.get("expected_data_hash")
    if expected and expected != audit["data_hash"] and len(done) == len(states):
        raise RuntimeError(f"the data differ from the manifest's (hash {audit['data_hash'][:12]} != {expected[:12]})")
    shown = next((s for i, s in enumerate(comparison.specs) if s.objectives is not None
                  and any(OBJECTIVES.get(name).alignment_title for name in mix_objectives(objective_mix(s)))
                  and any(u.is_pretrain and u.run == i and u.seed == cfg["compare"]["seeds"][0] for u in done)), None)
    if shown is not None:  # the word-region alignment (WRA's transport plan) of the first run that shows one
        run_dir = output_dir / "runs" / shown.name / f"seed{cfg['compare']['seeds'][0]}" / "pretrain"
        plot_alignment(output_dir, pipeline.load_pretraining(run_dir), comparison.environment(shown))
    store = next((env.data["image"].get("path") for env in comparison._environments.values()
                  if env.data["image"].get("source") == "features"), None)
    costs = None
    if cfg["compare"].get("claims"):  # what the seeds a claim needs would cost
        from vlkit.compare.plan import seed_costs

        costs = seed_costs(comparison, plan)
    if session is not None:  # the account's last figure: this session's span
        session.end(how)
    acct = account(comparison, plan)
    atomic_write_text(output_dir / "units.md", units_markdown(output_dir, states, acct))
    write_manifest(output_dir, cfg, audit, store, acct, complete=len(done) == len(states))
    table = write_outputs(output_dir, cfg, records, audit, curves, acct, costs) + "\n\n" + account_line(acct)
    if unfinished:
        table += f"\n\n{unfinished} of {len(states)} units are not finished: see {output_dir / 'units.md'}"
    return table


def report_main(cfg: Any) -> int:
    """`vlkit compare-report output_dir=D`: the report of the comparison in D from its units' folders."""
    from vlkit.config import plain

    output_dir = Path(plain(cfg)["output_dir"])
    plan = output_dir / PLAN_FILE
    if not plan.is_file():
        raise FileNotFoundError(f"{plan} is missing: {output_dir} is not the output_dir of a vlkit comparison")
    from vlkit.compare.units import PLAN_DAMAGED
    from vlkit.io import read_json

    comparison = Comparison(read_json(plan, PLAN_DAMAGED)["config"], output_dir, progress=False)
    print(report_from_folder(comparison))
    return 0


__all__ = ["Comparison", "HEADLINE", "RunSpec", "digest", "finished_records", "look_sizes_of", "main", "mean_ci",
           "next_look", "objective_mix", "paired_p_value", "replay_looks", "report_from_folder", "report_main",
           "resolve_config", "run_specs", "summarize", "task_cfg", "unit_states"]
