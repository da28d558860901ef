"""Small I/O helpers shared across vlkit: atomic writes, strict JSON, file digests and a restricted unpickler.

Never unpickle untrusted files with `pickle.load`: `safe_pickle_load` only admits builtin
containers / scalars and numpy arrays, and refuses any other class with an error naming the file.

Files written here honour the process umask (``0666 & ~umask``, folders ``0777 & ~umask``), also when
the library that wrote them chose a stricter mode. A temporary file of `atomic_path` is named
``.<name>.tmp-<host>-<pid>-<random>`` beside its target, so `remove_orphans` can delete the ones a
killed process left without touching those of a live one.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import math
import os
import pickle
import shutil
import socket
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from vlkit.runtime import pid_alive

# (module, name) pairs a pickle may reference: numpy array reconstruction and builtin containers.
_SAFE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),  # pickle protocol 5 arrays
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.dtypes", "Float32DType"),
    ("numpy.dtypes", "Float64DType"),
    ("numpy.dtypes", "Float16DType"),
    ("numpy.dtypes", "Int64DType"),
    ("numpy.dtypes", "Int32DType"),
    ("numpy.dtypes", "UInt8DType"),
    ("numpy.dtypes", "BoolDType"),
    ("builtins", "dict"),
    ("builtins", "list"),
    ("builtins", "tuple"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "bytearray"),
    ("collections", "OrderedDict"),
    ("_codecs", "encode"),
}


class UnreadablePickleError(pickle.UnpicklingError, ValueError):
    """A pickle that cannot be read: truncated, corrupt or refused (the message names the file). Also a
    `ValueError`: the input is at fault, not vlkit, so the console reports it in one paragraph."""


class UnsafePickleError(UnreadablePickleError):
    """Raised when a pickle references a class outside the allow-list."""


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], source: str):
        super().__init__(file, encoding="latin1")
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise UnsafePickleError(
            f"{self.source}: refusing to unpickle {module}.{name}; only numpy arrays and builtin "
            "containers are allowed in this file"
        )


def safe_pickle_load(path_or_bytes: str | os.PathLike | bytes, source: str | None = None) -> Any:
    """Unpickle a file (or bytes) that may only hold numpy arrays and builtin containers; a refused
    class raises `UnsafePickleError`, a truncated or corrupt pickle `UnreadablePickleError` (both
    `pickle.UnpicklingError` and `ValueError`), naming the file (``source`` names where bytes came from)."""
    source = source or ("<bytes>" if isinstance(path_or_bytes, bytes) else str(path_or_bytes))
    try:
        if isinstance(path_or_bytes, bytes):
            return _RestrictedUnpickler(io.BytesIO(path_or_bytes), source).load()
        with open(path_or_bytes, "rb") as f:
            return _RestrictedUnpickler(f, source).load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, AttributeError) as err:
        raise UnreadablePickleError(f"{source}: not a readable pickle ({type(err).__name__}: {err})") from err


def torch_load_weights(path: str | os.PathLike, allowed_globals: Sequence[Any] = ()) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU, ``allowed_globals`` (``torch.serialization.safe_globals``
    entries) loadable besides tensors and plain containers; a file that holds code or is corrupt raises
    `UnreadableFileError` naming it, the loader's own error as its cause (no pickled code ever runs)."""
    import torch

    try:
        with torch.serialization.safe_globals(list(allowed_globals)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - torch raises many kinds on a bad file
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = next((line for line in lines if "GLOBAL" in line or line.startswith("Unsupported")), lines[0] if lines else "")
        raise UnreadableFileError(f"{path}: cannot be loaded with weights_only=True ({type(err).__name__}: "
                                  f"{detail})") from err


class UnreadableFileError(OSError):
    """A file that exists but cannot be read as what it should be (the message names it)."""


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (``/proc/self/status``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def honour_umask(path: str | os.PathLike, recursive: bool = False) -> None:
    """Give ``path`` the mode a plain ``open`` / ``mkdir`` would: ``0666 & ~umask`` for files, ``0777 &
    ~umask`` for folders (and their contents with ``recursive``)."""
    umask = current_umask()
    path = Path(path)
    paths = [path, *path.rglob("*")] if recursive and path.is_dir() else [path]
    for p in paths:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"


def temp_sibling(path: str | os.PathLike, directory: bool = False) -> Path:
    """A new empty temporary file (or folder) beside ``path``, named after it, this host and this process."""
    path = Path(path)
    prefix = f"{_temp_prefix(path)}{socket.gethostname()}-{os.getpid()}-"
    if directory:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    os.close(fd)
    return Path(tmp)


def remove_orphans(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary siblings of ``path`` (files or folders of `temp_sibling`) that a process of
    this host left when it was killed; those of live processes and of other hosts stay. Returns them."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    host, removed = socket.gethostname(), []
    for tmp in path.parent.glob(_temp_prefix(path) + "*"):
        parts = tmp.name[len(_temp_prefix(path)):].rsplit("-", 2)  # host (may hold '-'), pid, random
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid == os.getpid() or pid_alive(pid):
            continue
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def _free_bytes(path: Path) -> int | None:
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def write_error(path: str | os.PathLike, err: BaseException) -> BaseException:
    """``err``, raised while writing ``path``, as an `OSError` naming ``path`` and the cause (its errno kept:
    no space, permission, read-only file system, a file where a folder is expected). torch's file writer
    reports a full disk as ``RuntimeError: [enforce fail at inline_container.cc]``: that says the free space.
    Other errors, and messages that already name ``path``, come back as they are."""
    path = Path(path)
    about = getattr(err, "filename", None)  # an error about another file (a source being read) is not this write's
    ours = about is None or Path(about).name == path.name or Path(about).name.startswith(_temp_prefix(path))
    if isinstance(err, OSError) and ours and str(path) not in str(err):
        cause = err.strerror or str(err) or type(err).__name__
        return OSError(err.errno, f"cannot write {path}: {cause}") if err.errno else OSError(f"cannot write {path}: {cause}")
    if isinstance(err, RuntimeError) and "inline_container" in str(err):
        free = _free_bytes(path)
        if free is not None and free < (1 << 20):
            return OSError(errno.ENOSPC, f"cannot write {path}: {os.strerror(errno.ENOSPC)} ({free} bytes free)")
        return OSError(f"cannot write {path}: torch's writer failed ({err}); {free} bytes free on its disk")
    return err


@contextlib.contextmanager
def write_failures(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise a failure of the block that writes ``path`` as `write_error` describes it."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        explained = write_error(path, err)
        if explained is err:
            raise
        raise explained from err


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path`` atomically, with
    the mode the umask gives (whatever mode the writer used).

    On an exception the temporary file is removed and ``path`` keeps its previous content; a process
    killed meanwhile leaves it for `remove_orphans`.
    """
    path = Path(path)
    with write_failures(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = temp_sibling(path)
    try:
        with write_failures(path):
            yield tmp_path
            honour_umask(tmp_path)
            os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def refuse_overwrite(path: str | os.PathLike, overwrite: bool, key: str = "out") -> None:
    """`FileExistsError` when ``path`` holds something (a file, a non-empty folder) and ``overwrite`` is not
    set: a writer calls it before it starts, so nothing existing is replaced unless the user says so."""
    path = Path(path)
    held = path.is_file() or path.is_symlink() or (path.is_dir() and any(path.iterdir()))
    if held and not overwrite:
        kind = "a folder that is not empty" if path.is_dir() else "a file"
        raise FileExistsError(f"{key}={path} is {kind}; choose another {key}= or pass overwrite=true to replace it "
                              "(the new one is built beside it and swapped in only when complete)")


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a new empty folder beside ``path`` to fill; on success it takes ``path``'s place (a previous
    ``path`` is moved aside first and deleted only after the swap). On an exception the new folder is
    removed and ``path`` is untouched; a process killed meanwhile leaves it for `remove_orphans`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path)
    tmp = temp_sibling(path, directory=True)
    try:
        yield tmp
        honour_umask(tmp)  # mkdtemp makes 0700
        old = None
        if path.exists() or path.is_symlink():
            old = temp_sibling(path.with_name(path.name + ".old"), directory=True)  # not an orphan of ``path``
            os.replace(path, old / path.name)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def key_difference(missing: Any, unexpected: Any, limit: int = 5) -> str:
    """``missing [...], unexpected [...]`` (sorted, the first ``limit`` of each and how many more)."""
    def show(keys: Any) -> str:
        keys = sorted(keys)
        more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
        return f"{keys[:limit]}{more}"

    return f"{len(missing)} missing key(s) {show(missing)}, {len(unexpected)} unexpected key(s) {show(unexpected)}"


class WeightsMismatchError(ValueError):
    """Weights whose names or shapes do not fit the module they are loaded into (the message names the file)."""


def save_weights(module: Any, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> Path:
    """Write ``module``'s weights to the safetensors file ``path`` atomically; a failure names ``path``."""
    from safetensors.torch import save_model

    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            save_model(module, str(tmp), metadata=metadata)
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types without the path
        raise OSError(f"{path}: cannot write the weights ({type(err).__name__}: {err})") from err
    return path


def load_weights(module: Any, path: str | os.PathLike, device: Any = "cpu", strict: bool = True) -> tuple[list, list]:
    """Load the safetensors file ``path`` into ``module``; returns (missing, unexpected) keys.

    A missing file raises `FileNotFoundError`, a file that is not safetensors `UnreadableFileError`, and
    (with ``strict``) weights of other names or shapes `WeightsMismatchError`; each message names ``path``.
    """
    from safetensors.torch import load_model

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    try:
        missing, unexpected = load_model(module, str(path), strict=False, device=str(device))
    except RuntimeError as err:
        if "size mismatch" in str(err) or "shape" in str(err).lower():
            raise WeightsMismatchError(f"{path} does not fit {type(module).__name__}: {err}") from err
        raise UnreadableFileError(f"{path}: not a readable safetensors file ({type(err).__name__}: {err})") from err
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types without the path
        raise UnreadableFileError(f"{path}: not a readable safetensors file ({type(err).__name__}: {err})") from err
    missing, unexpected = sorted(missing), sorted(unexpected)
    if strict and (missing or unexpected):
        raise WeightsMismatchError(f"{path} does not fit {type(module).__name__}: {key_difference(missing, unexpected)}")
    return missing, unexpected


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def read_json(path: str | os.PathLike, advice: str = "") -> Any:
    """The JSON value held in ``path``. A file that holds no readable JSON (truncated, edited, not UTF-8) raises
    `UnreadableFileError` naming it, where the parse failed, and ``advice`` (what to do about it); a missing
    file `FileNotFoundError`."""
    path = Path(path)
    advice = f"; {advice}" if advice else ""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise UnreadableFileError(f"{path}: not UTF-8 text (byte {err.object[err.start:err.start + 1]!r} at offset "
                                  f"{err.start}){advice}") from None
    except json.JSONDecodeError as err:
        raise UnreadableFileError(f"{path}: not readable JSON, truncated or damaged ({err.msg} at line {err.lineno}, "
                                  f"column {err.colno}){advice}") from None


def clean_json(value: Any) -> Any:
    """``value`` with every non-finite float as None, so ``json.dumps(allow_nan=False)`` accepts it (dict keys as
    strings, tuples as lists, any other object as its ``str``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if isinstance(value, (str, int, bool, float)) or value is None:
        return value
    return str(value)


def dump_json(value: Any) -> str:
    """``value`` as strict JSON (`clean_json`), indented, keys sorted: the form of every record vlkit writes."""
    return json.dumps(clean_json(value), indent=2, sort_keys=True, allow_nan=False)


def sha256_file(path: str | os.PathLike) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class ConfigFileError(ValueError):
    """A YAML file of the user's that cannot be read; the message names the file and the line."""


def read_yaml(path: str | os.PathLike, what: str = "config file") -> Any:
    """The content of the YAML file ``path``; unreadable text or invalid YAML raises `ConfigFileError` naming
    ``path``, the line and column at fault and the line itself (``what``: how messages call the file)."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[:err.start].count(b"\n") + 1
        raise ConfigFileError(f"{what} {path}:{line}: not UTF-8 text (byte {err.object[err.start:err.start + 1]!r}); "
                              "save it as UTF-8") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = ": ".join(filter(None, (getattr(err, "context", None), getattr(err, "problem", None)))) or str(err)
        if mark is None:
            raise ConfigFileError(f"{what} {path}: not valid YAML ({problem})") from None
        lines = text.splitlines()
        shown = f"\n    {lines[mark.line]}\n    {' ' * mark.column}^" if mark.line < len(lines) else ""
        raise ConfigFileError(f"{what} {path}:{mark.line + 1}:{mark.column + 1}: not valid YAML ({problem}); fix "
                              f"that line (mind indentation and unclosed brackets or quotes){shown}") from None


def config_dir() -> Path:
    """vlkit's Hydra configs (``conf/``): ``vlkit/conf`` inside an installed wheel, ``conf/`` at the
    repository root in a source checkout (editable installs included)."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "pretrain.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"vlkit's configs are missing (looked in {package / 'conf'} and {package.parent / 'conf'})")

