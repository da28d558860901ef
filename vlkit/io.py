"""Small I/O helpers shared across vlkit: atomic writes, file digests and a restricted unpickler.

Never unpickle untrusted files with `pickle.load`: `safe_pickle_load` only admits builtin
containers / scalars and numpy arrays, and refuses any other class with an error naming the file.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

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


class UnsafePickleError(pickle.UnpicklingError):
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


def safe_pickle_load(path_or_bytes: str | os.PathLike | bytes) -> Any:
    """Unpickle a file (or bytes) that may only hold numpy arrays and builtin containers."""
    if isinstance(path_or_bytes, bytes):
        return _RestrictedUnpickler(io.BytesIO(path_or_bytes), "<bytes>").load()
    with open(path_or_bytes, "rb") as f:
        return _RestrictedUnpickler(f, str(path_or_bytes)).load()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path`` atomically.

    On an exception the temporary file is removed and ``path`` keeps its previous content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; give the usual permissions
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def sha256_file(path: str | os.PathLike) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def config_dir() -> Path:
    """vlkit's Hydra configs (``conf/``): ``vlkit/conf`` inside an installed wheel, ``conf/`` at the
    repository root in a source checkout (editable installs included)."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "pretrain.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"vlkit's configs are missing (looked in {package / 'conf'} and {package.parent / 'conf'})")
