"""A run's folder, the format that ``vlkit pretrain | finetune`` and `vlkit.convert` write and ``finetune init=``,
``evaluate checkpoint=`` and `vlkit.from_pretrained` read: ``model/``, ``tokenizer/`` (when the run has its own),
the training module's weights and ``run.json``.

The paths a record names (``run.json``'s data, a saved processor's ``processor.json``) follow one rule, written by
`record_paths` and read by `read_recorded_paths`:

- written resolved: relative to the record's folder when inside it (the folder may move), else absolute, never
  relative to the working directory the run happened to start in;
- read: a relative path from the record's folder (never the working directory); a path outside the folder only when
  it lies in the user's cache, when the caller passes it (it then replaces the recorded one), or when the record is
  one this user's vlkit wrote and nobody changed since (`own_record`: its digest in the user's cache, under
  ``records/``). A model folder from someone else never chooses what vlkit reads outside it or where it writes; a
  recorded path that is gone is an error naming the record, the path and what to pass instead.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping

from vlkit.data.tokenizers import save_tokenizer
from vlkit.io import atomic_write_text, save_weights
from vlkit.validate import DataError

PRETRAINING_WEIGHTS = "pretraining.safetensors"
TASK_WEIGHTS = "task.safetensors"
RUN_INFO = "run.json"
RECORDS = "records"  # <user cache>/records/: the digests of the records this user's vlkit wrote
# the keys of a data config that hold local paths, and how a caller passes each again (the command-line key)
PATH_KEYS = {("path",): "data.path", ("image", "path"): "data.image.path", ("tokenizer",): "data.tokenizer"}
# folders that never hold a data set or a model's images (a recorded path there is refused)
SYSTEM_FOLDERS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/proc", "/run", "/sbin", "/sys", "/usr", "/var")

log = logging.getLogger("vlkit")


class RecordedPathError(DataError):
    """A path a record names that vlkit will not read: gone, outside the record's folder and not the user's own,
    or a system folder; the message names the record, the path and what to pass instead."""


def user_cache() -> Path:
    """The user's vlkit cache: ``$VLKIT_CACHE`` or ~/.cache/vlkit."""
    return Path(os.environ.get("VLKIT_CACHE") or Path.home() / ".cache" / "vlkit")


def record_path(value: str | os.PathLike, folder: str | os.PathLike) -> str:
    """``value`` as a record in ``folder`` keeps it: relative to the folder when inside it, else absolute (resolved
    against the working directory now, while it still means what the caller meant)."""
    path, root = Path(value).expanduser().resolve(), Path(folder).resolve()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def _is_path(value: Any) -> bool:
    """Whether a recorded string names a local path rather than a name (``shapes``, a hub tokenizer)."""
    return isinstance(value, str) and bool(value) and (
        value.startswith(("/", ".", "~")) or Path(value).expanduser().exists())


def record_paths(data: Mapping[str, Any], folder: str | os.PathLike) -> dict[str, Any]:
    """A data config with each of its local paths (`PATH_KEYS`) as `record_path` writes it: what ``run.json`` and
    ``processor.json`` record."""
    out = json.loads(json.dumps(dict(data), default=str))
    for keys in PATH_KEYS:
        *parents, last = keys
        block = out
        for key in parents:
            block = block.get(key) if isinstance(block, dict) else None
        if isinstance(block, dict) and _is_path(block.get(last)):
            block[last] = record_path(block[last], folder)
    return out


