"""The commands of a comparison: `vlkit compare` (`main`: check everything, write the plan, run this session's units
on the executor, then the report) and `vlkit compare-report` (`report_main`); the plan file ``plan.json`` (what a
resume must match, `RESUME_SAFE` aside) and the report rebuilt from the units' folders (`report_from_folder`)."""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from vlkit.compare.account import Session, guarded, heartbeat_s, settled, spent_costs
from vlkit.compare.claims import check_claims
from vlkit.compare.comparison import Comparison
from vlkit.compare.config import objective_mix
from vlkit.compare.costs import seed_costs
from vlkit.compare.estimate import dry_run
from vlkit.compare.executor_base import run_keys
from vlkit.compare.executors import ExecutorSettings
from vlkit.compare.looks import replay_looks
from vlkit.compare.manifest import write_manifest
from vlkit.compare.plots import plot_alignment
from vlkit.compare.preregistration import PREREGISTERED, check_preregistered, preregistration
from vlkit.compare.records import collect, finished_results, unit_states
from vlkit.compare.report import account_line, account_notes, units_markdown, write_outputs
from vlkit.compare.scheduler import run_session
from vlkit.compare.spec import CompareSpec
from vlkit.compare.units import PLAN_DAMAGED, PLAN_FILE, changed_keys
from vlkit.config import plain
from vlkit.digests import known, remember
from vlkit.io import atomic_write_text, clean_json, dump_json, read_json
from vlkit.locks import hold
from vlkit.objectives.mix import mix_objectives
from vlkit.registry import EXECUTORS, OBJECTIVES
from vlkit.runtime import every
from vlkit.train import pipeline


# Keys a resumed comparison may change: where and how units run, not what they compute (with each executor's
# resume-safe keys of its block, `vlkit.compare.executor_base.run_keys`).
RESUME_SAFE = ("output_dir", "resume", "dry_run", "progress", "workers", "cache_dir", "manifest",
               "expected_data_hash", "compare.retries", "compare.executor", "compare.plan",
               "compare.probe", "compare.heartbeat_s")
# (the pre-registered analysis, `vlkit.compare.preregistration.PREREGISTERED`, is checked on its own: never changed)


def saved_plan(cfg: dict[str, Any], output_dir: Path, resume: bool) -> dict[str, Any] | None:
    """The checks of `write_plan`, which write nothing: the plan saved in ``output_dir`` when resuming (None for a new
    comparison); a folder that holds something else, or a changed configuration, is refused."""
    path = output_dir / PLAN_FILE
    if not (output_dir.exists() and any(output_dir.iterdir())):
        return None
    if not resume:
        raise FileExistsError(f"{output_dir} is not empty: pass resume=true to go on with the comparison in it, "
                              "or choose another output_dir= (results are never overwritten)")
    if not path.is_file():
        raise FileNotFoundError(f"resume=true: {output_dir} holds no {PLAN_FILE}, so it is not a vlkit comparison")
    saved = read_json(path, PLAN_DAMAGED)
    check_preregistered(saved, cfg["compare"], path)
    changed = changed_keys(saved["config"], json.loads(dump_json(_planned(cfg))),
                           RESUME_SAFE + run_keys() + PREREGISTERED)
    if changed:
        raise ValueError(f"resume=true: the configuration differs from the one {output_dir} was started with "
                         f"({path}); changed: " + "; ".join(changed) + ". Rerun with the original settings, or "
                         "use another output_dir")
    return saved


def _planned(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k not in ("output_dir", "resume", "dry_run")}


def write_plan(cfg: dict[str, Any], output_dir: Path, argv: list[str], resume: bool,
          digests: dict[str, Any] | None = None) -> Path:
    """Write ``plan.json`` (the resolved config, the command and the ``digests`` of the input files, `vlkit.digests`)
    or, resuming, check the saved one (`saved_plan`): a changed configuration is refused naming each key that
    changed (`RESUME_SAFE` keys may change, and the plan then holds their new values and the resuming command).
    Every check comes before the first write."""
    path = output_dir / PLAN_FILE
    saved = saved_plan(cfg, output_dir, resume)
    record = {"config": _planned(cfg), "argv": argv, "digests": digests or {},
              "preregistered": preregistration(cfg["compare"])}
    if saved is None:
        output_dir.mkdir(parents=True, exist_ok=True)
        record["created"] = time.time()
    # resuming: the resume-safe keys as this session sets them (its workers and later reports read them from here)
    atomic_write_text(path, dump_json({**(saved or {}), **record}))
    return path


