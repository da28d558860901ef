"""The units of a comparison and their durable state on disk.

A unit is one pre-training, or one fine-tuning of one variant (``pretrained`` / ``scratch``) on one task.
Each has its own folder ``<output_dir>/runs/<run>/seed<S>/<stage>`` (the trainer's output_dir) holding
``unit.json``: its state (``running``, ``finished``, ``failed``), the hash of its resolved configuration,
and, once finished, its result (metrics, costs, data digests, ids seen); a failed unit also leaves
``traceback.txt``; every attempt appends to ``unit.log``. Files are replaced atomically, so a reader (the
report, a resumed comparison) never sees half a state.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UNIT_FILE = "unit.json"
TRACEBACK_FILE = "traceback.txt"
LOG_FILE = "unit.log"
PLAN_FILE = "plan.json"


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
        """The unit's state, or None when it never started (a corrupt file counts as never started)."""
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return None

    def finished(self, unit_hash: str) -> dict[str, Any] | None:
        """The result of a finished attempt of this very configuration, else None."""
        state = self.read()
        if state and state.get("state") == "finished" and state.get("hash") == unit_hash:
            return state["result"]
        return None

    def _write(self, state: dict[str, Any]) -> None:
        from vlkit.compare.report import dump_json
        from vlkit.io import atomic_write_text

        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, dump_json(state))

    def start(self, unit_hash: str, config: dict[str, Any]) -> int:
        """Record an attempt as running (host, pid, time); returns the attempt's number."""
        previous = self.read() or {}
        attempt = int(previous.get("attempt", 0)) + 1
        self._write({"unit": self.key, "state": "running", "hash": unit_hash, "config": config, "attempt": attempt,
                     "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()})
        return attempt

    def finish(self, unit_hash: str, config: dict[str, Any], attempt: int, result: dict[str, Any]) -> None:
        (self.directory / TRACEBACK_FILE).unlink(missing_ok=True)
        self._write({"unit": self.key, "state": "finished", "hash": unit_hash, "config": config, "attempt": attempt,
                     "ended": time.time(), "result": result})

    def fail(self, unit_hash: str, config: dict[str, Any], attempt: int, error: BaseException, trace: str) -> None:
        from vlkit.io import atomic_write_text

        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.directory / TRACEBACK_FILE, trace)
        self._write({"unit": self.key, "state": "failed", "hash": unit_hash, "config": config, "attempt": attempt,
                     "ended": time.time(), "error": f"{type(error).__name__}: {error}", "traceback": TRACEBACK_FILE})


def status(state: dict[str, Any] | None, unit_hash: str) -> str:
    """How the report shows a unit: ``finished``, ``failed``, ``running`` (or ``died`` when its process on
    this host is gone), ``stale`` (finished under another configuration) or ``missing``."""
    if state is None:
        return "missing"
    if state.get("hash") != unit_hash:
        return "stale"
    if state["state"] == "running" and state.get("host") == socket.gethostname() and not _alive(state.get("pid")):
        return "died"
    return state["state"]


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
