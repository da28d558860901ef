"""Sharded feature stores: a directory of one-file stores (shards) plus an index (image id -> shard).

A sharded store is a directory ``DIR/`` holding shard files ``*.h5`` (each a complete store written by
`vlkit.features.store.FeatureStoreWriter`, e.g. one per extraction process: ``shard-00001-of-00004.h5``)
and ``index.json``: the format, the provenance / schema / dtype every shard shares, and for each shard its
file name, size in bytes and image ids. `vlkit.features.store.FeatureStore` reads a directory exactly
like one file. Writers in different processes never touch the same file (`shard_name` names a rank's
shard; `shard_of` gives an image its rank by a stable hash of its id), and the index is built once they
are all done (`build_index`, atomic): every shard's provenance (bar the vlkit version), schema and dtype
must agree with the first shard's, and an image id may live in one shard only; a mismatch is a
`FeatureStoreError` naming the shard file. `merge_shards` joins the shards into one file
(``vlkit merge-features src=DIR out=FILE.h5``; without ``out`` it (re)builds the index).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from vlkit.config import SWITCH
from vlkit.features.h5format import (FeatureStoreError, copy_images, file_attrs, open_h5, provenance_diff,
                                     unescape_id)
from vlkit.io import atomic_path, atomic_write_text, refuse_overwrite

INDEX = "index.json"
INDEX_FORMAT = "vlkit-features-index"
INDEX_VERSION = 1


def shard_of(image_id: str, num_shards: int) -> int:
    """The shard (rank) of ``image_id`` among ``num_shards``: a stable hash of the id (BLAKE2b, the same on
    every machine and Python process, unlike ``hash``)."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be positive, got {num_shards}")
    digest = hashlib.blake2b(str(image_id).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def shard_name(rank: int, num_shards: int) -> str:
    """``shard-<rank>-of-<num_shards>.h5`` (zero-padded)."""
    return f"shard-{rank:05d}-of-{num_shards:05d}.h5"


def shard_files(directory: str | os.PathLike) -> list[Path]:
    """The shard files of a sharded store directory (``*.h5``, sorted; temporary files left out)."""
    directory = Path(directory)
    return sorted(p for p in directory.glob("*.h5") if not p.name.startswith(".") and p.is_file())


def build_index(directory: str | os.PathLike) -> Path:
    """Check the shards of ``directory`` against each other and write ``index.json`` (atomically).

    Refuses (`FeatureStoreError` naming the shard): an unfinished shard (its writer's ``.parts`` folder is
    still there), a shard whose provenance, schema or dtype differ from the first shard's, an image id in
    two shards, a directory without shards."""
    directory = Path(directory)
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory}: a sharded feature store is a directory")
    files = shard_files(directory)
    if not files:
        raise FeatureStoreError(f"{directory}: no shard files (*.h5) in this directory")
    unfinished = [p for p in files if p.with_name(p.name + ".parts").exists()]
    unfinished += [directory / n[: -len(".parts")] for n in os.listdir(directory)
                   if n.endswith(".h5.parts") and not (directory / n[: -len(".parts")]).exists()]
    if unfinished:
        raise FeatureStoreError(f"{unfinished[0]}: unfinished shard (its writer left {unfinished[0].name}.parts); "
                                "finish the extraction (run it again with resume=true) before building the index")
    first: tuple[Path, dict[str, Any]] | None = None
    owner: dict[str, str] = {}
    shards = []
    for path in files:
        with open_h5(path) as f:
            attrs = file_attrs(f, path)
            ids = [unescape_id(k) for k in f.keys()]
        if first is None:
            first = (path, attrs)
        else:
            ref_path, ref = first
            diff = provenance_diff(ref["provenance"], attrs["provenance"])
            diff += ["dtype"] if attrs["dtype"] != ref["dtype"] else []
            if diff:
                raise FeatureStoreError(f"{path}: written with different settings than {ref_path.name} "
                                        f"({', '.join(diff)}); the shards of one store must share their provenance")
            if attrs["schema"] and ref["schema"] and attrs["schema"] != ref["schema"]:
                raise FeatureStoreError(f"{path}: has fields {attrs['schema']} but {ref_path.name} has {ref['schema']}")
            if attrs["schema"] and not ref["schema"]:  # an empty first shard fixes no schema
                first = (ref_path, {**ref, "schema": attrs["schema"]})
        for image_id in ids:
            if image_id in owner:
                raise FeatureStoreError(f"{path}: image {image_id!r} is also in {owner[image_id]}; "
                                        "an image may live in one shard only")
            owner[image_id] = path.name
        shards.append({"file": path.name, "size": path.stat().st_size, "num_images": len(ids), "ids": ids})
    assert first is not None
    ref = first[1]
    index = {"format": INDEX_FORMAT, "format_version": INDEX_VERSION, "provenance": ref["provenance"],
             "schema": {k: list(v) for k, v in ref["schema"].items()}, "dtype": ref["dtype"],
             "num_images": len(owner), "shards": shards}
    path = directory / INDEX
    atomic_write_text(path, json.dumps(index))
    return path


