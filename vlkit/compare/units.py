"""The units of a comparison and their durable state on disk.

A unit is one pre-training, or one fine-tuning of one variant (``pretrained`` / ``scratch``) on one task.
Each has its own folder ``<output_dir>/runs/<run>/seed<S>/<stage>`` (the trainer's output_dir) holding
``unit.json``: its state (``running``, ``finished``, ``failed``, ``died``: its process was lost, the executor's
reason recorded), the hash of its resolved configuration,
and, once finished, its result (metrics, costs, data digests, ids seen); a failed unit also leaves
``traceback.txt``; every attempt appends to ``unit.log``. Files are replaced atomically, so a reader (the
report, a resumed comparison) never sees half a state.

``unit.json`` also keeps every attempt the unit ever made (``attempts``: session, host, pid, start, end, state),
whatever became of it: the comparison's account of what it spent (`vlkit.compare.account`). While an attempt runs
its process touches ``heartbeat`` every ``compare.heartbeat_s`` seconds, so an attempt whose process was killed
ends at its last heartbeat.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from vlkit.digests import result_digest
from vlkit.io import atomic_write_text, dump_json, read_json
from vlkit.runtime import pid_alive, process_started

UNIT_FILE = "unit.json"
TRACEBACK_FILE = "traceback.txt"
LOG_FILE = "unit.log"
HEARTBEAT_FILE = "heartbeat"
PLAN_FILE = "plan.json"
PLAN_DAMAGED = ("the plan of the comparison in its folder: restore it (a copy, or the manifest.json of a finished "
                "report), or start the comparison afresh in another output_dir")


@dataclass(frozen=True, order=True)
class Unit:
    """One unit of work: run ``run`` (its index in the comparison) at ``seed``; a fine-tuning names its
    ``variant`` and ``task``, a pre-training neither."""

    run: int
    seed: int
    variant: str | None = None
    task: str | None = None

    @property
    def is_pretrain(self) -> bool:
        return self.task is None

    def stage(self) -> str:
        return "pretrain" if self.is_pretrain else f"{self.variant}-{self.task}"

    def key(self, run_name: str) -> str:
        """The unit's id and folder below ``runs/``: ``uniter/seed0/pretrain``, ``uniter/seed0/scratch-vqa``."""
        return f"{run_name}/seed{self.seed}/{self.stage()}"

    def depends_on(self) -> "Unit | None":
        """The pre-training a fine-tuning of the pre-trained variant starts from."""
        return Unit(self.run, self.seed) if self.variant == "pretrained" else None