@dataclass
class ComparisonResult:
    """What `main` left: ``output_dir``, ``table`` (``results.md``), ``records`` (every metric of every run and
    seed, ``results.json``'s records), ``summary`` (the rest of ``results.json``: means, CIs, tests) and ``code``:
    0 when every unit finished, 1 when some did not (``failed``: unit -> its error), 128 + N when signal N stopped
    the session; ``retry``: how to go on."""

    output_dir: Path
    table: str
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    code: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    retry: str = ""


def main(spec: CompareSpec) -> ComparisonResult:
    """Run the comparison ``spec`` (`vlkit.compare.spec.CompareSpec`): check everything, write the plan, run this
    session's units on the executor (holding the output folder's lock, `vlkit.locks`), then the report."""
    output_dir = Path(spec.output_dir or Path("outputs") / "compare" / datetime.now().strftime("%Y%m%d-%H%M%S"))
    writes = {} if spec.config.get("dry_run") or int(os.environ.get("RANK", "0") or 0) else {"output_dir": output_dir}
    with hold(writes, command=_invocation(spec)):  # one writer per comparison folder
        return _main(spec, output_dir)


def _invocation(spec: CompareSpec) -> str:
    return shlex.join(["vlkit", "compare", *spec.argv]) if spec.argv is not None else "vlkit.compare(...)"


def _main(spec: CompareSpec, output_dir: Path) -> ComparisonResult:
    import torch

    started = time.time() if spec.started is None else spec.started
    cfg, compare = spec.config, spec.compare
    settings = ExecutorSettings(cfg)
    heartbeat = heartbeat_s(compare)
    torch.set_num_threads(settings.threads)
    comparison = Comparison(cfg, Path(cfg.get("output_dir") or "."), progress=cfg.get("progress", True))
    check_claims(compare.get("claims") or [], [s.name for s in comparison.specs])
    preregistration(compare)  # the looks, alpha and budget, checked
    comparison.check_models()
    comparison.check_task_sources()
    comparison.check_trainers()
    executor_cls = EXECUTORS.get(compare.get("executor") or "local")
    if not cfg.get("dry_run"):  # a dry run plans for the machines it will run on, not for this one
        executor_cls.check(settings)  # its extra importable, its settings known: before any file is written
    if cfg.get("resume") and (output_dir / PLAN_FILE).is_file():  # the digests of the last session: big files read once
        remember(saved_plan(cfg, output_dir, True).get("digests"))
    for unit in comparison.all_units():  # every unit's identity: its settings and the content of its input files
        comparison.unit_hash(unit)
    if cfg.get("dry_run"):
        table = dry_run(comparison, settings)
        if not spec.quiet:
            print(table)
        return ComparisonResult(output_dir, table, [], {})
    comparison.output_dir = output_dir
    argv = list(spec.argv or [])
    saved_plan(cfg, output_dir, bool(cfg.get("resume")))  # the folder's checks, before the data work
    _prepare_environments(comparison, settings)
    plan_path = write_plan(cfg, output_dir, argv, bool(cfg.get("resume")), known())
    session = Session.begin(output_dir, started, _invocation(spec), compare.get("executor") or "local")
    try:
        with every(heartbeat, session.beat):
            outcomes, stopped_by = run_session(comparison, executor_cls, plan_path, settings)
        bad = {k: o for k, o in outcomes.items() if o["state"] != "finished"}
        how = (f"stopped by {signal.Signals(stopped_by[0]).name}" if stopped_by else
               f"{len(bad)} unit(s) did not finish" if bad else "finished")
        table, records = report_from_folder(comparison, session, how, with_records=True)
    except BaseException as err:
        if session.record["ended"] is None:
            session.end(f"error: {type(err).__name__}")
        raise
    retry = retry_command(argv, output_dir) if spec.argv is not None else "the same call with resume=True"
    summary = read_json(output_dir / "results.json", "results.json") if (output_dir / "results.json").is_file() else {}
    summary.pop("records", None)
    written = output_dir / "results.md"
    result = ComparisonResult(output_dir, written.read_text(encoding="utf-8") if written.is_file() else table,
                              clean_json(records), summary, retry=retry,
                              failed={k: o.get("error") or o["state"] for k, o in bad.items()})
    if stopped_by:
        print(f"vlkit compare: {how}; finished units are kept in {output_dir}. Go on with:\n  {retry}", file=sys.stderr)
        return dataclasses.replace(result, code=128 + stopped_by[0])
    if not spec.quiet:
        print(f"\n{table}\n\nresults in {output_dir} (tests, chance levels and verdicts: {output_dir / 'results.md'})")
    if bad:
        lines = [f"  {k}: {o['state']}: {o.get('error') or ''}" for k, o in bad.items()]
        print(f"vlkit compare: {how} (every other unit did):\n" + "\n".join(lines)
              + f"\nEach failed unit's traceback.txt and unit.log are in its folder under {output_dir / 'runs'}. "
              f"After fixing the cause, rerun them (and their dependents only) with:\n  {retry}", file=sys.stderr)
        return dataclasses.replace(result, code=1)
    return result


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


