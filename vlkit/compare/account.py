"""What a comparison spent, across every session, beside what it planned.

A session is one run of `vlkit compare` on a folder: the first, each ``resume=true``, on any executor. It writes
its own record, ``sessions/NNN.json`` (start, host, pid, executor, command; ``last_seen`` every
``compare.heartbeat_s`` seconds; its end and how it ended), and never touches an earlier one. A session that was
killed (SIGKILL, a lost node) has no end: its span runs to its last heartbeat. Every attempt of every unit is
kept in the unit's ``unit.json`` (`vlkit.compare.units`), tagged with the session that started it.

`account` adds them up: wall time (the sessions' spans), unit-seconds (every attempt's wall, the died, failed and
retried ones included; those are the wasted part), device-hours (unit-seconds x the devices each unit held), and
beside them the FLOP costs of the same units (`vlkit.compare.costs`) on the device they ran on: planned hours and the
MFU the run achieved (planned FLOPs / (spent seconds x the device's peak)), the figure to set ``compare.plan.mfu``
from.

It trusts no record: one that is not JSON or not of its shape, whose span ends before it starts, or that is dated
more than `SKEW_S` ahead of this clock is set aside (``set_aside``: file and why, shown in results.md and by
`vlkit compare-report`); an unfinished record counts as running only while the process of its pid is the one that
wrote it (`own_process`). A failure of the pricing or of the account costs no record (`guarded`): the report is
written, its account saying what failed (``not_accounted``).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

import psutil

from vlkit.compare.comparison import describe
from vlkit.compare.config import unit_threads
from vlkit.compare.costs import cost_settings, count_costs
from vlkit.compare.executor_base import unit_nodes
from vlkit.compare.units import UnitFolder, close_attempt
from vlkit.flops.devices import choose_device
from vlkit.io import UnreadableFileError, atomic_write_text, dump_json
from vlkit.locks import START_TOLERANCE_S
from vlkit.runtime import process_started

SESSIONS_DIR = "sessions"
HEARTBEAT_S = 10.0  # compare.heartbeat_s unset


def heartbeat_s(compare: dict[str, Any]) -> float:
    """``compare.heartbeat_s``: how often a session and each running unit record that they are alive."""
    value = compare.get("heartbeat_s", HEARTBEAT_S)
    value = HEARTBEAT_S if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"compare.heartbeat_s={value!r}: a positive number of seconds, e.g. 10")
    return float(value)


def _session_path(output_dir: Path, number: int) -> Path:
    return Path(output_dir) / SESSIONS_DIR / f"{number:03d}.json"


def latest_session(output_dir: str | Path) -> int | None:
    """The number of the newest session of the comparison in ``output_dir`` (the one running now), None before any."""
    numbers = [int(p.stem) for p in (Path(output_dir) / SESSIONS_DIR).glob("*.json") if p.stem.isdigit()]
    return max(numbers, default=None)


class Session:
    """This run of `vlkit compare` on ``output_dir``: its record, written when it begins (`begin`), refreshed by
    `beat` and closed by `end`."""

    def __init__(self, output_dir: Path, record: dict[str, Any]):
        self.path, self.record = _session_path(output_dir, record["session"]), record

    @classmethod
    def begin(cls, output_dir: Path, started: float, command: str, executor: str) -> "Session":
        """Take the next session number (exclusively: two processes never share one) and write its record (with
        its process's start, ``pid_started``: a reader tells this process from a later one given the same pid)."""
        (Path(output_dir) / SESSIONS_DIR).mkdir(parents=True, exist_ok=True)
        number = (latest_session(output_dir) or 0) + 1
        while True:
            try:
                fd = os.open(_session_path(output_dir, number), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileExistsError:
                number += 1
        os.close(fd)
        now = time.time()
        session = cls(output_dir, {"session": number, "started": min(started, now), "last_seen": now, "ended": None,
                                   "end": None, "host": socket.gethostname(), "pid": os.getpid(),
                                   "pid_started": process_started(), "executor": executor, "command": command})
        session.write()
        return session

    def write(self) -> None:
        atomic_write_text(self.path, dump_json(self.record))

    def beat(self) -> None:
        self.record["last_seen"] = time.time()
        self.write()

    def end(self, how: str) -> None:
        """Close the record: ``how`` it ended (finished, units that did not finish, stopped by a signal, an error).
        A session ends when its report takes the account (`vlkit.compare.command.report_from_folder`): the plots and files
        written after it, and the interpreter's exit, are not counted."""
        self.record.update(last_seen=time.time(), ended=time.time(), end=how)
        self.write()


SKEW_S = 300.0  # how far a record's times may run ahead of the reading clock (two hosts' clocks) before it is set aside
SESSION_KEYS = {"session": int, "started": float, "last_seen": float, "ended": (float, type(None)),
                "end": (str, type(None)), "host": str, "pid": int, "executor": str, "command": str}
ATTEMPT_KEYS = {"attempt": int, "host": str, "pid": int, "started": float, "state": str}
ATTEMPT_STATES = ("running", "finished", "failed", "died")
OPTIONAL_KEYS = {"pid_started": float}  # absent from the records of an older vlkit


def own_process(pid: int, pid_started: float | None, started: float) -> bool:
    """Whether the live process ``pid`` of this host is the vlkit process that wrote a record begun at ``started``:
    it started when the record says (``pid_started``, `vlkit.runtime.process_started`); for a record written before
    vlkit recorded that, it started before the record and its command line names vlkit. A reused pid is not."""
    try:
        began = process_started(pid)
        if pid_started is not None:
            return abs(began - pid_started) <= START_TOLERANCE_S
        return began <= started + START_TOLERANCE_S and any("vlkit" in part for part in psutil.Process(pid).cmdline())
    except (ProcessLookupError, PermissionError, psutil.Error):  # gone, or another user's: not this folder's writer
        return False


def alive(host: str, pid: int, last_seen: float | None, heartbeat: float, pid_started: float | None = None,
          started: float = 0.0) -> bool:
    """Whether a session's or an attempt's process lives: on this host, its pid, when that process is the one that
    wrote the record (`own_process`); elsewhere, a heartbeat under three beats (and half a minute) old."""
    if host == socket.gethostname():
        return own_process(pid, pid_started, started)
    return last_seen is not None and time.time() - last_seen < 3 * heartbeat + 30


def record_problem(record: Any, keys: dict[str, Any], now: float) -> str | None:
    """Why a session's or an attempt's record cannot be counted, None when it can: not a mapping, a key missing or
    of the wrong type (``keys``: name -> type; `OPTIONAL_KEYS` when present), a span that ends before it starts, a time ahead of ``now`` by more
    than `SKEW_S`."""
    if not isinstance(record, dict):
        return f"holds a {type(record).__name__}, not a record (a mapping)"
    missing = [k for k in keys if k not in record]
    if missing:
        return f"lacks the key(s) {', '.join(missing)}"
    for key, kind in {**keys, **{k: v for k, v in OPTIONAL_KEYS.items() if k in record}}.items():
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not any(_is(record[key], k) for k in kinds):
            return f"{key}={record[key]!r} is not {'a time' if float in kinds else 'a ' + kinds[0].__name__}"
    times = {k: record[k] for k in ("started", "last_seen", "ended") if isinstance(record.get(k), (int, float))}
    for key, value in times.items():
        if key != "started" and value < times["started"]:
            return f"ends before it starts ({key} {_clock(value)} < started {_clock(times['started'])})"
    ahead = {k: v - now for k, v in times.items() if v - now > SKEW_S}
    if ahead:
        key, by = max(ahead.items(), key=lambda kv: kv[1])
        return (f"{key} {_clock(record[key])} is {by:,.0f} s ahead of this machine's clock (more than the "
                f"{SKEW_S:.0f} s two clocks may differ by)")
    return None


def _is(value: Any, kind: type) -> bool:
    """``isinstance`` where a time (float) may be written as a whole number and a bool is no number."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _note(set_aside: list[dict[str, str]] | None, path: Path, root: Path, why: str) -> None:
    if set_aside is not None:
        set_aside.append({"file": str(path.relative_to(root)) if path.is_relative_to(root) else str(path), "why": why})


def read_sessions(output_dir: Path, heartbeat: float = HEARTBEAT_S, set_aside: list[dict[str, str]] | None = None
                  ) -> list[dict[str, Any]]:
    """Every session's record, oldest first, with its span (``span_s``). A session without an end is ``running``
    (its span so far) while its process lives (`alive`), else ``killed`` (its span ends at its last heartbeat). A
    record that cannot be counted (`record_problem`, or not JSON) is left out and appended to ``set_aside`` with its
    file and why; an empty one is a session killed before its first write, which ran nothing."""
    out, now = [], time.time()
    for path in sorted((Path(output_dir) / SESSIONS_DIR).glob("*.json")):
        try:
            text = path.read_text(encoding="utf-8")
            if not text.strip():
                continue
            record = json.loads(text)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
            _note(set_aside, path, Path(output_dir), f"not a readable JSON record (truncated or edited: {err})")
            continue
        why = record_problem(record, SESSION_KEYS, now)
        if why is not None:
            _note(set_aside, path, Path(output_dir), why)
            continue
        end = record["ended"]
        if end is None:
            running = alive(record["host"], record["pid"], record["last_seen"], heartbeat, record.get("pid_started"),
                            record["started"])
            end = now if running else record["last_seen"]
            record["end"] = "running" if running else "killed"
        record["span_s"] = max(0.0, end - record["started"])  # a running one begun within the clocks' skew
        out.append(record)
    return out


def unit_attempts(comparison: Any, set_aside: list[dict[str, str]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Unit key -> every attempt it made (``wall_s`` each); an attempt still marked running is ``died`` when its
    process is gone (`alive`; ended at its last heartbeat), else ``running`` (so far). What cannot be counted is
    left out and appended to ``set_aside`` (file, why): an unreadable ``unit.json``, an attempt that fails
    `record_problem`, a heartbeat dated ahead of this clock (the attempt then ends at its start)."""
    heartbeat = heartbeat_s(comparison.compare)
    root, now = comparison.output_dir, time.time()
    out = {}
    for unit in comparison.all_units():
        folder = UnitFolder(comparison.unit_dir(unit), comparison.key(unit))
        try:
            state = folder.read()
        except UnreadableFileError as err:
            _note(set_aside, folder.path, root, f"not a readable JSON record ({str(err).splitlines()[0]})")
            continue
        if state is None:
            continue
        history = state.get("attempts", []) if isinstance(state, dict) else None
        if not isinstance(history, list):
            _note(set_aside, folder.path, root, "holds no list of attempts" if isinstance(state, dict) else
                  f"holds a {type(state).__name__}, not a unit's record (a mapping)")
            continue
        last_seen = folder.last_seen()
        if last_seen is not None and last_seen - now > SKEW_S:
            _note(set_aside, folder.heartbeat, root, f"dated {_clock(last_seen)}, {last_seen - now:,.0f} s ahead of "
                  f"this machine's clock (more than {SKEW_S:.0f} s): not used, its attempt ends at its start")
            last_seen = None
        attempts = []
        for i, attempt in enumerate(history):
            why = record_problem(attempt, ATTEMPT_KEYS, now)
            if why is None and attempt["state"] not in ATTEMPT_STATES:
                why = f"state={attempt['state']!r}, not one of {', '.join(ATTEMPT_STATES)}"
            if why is None and attempt["state"] != "running":
                why = record_problem(attempt, {"ended": float}, now)
            if why is not None:
                _note(set_aside, folder.path, root, f"attempts[{i}] {why}")
                continue
            if attempt["state"] == "running":
                running = alive(attempt["host"], attempt["pid"], last_seen, heartbeat, attempt.get("pid_started"),
                                attempt["started"])
                attempt = {**attempt, "ended": max(attempt["started"], last_seen or attempt["started"])} if running \
                    else close_attempt(attempt, last_seen)
            attempts.append({**attempt, "wall_s": attempt["ended"] - attempt["started"]})
        out[comparison.key(unit)] = attempts
    return out


def _session_tallies(number: int, attempts: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """What session ``number`` did: the units whose attempt it started finished, failed, died or still runs, and
    ``retried``: the units it started again after an earlier attempt died; each as a count and (``units``) the keys."""
    units: dict[str, list[str]] = {"finished": [], "failed": [], "died": [], "running": [], "retried": []}
    for key, history in attempts.items():
        for i, attempt in enumerate(history):
            if attempt.get("session") == number:
                units[attempt["state"]].append(key)
                if i > 0 and history[i - 1]["state"] == "died":
                    units["retried"].append(key)
    return {**{state: len(keys) for state, keys in units.items()}, "units": units}


FLOPS_FILE = "flops.json"  # a comparison's FLOPs per step by what was counted: each counted once per folder


def spent_costs(comparison: Any, results: dict[Any, dict[str, Any]]) -> Any:
    """The FLOP costs of the comparison's units (`vlkit.compare.costs.count_costs`, ``compare.plan``'s MFU and shapes)
    on the device they ran on (`vlkit.flops.devices.choose_device` with the GPUs the finished units recorded,
    ``machine.device``). The FLOPs counted are kept in the folder (``flops.json``), so a later report counts only
    what is new."""
    compare = comparison.compare
    settings = cost_settings(compare)
    gpus = int(compare.get("gpus_per_unit") or 0)
    ran_on = [r["machine"].get("device", "") for r in results.values() if "machine" in r]
    settings["device"] = choose_device(settings["device"], gpus, ran_on)
    path = comparison.output_dir / FLOPS_FILE
    try:
        counted = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        counted = {}  # none yet, or cut short: counted again
    known = len(counted)
    costs = count_costs(comparison, settings, gpus, unit_threads(comparison.cfg),
                       unit_nodes(compare), counted)
    if len(counted) > known:
        atomic_write_text(path, dump_json(counted))
    return costs


def account(comparison: Any, costs: Any) -> dict[str, Any]:
    """The comparison's account: its sessions, totals and each unit's spend beside ``costs`` (`spent_costs`; None when
    they could not be counted: spent without planned); see the module docstring. ``set_aside``: the records it did not
    count, each ``{"file", "why"}`` (`read_sessions`, `unit_attempts`)."""
    set_aside: list[dict[str, str]] = []
    sessions = read_sessions(comparison.output_dir, heartbeat_s(comparison.compare), set_aside)
    attempts = unit_attempts(comparison, set_aside)
    planned = costs.by_key() if costs is not None else {}
    units: dict[str, dict[str, Any]] = {}
    for key, history in attempts.items():
        row = planned.get(key)
        devices = row.devices if row else 1
        spent = sum(a["wall_s"] for a in history)
        finished = bool(history) and history[-1]["state"] == "finished"
        units[key] = {"attempts": len(history), "state": history[-1]["state"] if history else "missing",
                      "unit_s": spent, "wasted_s": sum(a["wall_s"] for a in history if a["state"] in ("died", "failed")),
                      "devices": devices, "device_hours": spent * devices / 3600,
                      "planned_flops": row.flops if row else None, "planned_hours": row.hours if row else None,
                      "precision": row.precision if row else None,
                      "mfu": row.flops / (spent * devices * costs.device.peak(row.precision))
                      if row and finished and spent > 0 else None}
    for session in sessions:
        session.update(_session_tallies(session["session"], attempts))
    device_seconds = sum(u["unit_s"] * u["devices"] for u in units.values())
    done = [u for u in units.values() if u["mfu"]]
    peak_seconds = sum(u["planned_flops"] / u["mfu"] for u in done)
    every = [a for history in attempts.values() for a in history]
    return {
        "sessions": sessions,
        "wall_s": sum(s["span_s"] for s in sessions),
        "unit_s": sum(u["unit_s"] for u in units.values()),
        "wasted_unit_s": sum(u["wasted_s"] for u in units.values()),
        "attempts": len(every),
        **{state: sum(a["state"] == state for a in every) for state in ("died", "failed")},
        "device_hours": device_seconds / 3600,
        "wasted_device_hours": sum(u["wasted_s"] * u["devices"] for u in units.values()) / 3600,
        "plan": None if costs is None else {"device": costs.device.name, "mfu": costs.mfu,
                                            "mfu_source": costs.mfu_source, "flops": costs.flops,
                                            "device_hours": costs.hours},
        "mfu": sum(u["planned_flops"] for u in done) / peak_seconds if peak_seconds else None,
        "units": units,
        "set_aside": set_aside,
        "not_accounted": [],
    }


def guarded(what: str, work: Callable[[], Any]) -> tuple[Any, str | None]:
    """``(work(), None)``, or ``(None, why)`` when it raised: the account prices and rebuilds every run's units, and
    a failure there must never cost the report of the units that finished (their records are on disk already)."""
    try:
        return work(), None
    except Exception as err:  # noqa: BLE001 - any failure: the report is written, saying what failed
        why = f"{what} failed: {type(err).__name__}: {describe(err)}"
        print(f"vlkit compare: {why}; the report is written without it", file=sys.stderr, flush=True)
        return None, why


def settled(comparison: Any, costs: Any, failed: list[str]) -> dict[str, Any]:
    """`account` with ``not_accounted``: what could not be made (``failed``: the costs' pricing; the account itself,
    `guarded`); when the account itself failed, one that knows nothing (its figures None) and says so."""
    acct, why = guarded("the account of what it spent", lambda: account(comparison, costs))
    if acct is None:
        acct = {"sessions": [], "units": {}, "plan": None, "wall_s": None, "mfu": None, "set_aside": []}
    acct["not_accounted"] = [*failed, *([why] if why else [])]
    return acct


__all__ = ["FLOPS_FILE", "HEARTBEAT_S", "SESSIONS_DIR", "SKEW_S", "Session", "account", "alive", "guarded",
           "heartbeat_s", "latest_session", "own_process", "read_sessions", "record_problem", "settled", "spent_costs",
           "unit_attempts"]