def config_hash(config: Any) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def digest(items: Iterable[Any]) -> str:
    """The sha256 of a sequence of JSON-able items, one line each (ids seen, a data set's keys)."""
    h = hashlib.sha256()
    for item in items:
        h.update(json.dumps(item, sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": 1}`` from ``{"a": {"b": 1}}`` (lists stay values)."""
    if not isinstance(config, dict):
        return {prefix: config}
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(flatten(value, name) if isinstance(value, dict) and value else {name: value})
    return out


def changed_keys(saved: dict[str, Any], new: dict[str, Any], safe: tuple[str, ...]) -> list[str]:
    """``key: saved -> new`` for every flattened key that differs, except those under a ``safe`` prefix."""
    a, b = flatten(saved), flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if any(key == s or key.startswith(s + ".") for s in safe):
            continue
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            out.append(f"{key}: {json.dumps(a.get(key, '<unset>'), default=str)} -> "
                       f"{json.dumps(b.get(key, '<unset>'), default=str)}")
    return out


class UnitFolder:
    """The durable state of one unit in ``directory``."""

    def __init__(self, directory: Path, key: str):
        self.directory, self.key = Path(directory), key

    @property
    def path(self) -> Path:
        return self.directory / UNIT_FILE

    def read(self) -> dict[str, Any] | None:
        """The unit's state, or None when it never started. A damaged file (truncated, edited: vlkit writes it
        whole) raises `vlkit.io.UnreadableFileError` naming it: what it recorded would otherwise be lost."""
        try:
            return read_json(self.path, f"the record of unit {self.key}: restore it, or delete it to run the unit "
                                        "again")
        except FileNotFoundError:
            return None

    def finished(self, unit_hash: str) -> dict[str, Any] | None:
        """The result of a finished attempt of this very configuration (and inputs), as it was recorded (its
        ``result_digest`` verified), else None."""
        state = self.read()
        return state["result"] if status(state, unit_hash) == "finished" else None

    def _write(self, state: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, dump_json(state))

    @property
    def heartbeat(self) -> Path:
        return self.directory / HEARTBEAT_FILE

    def last_seen(self) -> float | None:
        """When the unit's running attempt last showed it was alive (its heartbeat), None before any."""
        try:
            return self.heartbeat.stat().st_mtime
        except OSError:
            return None

    def start(self, unit_hash: str, config: dict[str, Any], session: int | None = None) -> int:
        """Record an attempt as running (session, host, pid, time); an earlier attempt still marked running died:
        it ends at its last heartbeat. Returns the attempt's number."""
        previous = self.read() or {}
        if previous and status(previous, unit_hash) in ("stale", "altered"):
            self.clear()  # trained on other inputs, or a result nobody can vouch for: start afresh
        attempt = int(previous.get("attempt", 0)) + 1
        attempts = [close_attempt(a, self.last_seen()) for a in previous.get("attempts", [])]
        now = time.time()
        attempts.append({"attempt": attempt, "session": session, "host": socket.gethostname(), "pid": os.getpid(),
                         "pid_started": process_started(), "started": now, "state": "running"})
        self._write({"unit": self.key, "state": "running", "hash": unit_hash, "config": config, "attempt": attempt,
                     "host": socket.gethostname(), "pid": os.getpid(), "started": now, "attempts": attempts})
        return attempt

    def clear(self) -> None:
        """Remove what earlier attempts wrote (checkpoints, weights, metrics) but the unit's record and log."""
        import shutil

        for path in self.directory.iterdir() if self.directory.is_dir() else ():
            if path.name in (UNIT_FILE, LOG_FILE, HEARTBEAT_FILE):
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()

    def _ended(self, attempt: int, state: str) -> tuple[float, list[dict[str, Any]]]:
        """The end time and the attempts with attempt ``attempt`` ended as ``state``."""
        now = time.time()
        attempts = [{**a, "ended": now, "state": state} if a.get("attempt") == attempt else a
                    for a in (self.read() or {}).get("attempts", [])]
        return now, attempts

    def finish(self, unit_hash: str, config: dict[str, Any], attempt: int, result: dict[str, Any]) -> None:
        (self.directory / TRACEBACK_FILE).unlink(missing_ok=True)
        ended, attempts = self._ended(attempt, "finished")
        self._write({"unit": self.key, "state": "finished", "hash": unit_hash, "config": config, "attempt": attempt,
                     "ended": ended, "result": result, "result_digest": result_digest(result), "attempts": attempts})

    def fail(self, unit_hash: str, config: dict[str, Any], attempt: int, error: BaseException, trace: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.directory / TRACEBACK_FILE, trace)
        ended, attempts = self._ended(attempt, "failed")
        self._write({"unit": self.key, "state": "failed", "hash": unit_hash, "config": config, "attempt": attempt,
                     "ended": ended, "error": f"{type(error).__name__}: {error}", "traceback": TRACEBACK_FILE,
                     "attempts": attempts})

    def died(self, unit_hash: str, error: str) -> None:
        """Record that the unit's process died (``error``: why, as its executor tells), so that ``units.md`` and a
        resumed comparison say it: its running attempt ends at its last heartbeat; a unit whose process died before
        it could start gets a record of its own (no attempt). A unit that finished or failed keeps its record."""
        state = self.read() or {}
        if state.get("state") in ("finished", "failed") and state.get("hash") == unit_hash:
            return
        attempts = [close_attempt(a, self.last_seen()) for a in state.get("attempts", [])]
        self._write({**{k: v for k, v in state.items() if k not in ("result", "result_digest")}, "unit": self.key,
                     "state": "died", "hash": unit_hash, "attempt": int(state.get("attempt", 0)), "ended": time.time(),
                     "error": error, "attempts": attempts})


def close_attempt(attempt: dict[str, Any], last_seen: float | None) -> dict[str, Any]:
    """An attempt still marked running whose process is gone (``died``): it ended at ``last_seen`` (its unit's
    heartbeat; its start when it never beat); any other attempt as it is."""
    if attempt.get("state") != "running":
        return attempt
    return {**attempt, "state": "died", "ended": max(attempt["started"], last_seen or attempt["started"])}


def status(state: dict[str, Any] | None, unit_hash: str) -> str:
    """How the report shows a unit: ``finished``, ``failed``, ``running`` (or ``died`` when its process on
    this host is gone), ``stale`` (finished under another configuration or other input files), ``altered`` (a
    finished result that no longer matches its ``result_digest``: edited after the unit wrote it) or ``missing``."""
    if state is None:
        return "missing"
    if state.get("hash") != unit_hash:
        return "stale"
    if state.get("state") == "finished" and "result_digest" in state and \
            result_digest(state.get("result")) != state["result_digest"]:
        return "altered"
    if state["state"] == "running" and state.get("host") == socket.gethostname() and not pid_alive(state.get("pid")):
        return "died"
    return state["state"]


def rerun_reason(state: dict[str, Any] | None, unit_hash: str, config: dict[str, Any]) -> str | None:
    """Why a unit that finished before runs again (None when it did not finish before): its result was altered,
    or what changed in its configuration, an input file's content included (``inputs.<path>``)."""
    if not state or state.get("state") != "finished":
        return None
    found = status(state, unit_hash)
    if found == "altered":
        return f"its result in {UNIT_FILE} was edited after the unit wrote it (result_digest does not match)"
    if found != "stale":
        return None
    changed = changed_keys(state.get("config") or {}, json.loads(json.dumps(config, default=str)), ())
    inputs = [c for c in changed if c.startswith("inputs.") or c.startswith("pretraining.inputs.")]
    shown = inputs or changed
    more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
    what = "input file(s) changed" if inputs else "configuration changed"
    return f"{what} since it finished: " + "; ".join(shown[:3]) + more if shown else "its configuration hash changed"
