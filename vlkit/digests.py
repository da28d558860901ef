"""Identity by content: the sha256 of the files a run or a comparison unit reads, and of a record's results.

`file_digest` reads a file once per process: its digest is cached by (path, size, mtime_ns), so a file
rewritten in place (another size or mtime) is read again. `input_digests` finds the input files of a config
(every string leaf naming an existing file or folder, e.g. a task's answers file) and gives each its digest;
a folder's digest covers every file under it (names and contents). `known` / `remember` carry the cache to
other processes (a comparison's workers read it from ``plan.json``) so a large feature store is read once.
`result_digest` is the digest of a record's results as JSON holds them, so a result edited by hand is seen.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from vlkit.io import clean_json, sha256_file

_CACHE: dict[str, tuple[int, int, str]] = {}  # absolute path -> (size, mtime_ns, sha256)


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def file_digest(path: str | os.PathLike) -> str:
    """The hex sha256 of a file's bytes, computed once per (path, size, mtime_ns)."""
    path = Path(path).absolute()
    size, mtime = _stat(path)
    cached = _CACHE.get(str(path))
    if cached is not None and cached[:2] == (size, mtime):
        return cached[2]
    digest = sha256_file(path)
    _CACHE[str(path)] = (size, mtime, digest)
    return digest


def path_digest(path: str | os.PathLike) -> str:
    """A file's `file_digest`; a folder's: the sha256 of every file's relative name and digest, in name order
    (hidden files, such as vlkit's locks and temporary files, left out)."""
    path = Path(path)
    if not path.is_dir():
        return file_digest(path)
    h = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        relative = file.relative_to(path)
        if any(part.startswith(".") for part in relative.parts):
            continue
        h.update(f"{relative.as_posix()}\0{file_digest(file)}\n".encode())
    return h.hexdigest()


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def looks_like_path(value: str) -> bool:
    """Whether a config string names an existing file or folder (a bare word such as ``shapes`` or ``val``
    is a name, not a path, even where a folder of that name happens to exist)."""
    return ("/" in value or os.sep in value or "." in value.strip(".")) and os.path.exists(value)


def input_digests(config: Any) -> dict[str, str]:
    """``{path: sha256}`` of every existing file or folder a config names (`looks_like_path`), paths as written."""
    return {value: path_digest(value) for value in sorted(set(_strings(config))) if looks_like_path(value)}


def known() -> dict[str, list[Any]]:
    """This process's cache as plain data (``{path: [size, mtime_ns, sha256]}``), for `remember` elsewhere."""
    return {path: list(entry) for path, entry in _CACHE.items()}


def remember(entries: dict[str, Any] | None) -> None:
    """Take digests computed by another process (`known`); an entry is used only while the file keeps its size
    and mtime."""
    for path, entry in (entries or {}).items():
        if isinstance(entry, (list, tuple)) and len(entry) == 3:
            _CACHE.setdefault(str(path), (int(entry[0]), int(entry[1]), str(entry[2])))


def result_digest(result: Any) -> str:
    """The sha256 of ``result`` as JSON holds it (keys sorted; a NaN held as null)."""
    text = json.dumps(clean_json(result), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


__all__ = ["file_digest", "input_digests", "known", "path_digest", "remember", "result_digest"]