def record_task_paths(task_cfg: Mapping[str, Any], folder: str | os.PathLike) -> dict[str, Any]:
    """A task config with its files (``files.<split>``' paths, ``path``, ``refs``, ``instances``) as `record_path`
    writes them: ``evaluate checkpoint=`` of a fine-tuning reads them again, from any folder."""
    def recorded(value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):
            return {k: recorded(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [recorded(v, key) for v in value]
        return record_path(value, folder) if key != "image_id_format" and _is_path(value) else value

    out = json.loads(json.dumps(dict(task_cfg), default=str))
    for key in ("files", "path", "refs", "instances"):
        if out.get(key) is not None:
            out[key] = recorded(out[key], key)
    return out


def write_record(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Write a record (``run.json``, ``processor.json``) atomically and note its digest in the user's cache, so that
    the paths it names outside its folder are read again on this machine (`own_record`)."""
    path = Path(path)
    text = json.dumps(record, indent=2, sort_keys=True, default=str)
    atomic_write_text(path, text)
    try:
        _ledger(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(_ledger(path), json.dumps({"record": str(path.resolve()), "sha256": _digest(text.encode())}))
    except OSError as err:  # the record is written; only its outside paths will need passing again
        log.warning("vlkit: could not note %s in the user's cache (%s): the paths it names outside %s will have to "
                    "be passed when it is loaded", path, err, path.parent)


def own_record(path: str | os.PathLike) -> bool:
    """Whether the record at ``path`` is one this user's vlkit wrote there, unchanged since (`write_record`)."""
    path = Path(path)
    try:
        noted = json.loads(_ledger(path).read_text(encoding="utf-8"))
        return noted.get("record") == str(path.resolve()) and noted.get("sha256") == _digest(path.read_bytes())
    except (OSError, ValueError, AttributeError):
        return False


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ledger(path: Path) -> Path:
    return user_cache() / RECORDS / f"{_digest(str(path.resolve()).encode())[:32]}.json"


def given_paths(data: Mapping[str, Any] | None, keys: Any = None) -> dict[str, Any]:
    """``{command-line key: path}`` of the local paths (`PATH_KEYS`) a data config ``data`` sets (only ``keys``
    when given, the keys the caller set): what `read_recorded_paths` takes as ``given``."""
    out = {}
    for path_keys, dotted in PATH_KEYS.items():
        value: Any = data
        for key in path_keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        if value is not None and (keys is None or dotted in keys):
            out[dotted] = value
    return out


def read_recorded_path(value: str, record: str | os.PathLike, key: str, passed_as: str,
                       cache: str | os.PathLike | None = None) -> str:
    """A path ``record`` names under ``key`` (`record_paths`' form), resolved for reading by the module's rule, else
    `RecordedPathError` naming the record, the path and ``passed_as`` (how the caller passes it instead)."""
    record = Path(record).absolute()
    folder = record.parent.resolve()
    path = (folder / Path(value).expanduser()).resolve()
    if any(path == Path(s) or path.is_relative_to(s) for s in SYSTEM_FOLDERS):
        raise RecordedPathError(f"{record}: {key}={value} is a system folder, never a data set's images or a model's "
                                f"files: vlkit does not read it for a saved model; pass {passed_as} to read the data "
                                "you mean")
    caches = [user_cache().resolve(), *([Path(cache).resolve()] if cache else [])]
    inside = path.is_relative_to(folder) or any(path.is_relative_to(c) for c in caches)
    if not inside and not own_record(record):
        raise RecordedPathError(f"{record}: {key}={value} lies outside {folder}, and this record is not one your "
                                "vlkit wrote there (copied from elsewhere, moved or edited): a saved model never "
                                f"chooses what vlkit reads outside its folder; pass {passed_as} to read it")
    if not path.exists():
        moved = ("" if Path(value).is_absolute() else f" (read relative to {folder}; older vlkit versions recorded "
                 "paths relative to the folder a run started in)")
        raise RecordedPathError(f"{record}: {key}={value} is gone: {path} does not exist{moved}; pass {passed_as} "
                                "where it is now")
    return str(path)


def read_recorded_paths(data: Mapping[str, Any], record: str | os.PathLike, given: Mapping[str, Any] | None = None,
                        cache: str | os.PathLike | None = None, names: Mapping[str, str] | None = None
                        ) -> dict[str, Any]:
    """A recorded data config with each of its local paths (`PATH_KEYS`) resolved by `read_recorded_path`, or
    replaced by the value ``given`` under its command-line key (``{"data.image.path": ...}``); ``names``: how the
    caller passes each key (default: the command-line key)."""
    out = json.loads(json.dumps(dict(data), default=str))
    given, names = dict(given or {}), dict(names or {})
    for keys, dotted in PATH_KEYS.items():
        *parents, last = keys
        block = out
        for key in parents:
            block = block.get(key) if isinstance(block, dict) else None
        if not isinstance(block, dict):
            continue
        value = block.get(last)
        if given.get(dotted) is not None:
            block[last] = str(given[dotted])
        elif isinstance(value, str) and value and (dotted != "data.tokenizer" or value.startswith(("/", ".", "~")) or
                                                   (Path(record).parent / value).exists()):  # not a tokenizer's name
            block[last] = read_recorded_path(value, record, dotted, names.get(dotted, f"{dotted}=PATH"), cache)
    return out


def save_run(directory: Path, module: Any, info: dict[str, Any], tokenizer: Any = None) -> None:
    """Write the final model (``model/``), the run's ``tokenizer/`` (when given), the whole training module's
    weights and ``run.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    module.model.save_pretrained(directory / "model")
    if tokenizer is not None:
        save_tokenizer(tokenizer, directory)
    name = TASK_WEIGHTS if info.get("kind") == "finetune" else PRETRAINING_WEIGHTS
    save_weights(module, directory / name)
    if isinstance(info.get("data"), Mapping):
        info = {**info, "data": record_paths(info["data"], directory)}
    if isinstance(info.get("task_cfg"), Mapping):
        info = {**info, "task_cfg": record_task_paths(info["task_cfg"], directory)}
    write_record(directory / RUN_INFO, info)


def read_run_info(directory: str | Path) -> dict[str, Any]:
    """``run.json`` of a pretrain / finetune output_dir; a missing or corrupt file is an error naming it."""
    path = Path(directory) / RUN_INFO
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {directory} is not the output_dir of a vlkit pretrain or finetune run")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        info["kind"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise DataError(f"{path} is not a vlkit run record ({type(err).__name__}: {err})") from err
    return info


def run_data(directory: str | os.PathLike, given: Mapping[str, Any] | None = None, cache: str | os.PathLike | None = None,
             names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The data config a run recorded (``run.json``'s ``data``), its paths resolved for reading (`read_recorded_paths`:
    ``given`` replaces a recorded path by its command-line key, ``names`` says how the caller passes each)."""
    path = Path(directory) / RUN_INFO
    return read_recorded_paths(read_run_info(directory).get("data") or {}, path, given, cache, names)
