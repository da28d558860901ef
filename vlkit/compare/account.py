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
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from vlkit.compare.units import UnitFolder, close_attempt

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
        """Take the next session number (exclusively: two processes never share one) and write its record."""
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
                                   "end": None, "host": socket.gethostname(), "pid": os.getpid(), "executor": executor,
                                   "command": command})
        session.write()
        return session

    def write(self) -> None:
        from vlkit.compare.report import dump_json
        from vlkit.io import atomic_write_text

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


def alive(host: str, pid: int, last_seen: float | None, heartbeat: float) -> bool:
    """Whether a session's or an attempt's process lives: on this host, its pid; elsewhere, a heartbeat under three
    beats (and half a minute) old."""
    from vlkit.runtime import pid_alive

    if host == socket.gethostname():
        return pid_alive(pid)
    return last_seen is not None and time.time() - last_seen < 3 * heartbeat + 30


def read_sessions(output_dir: Path, heartbeat: float = HEARTBEAT_S) -> list[dict[str, Any]]:
    """Every session's record, oldest first, with its span (``span_s``). A session without an end is ``running``
    (its span so far) while its process lives (`alive`), else ``killed`` (its span ends at its last heartbeat)."""
    out, now = [], time.time()
    for path in sorted((Path(output_dir) / SESSIONS_DIR).glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue  # a session whose first write was cut short: it ran nothing
        end = record["ended"]
        if end is None:
            running = alive(record["host"], record["pid"], record["last_seen"], heartbeat)
            end = now if running else record["last_seen"]
            record["end"] = "running" if running else "killed"
        record["span_s"] = max(0.0, end - record["started"])
        out.append(record)
    return out


def unit_attempts(comparison: Any) -> dict[str, list[dict[str, Any]]]:
    """Unit key -> every attempt it made (``wall_s`` each); an attempt still marked running is ``died`` when its
    process is gone (`alive`; ended at its last heartbeat), else ``running`` (so far)."""
    heartbeat = heartbeat_s(comparison.compare)
    out = {}
    for unit in comparison.all_units():
        folder = UnitFolder(comparison.unit_dir(unit), comparison.key(unit))
        state = folder.read()
        if not state:
            continue
        attempts = []
        for attempt in state.get("attempts", []):
            if attempt["state"] == "running":
                running = alive(attempt["host"], attempt["pid"], folder.last_seen(), heartbeat)
                attempt = {**attempt, "ended": folder.last_seen() or attempt["started"]} if running else \
                    close_attempt(attempt, folder.last_seen())
            attempts.append({**attempt, "wall_s": max(0.0, attempt["ended"] - attempt["started"])})
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
    from vlkit.compare.config import unit_threads
    from vlkit.compare.costs import cost_settings, count_costs
    from vlkit.compare.executor_base import unit_nodes
    from vlkit.compare.report import dump_json
    from vlkit.flops.devices import choose_device
    from vlkit.io import atomic_write_text

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
    """The comparison's account: its sessions, totals and each unit's spend beside ``costs`` (`spent_costs`); see the
    module docstring."""
    sessions = read_sessions(comparison.output_dir, heartbeat_s(comparison.compare))
    attempts = unit_attempts(comparison)
    planned = costs.by_key()
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
        "plan": {"device": costs.device.name, "mfu": costs.mfu, "mfu_source": costs.mfu_source, "flops": costs.flops,
                 "device_hours": costs.hours},
        "mfu": sum(u["planned_flops"] for u in done) / peak_seconds if peak_seconds else None,
        "units": units,
    }


__all__ = ["FLOPS_FILE", "HEARTBEAT_S", "SESSIONS_DIR", "Session", "account", "alive", "heartbeat_s", "latest_session", "read_sessions",
           "spent_costs", "unit_attempts"]
