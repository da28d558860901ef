"""One writer per output folder: a lock file beside every folder (or file) a command writes.

    with hold(output_dir, "trainer.output_dir", "vlkit pretrain"):
        ...  # the only writer of output_dir; a second writer is refused at once

The lock of ``path`` is ``<parent>/.<name>.lock``, beside it (a folder swapped in whole keeps its lock, and the
folder itself stays empty until the command writes into it). It holds the writer's pid, host, process start
time, command and a random token, and is created with ``O_CREAT | O_EXCL``, so of two writers exactly one
gets it. A lock whose writer is gone is stale and taken over: same host and either no process of its pid,
or a process of that pid that started at another time (a reused pid). A live writer's lock, or one of
another host (whose processes this one cannot see), refuses the second writer with `FolderInUse`, naming the
writer (pid, host, since, command). The lock goes when the block ends, also on an error or a signal
(`vlkit.runtime.Interrupted`); a process killed outright leaves a stale lock for the next writer to take over.
Parent folders made only to hold the lock are removed with it when they are left empty. Where no lock can be
written (a read-only folder, a file in the folder's place) the command goes on without one: it cannot write
there either, and its own checks name the problem.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Iterator

from vlkit.runtime import process_started

START_TOLERANCE_S = 2.0  # two readings of one process's start differ by clock ticks (psutil: up to 1 s)


class FolderInUse(RuntimeError):
    """Another live process writes the folder (the message names it: pid, host, since, command)."""


def lock_path(path: str | os.PathLike) -> Path:
    """Where the lock of ``path`` lies: ``<parent>/.<name>.lock``."""
    path = Path(path).absolute()
    return path.parent / f".{path.name}.lock"


def _read(lock: Path) -> tuple[dict[str, Any] | None, bytes]:
    """The lock's record (None when unreadable: a writer killed between create and write) and its bytes."""
    try:
        raw = lock.read_bytes()
    except OSError:  # gone, or no folder there at all
        return None, b""
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, raw
    return (record if isinstance(record, dict) else None), raw


def holder_alive(record: dict[str, Any]) -> bool:
    """Whether the process a lock names still runs: on another host it is taken to (this host cannot tell);
    here, when a process of its pid exists and started when the lock says (not a reused pid)."""
    if record.get("host") != socket.gethostname():
        return True
    try:
        started = process_started(int(record["pid"]))
    except (ProcessLookupError, KeyError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    recorded = record.get("started")
    return not isinstance(recorded, (int, float)) or abs(started - recorded) <= START_TOLERANCE_S


def describe(record: dict[str, Any]) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("since") or 0))
    command = f" ({record['command']})" if record.get("command") else ""
    return f"pid {record.get('pid')} on host {record.get('host')} since {since}{command}"


def _take_over(lock: Path, raw: bytes) -> None:
    """Remove the stale lock whose bytes were ``raw``; a lock another writer took meanwhile is put back."""
    aside = lock.with_name(f"{lock.name}.stale-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return  # another writer removed it first
    try:
        if aside.read_bytes() != raw:  # a new writer's lock, taken after we read the stale one: give it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, lock)
    finally:
        aside.unlink(missing_ok=True)


def _made_parents(path: Path) -> list[Path]:
    """Make ``path``'s missing folders; the ones made, deepest first."""
    made = []
    for parent in [path, *path.parents]:
        if parent.exists():
            break
        made.append(parent)
    path.mkdir(parents=True, exist_ok=True)
    return made


def acquire(path: str | os.PathLike, key: str = "output_dir", command: str = "") -> dict[str, Any]:
    """Take the lock of ``path`` for this process (`FolderInUse` when a live writer holds it); returns its record."""
    lock = lock_path(path)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": process_started(), "since": time.time(),
              "command": command, "path": str(Path(path).absolute()), "token": secrets.token_hex(8)}
    try:
        record["made"] = [str(p) for p in _made_parents(lock.parent)]
    except OSError:  # a file where a folder should be, no permission: the command's own checks say so
        return {**record, "token": None}
    data = json.dumps(record).encode("utf-8")
    for _ in range(20):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            held, raw = _read(lock)
            if held is None and raw == b"":  # gone since, or being written: look again
                if lock.exists() and time.time() - _mtime(lock) < 5:
                    time.sleep(0.05)
                    continue
            elif held is not None and holder_alive(held):
                raise FolderInUse(f"{key}={path} is being written by another vlkit process: {describe(held)}; "
                                  f"wait for it to end or choose another {key}= (its lock: {lock}; delete it only if "
                                  "that process is gone)") from None
            _take_over(lock, raw)
            continue
        except OSError:  # a read-only folder: nothing can be written there, and the command says so
            return {**record, "token": None}
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return record
    raise FolderInUse(f"{key}={path}: cannot take its lock {lock}: other writers keep taking it")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def release(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Remove the lock of ``path`` if it is still ``record``'s, and the empty folders made for it."""
    lock = lock_path(path)
    held, _ = _read(lock)
    if held is not None and record.get("token") and held.get("token") == record["token"]:
        lock.unlink(missing_ok=True)
    for made in record.get("made", []):
        with contextlib.suppress(OSError):
            os.rmdir(made)  # only when empty: the command wrote nothing there


@contextlib.contextmanager
def hold(paths: Any, key: str = "output_dir", command: str = "") -> Iterator[list[dict[str, Any]]]:
    """Hold the locks of ``paths`` (one path, or ``{key: path}``) for the block; all or none are taken."""
    items = list(paths.items()) if isinstance(paths, dict) else [(key, paths)]
    items = list({lock_path(path): (name, path) for name, path in reversed(items)}.values())[::-1]  # one lock a path
    held: list[tuple[Any, dict[str, Any]]] = []
    try:
        for name, path in items:
            held.append((path, acquire(path, name, command)))
        yield [record for _, record in held]
    finally:
        for path, record in reversed(held):
            release(path, record)


__all__ = ["FolderInUse", "acquire", "hold", "holder_alive", "lock_path", "release"]