def report_from_folder(comparison: Comparison, session: Any = None, how: str = "finished",
                       with_records: bool = False) -> Any:
    """Rebuild the report (``results.*``, plots, ``manifest.json``, ``units.md``) from the units' folders and the
    sessions' records; the units that are not finished are listed as missing, running, failed or stale. ``session``:
    this process's `vlkit.compare.account.Session`, ended ``how`` as the report takes the account. Returns the table
    and the account's line (and every run's records, with ``with_records``). A failure of the account (pricing the
    units' FLOPs, reading the sessions) costs no record: the report is written, its account saying what failed
    (`vlkit.compare.account.guarded`)."""
    cfg, output_dir = comparison.cfg, comparison.output_dir
    replay_looks(comparison)
    states = unit_states(comparison)
    done = finished_results(comparison, states)
    spent, why = guarded("the FLOP costs of the units", lambda: spent_costs(comparison, done))
    failed = [why] if why else []
    unfinished = sum(st != "finished" for _, st, _ in states)
    if not done:
        if session is not None:
            session.end(how)
        acct = settled(comparison, spent, failed)
        units = units_markdown(output_dir, states, acct)
        atomic_write_text(output_dir / "units.md", units)
        shown = "\n".join([units, *account_notes(acct)])
        return (shown, []) if with_records else shown
    records, audit, curves = collect(comparison, done)
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
    if cfg["compare"].get("claims") and spent is not None:  # what the seeds a claim needs would cost
        costs, why = guarded("the cost of more seeds", lambda: seed_costs(comparison, spent))
        failed += [why] if why else []
    if session is not None:  # the account's last figure: this session's span
        session.end(how)
    acct = settled(comparison, spent, failed)
    atomic_write_text(output_dir / "units.md", units_markdown(output_dir, states, acct))
    write_manifest(output_dir, cfg, audit, store, acct, complete=len(done) == len(states))
    table = write_outputs(output_dir, cfg, records, audit, curves, acct, costs) + "\n\n" + account_line(acct)
    if unfinished:
        table += f"\n\n{unfinished} of {len(states)} units are not finished: see {output_dir / 'units.md'}"
    return (table, records) if with_records else table


def report_main(cfg: Any) -> int:
    """`vlkit compare-report output_dir=D`: the report of the comparison in D from its units' folders."""
    output_dir = Path(plain(cfg)["output_dir"])
    plan = output_dir / PLAN_FILE
    if not plan.is_file():
        raise FileNotFoundError(f"{plan} is missing: {output_dir} is not the output_dir of a vlkit comparison")
    comparison = Comparison(read_json(plan, PLAN_DAMAGED)["config"], output_dir, progress=False)
    print(report_from_folder(comparison))
    return 0


def retry_command(argv: list[str], output_dir: Path) -> str:
    """The one command that reruns what did not finish: the same overrides, the same folder, resume."""
    kept = [a for a in argv if not a.startswith(("output_dir=", "resume="))]
    return shlex.join(["vlkit", "compare", *kept, f"output_dir={output_dir}", "resume=true"])
