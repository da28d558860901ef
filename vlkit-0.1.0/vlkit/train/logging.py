"""Run logging: ``metrics.jsonl`` as an Accelerate tracker (always on), the other Accelerate
trackers (TensorBoard by default when installed) and tqdm progress bars on the main process."""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from accelerate.tracking import GeneralTracker

from vlkit.io import atomic_write_text

log = logging.getLogger("vlkit.train")


class JSONLTracker(GeneralTracker):
    """An Accelerate tracker that appends one JSON object per `log` call: ``{"step": N, ...}``."""

    name = "jsonl"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, path: str | os.PathLike):
        super().__init__()
        self.path = Path(path)
        self._file = None

    @property
    def tracker(self):
        return self._file

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        if self._file is None:
            self.start()
        record = {"step": step, **{k: _jsonable(v) for k, v in values.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics file. A torn last line (a crash mid-write) is dropped; a bad line
    elsewhere raises an error naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if n == len(lines):
                log.warning("%s: dropping the torn last line %d (%s)", path, n, err)
                break
            raise ValueError(f"{path}:{n} is not a JSON object ({err})") from err
    return records


def truncate_jsonl(path: str | os.PathLike, last_step: int) -> None:
    """Atomically drop the records of ``path`` logged after ``last_step`` (before a resume)."""
    path = Path(path)
    if path.exists():
        kept = [r for r in read_jsonl(path) if r.get("step", 0) <= last_step]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))


def resolve_trackers(names: Iterable[str]) -> list[str]:
    """Accelerate tracker names; ``auto`` means TensorBoard when it is installed."""
    from accelerate.utils import is_tensorboard_available

    out: list[str] = []
    for name in names:
        if name == "auto":
            if is_tensorboard_available():
                out.append("tensorboard")
        elif name != "jsonl":
            out.append(name)
    return list(dict.fromkeys(out))


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": 1, "c": "[1, 2]"}`` (trackers want scalars)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = str(list(value) if isinstance(value, tuple) else value)
    return out


def progress(iterable: Iterable | None = None, *, desc: str | None = None, total: int | None = None,
             initial: int = 0, enabled: bool = True, **kwargs: Any):
    """A tqdm bar shown on the local main process only (training and evaluation loops use it)."""
    from accelerate import PartialState
    from tqdm.auto import tqdm

    show = enabled and PartialState().is_local_main_process
    return tqdm(iterable, desc=desc, total=total, initial=initial, disable=not show, dynamic_ncols=True, **kwargs)