def read_index(directory: str | os.PathLike) -> dict[str, Any]:
    """``index.json`` of a sharded store, checked against the shard files (each present, of the size the
    index recorded); a missing or stale index is a `FeatureStoreError` saying how to rebuild it."""
    directory = Path(directory)
    path = directory / INDEX
    rebuild = f"run `vlkit merge-features src={directory}` to build it"
    if not path.is_file():
        hint = f" ({len(shard_files(directory))} shard files are there)" if directory.is_dir() else ""
        raise FeatureStoreError(f"{path}: no index of the sharded feature store{hint}; {rebuild}")
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
        if index.get("format") != INDEX_FORMAT:
            raise ValueError(f"format {index.get('format')!r}, expected {INDEX_FORMAT!r}")
        if int(index.get("format_version", 0)) > INDEX_VERSION:
            raise ValueError(f"format version {index['format_version']} is newer than this vlkit reads")
        index["schema"] = {str(k): tuple(int(d) for d in v) for k, v in index["schema"].items()}
        for shard in index["shards"]:
            shard["file"], shard["size"], shard["ids"]  # noqa: B018 - the keys must be there
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise FeatureStoreError(f"{path}: not a vlkit feature store index ({type(e).__name__}: {e}); {rebuild}") from e
    for shard in index["shards"]:
        file = directory / shard["file"]
        if not file.is_file():
            raise FeatureStoreError(f"{file}: shard listed in {path} is missing; {rebuild}")
        if file.stat().st_size != shard["size"]:
            raise FeatureStoreError(f"{file}: changed since {path} was built ({file.stat().st_size} bytes, the index "
                                    f"says {shard['size']}); {rebuild}")
    known = {s["file"] for s in index["shards"]}
    extra = [p.name for p in shard_files(directory) if p.name not in known]
    if extra:
        raise FeatureStoreError(f"{directory / extra[0]}: shard not in {path} (written after the index?); {rebuild}")
    return index


def merge_shards(directory: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False) -> Path:
    """Join the shards of ``directory`` into the one-file store ``out`` (atomically); the shards are checked
    against each other first (`build_index`). An existing ``out`` is refused unless ``overwrite``."""
    directory, out = Path(directory), Path(out)
    refuse_overwrite(out, overwrite)
    build_index(directory)
    index = read_index(directory)
    sources = [directory / s["file"] for s in index["shards"]]
    with open_h5(sources[0]) as f:
        attrs = {k: v for k, v in f.attrs.items() if k not in ("num_images", "replaces", "level")}
    schema_source = next((directory / s["file"] for s in index["shards"] if s["num_images"]), sources[0])
    with open_h5(schema_source) as f:
        for key in ("schema", "box_order", "has_soft_labels"):
            attrs[key] = f.attrs[key]
    with atomic_path(out) as tmp:
        with open_h5(tmp, "w") as dst:
            for key, value in attrs.items():
                dst.attrs[key] = value
            dst.attrs["num_images"] = copy_images(sources, dst)
    return out


# The rules of the command's own keys (`vlkit.config.Rule`), checked by the console before the command runs.
KEY_RULES = {"merge-features": {"overwrite": SWITCH}}

def merge_features(cfg: Any) -> int:
    """``vlkit merge-features src=DIR [out=FILE.h5]``: build DIR's index, and with ``out`` join its shards."""
    directory = Path(cfg.src)
    if cfg.get("out"):
        out = merge_shards(directory, cfg.out, bool(cfg.get("overwrite")))
        print(f"{out}: {len(read_index(directory)['shards'])} shards of {directory} joined")
    else:
        path = build_index(directory)
        index = read_index(directory)
        print(f"{path}: {index['num_images']} images in {len(index['shards'])} shards")
    return 0


__all__ = ["INDEX", "build_index", "merge_features", "merge_shards", "read_index", "shard_files", "shard_name",
           "shard_of"]
