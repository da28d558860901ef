"""The feature store's file format, shared by one-file stores (`vlkit.features.store`) and sharded ones
(`vlkit.features.shards`): the format attributes, image-id keys, opening a file, reading and comparing its
file attributes, and copying image groups between files.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from vlkit.version import __version__

FORMAT = "vlkit-features"
FORMAT_VERSION = 1
UNCOMPARED = ("vlkit_version",)
FILE_ATTRS = ("provenance", "schema", "dtype")


class FeatureStoreError(RuntimeError):
    """A store file that cannot be read or written as asked (the message names the file and image)."""


def escape_id(image_id: str) -> str:
    key = str(image_id).replace("%", "%25").replace("/", "%2F")
    return "%2E" if key == "." else key


def unescape_id(key: str) -> str:
    return "." if key == "%2E" else key.replace("%2F", "/").replace("%25", "%")


def vlkit_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vlkit")
    except PackageNotFoundError:
        return __version__


def open_h5(path: Path, mode: str = "r"):
    import h5py

    try:
        return h5py.File(path, mode)
    except OSError as e:
        raise FeatureStoreError(f"{path}: cannot open as HDF5 ({e}); the file is truncated or not a feature store") from e


def file_attrs(f, path: Path) -> dict[str, Any]:
    if f.attrs.get("vlkit_format") != FORMAT:
        raise FeatureStoreError(f"{path}: not a vlkit feature store (missing vlkit_format={FORMAT!r} attribute)")
    if int(f.attrs.get("format_version", 0)) > FORMAT_VERSION:
        raise FeatureStoreError(f"{path}: format version {f.attrs['format_version']} is newer than this vlkit reads")
    missing = [name for name in FILE_ATTRS if name not in f.attrs]
    if missing:
        raise FeatureStoreError(f"{path}: says it is a vlkit feature store but lacks the file attribute(s) "
                                f"{', '.join(missing)}; it was not written by vlkit's FeatureStoreWriter")
    try:
        provenance, schema = json.loads(f.attrs["provenance"]), json.loads(f.attrs["schema"])
        schema = {str(k): tuple(int(d) for d in v) for k, v in schema.items()}
        if not isinstance(provenance, dict):
            raise TypeError(f"provenance is a {type(provenance).__name__}")
    except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as e:
        raise FeatureStoreError(f"{path}: the provenance / schema attributes are not vlkit's JSON ({e})") from e
    return {"provenance": provenance, "schema": schema, "dtype": str(f.attrs["dtype"])}


def provenance_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    keys = (set(a) | set(b)) - set(UNCOMPARED)
    return sorted(k for k in keys if a.get(k) != b.get(k))


def copy_images(sources: list[Path], dst) -> int:
    """Copy every image group of ``sources`` into the open h5 ``dst``, once (an image found again, in
    shards a kill left beside the store they were merged into, is the same image); returns the count."""
    for source in sources:
        with open_h5(source) as src:
            for name in src:
                if name not in dst:
                    src.copy(src[name], dst, name=name)
    return len(dst)
