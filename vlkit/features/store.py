"""The h5py region-feature store (importers of other formats: `vlkit.features.importers`).

Layout: one group per image id (``/<image_id>/``; ``%`` and ``/`` in ids are %-escaped) with datasets
``features`` [N, D] (float16 or float32), ``boxes`` [N, 4] (float32 pixels, xyxy), optional ``cls_prob``
[N, C] (background first), ``attr_prob`` [N, A], ``conf`` [N], ``box_wh`` [N, 2] (normalised box width and
height exactly as the source format stored them, e.g. UNITER's fp16 ``norm_bb[:, 4:6]``), ``objects_id``/``objects_conf``,
``attrs_id``/``attrs_conf``, and attributes ``image_h``, ``image_w``. Rows are sorted by descending
``conf`` (file attribute ``box_order``). File attributes record the format, the field schema and the
extractor's provenance (JSON).

Writes are atomic and resumable: ``FeatureStoreWriter`` buffers images and commits them with ``flush``
as shard files ``<out>.parts/shard-*.h5`` (each via temp file + rename; every ``flush_every`` images, and
`vlkit.features.detector.extract_features` flushes after every batch); ``close`` merges the shards
(and, on resume, the existing store) into a temp file renamed over ``<out>``. A killed run loses at
most the images not yet flushed; the next run with ``resume=True`` skips every image already in a
shard or in ``<out>``, and first deletes the temporary files a killed run left. Every
``compact_every`` shards of one level are merged into one shard of the next level (as in an LSM tree:
each image is copied about log_compact_every(N) times), which records the shards it replaces: a kill
between its rename and their deletion is finished on the next start, so no image is stored twice.

Every image is validated on write and on read (`vlkit.validate.region_problems`: at least one box,
finite values, boxes well-ordered and inside the image); a bad one raises `InvalidRegionsError`
naming the file and the image id.

The number of boxes is chosen at load time: a fixed ``num_bb`` (first rows) or, as UNITER's
``compute_num_bb``, ``min(max_bb, max(min_bb, #(conf > conf_th)))`` over the confidence-sorted rows.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from vlkit.features.h5format import (FORMAT, FORMAT_VERSION, FeatureStoreError, copy_images, escape_id, file_attrs,
                                     open_h5, provenance_diff, unescape_id, vlkit_version)
from vlkit.features.shards import read_index
from vlkit.io import atomic_path, remove_orphans
from vlkit.validate import DataError, region_problems

log = logging.getLogger(__name__)

# field -> (rank, storage dtype; None = the writer's feature dtype)
FIELDS: dict[str, tuple[int, str | None]] = {
    "features": (2, None), "boxes": (2, "float32"), "cls_prob": (2, None), "attr_prob": (2, None),
    "conf": (1, "float32"), "box_wh": (2, "float32"), "objects_id": (1, "int32"), "objects_conf": (1, "float32"),
    "attrs_id": (1, "int32"), "attrs_conf": (1, "float32"),
}
REQUIRED = ("features", "boxes")
CHECKED = ("cls_prob", "attr_prob", "conf", "objects_conf", "attrs_conf")  # float fields that must be finite
COMPACT_EVERY = 64


class InvalidRegionsError(FeatureStoreError, DataError):
    """An image whose regions fail validation (no box, NaN / inf, boxes outside the image or inverted)."""


def regions_error(path: Any, image_id: str, problems: list[str]) -> InvalidRegionsError:
    return InvalidRegionsError(f"{path}: image {image_id!r}: {'; '.join(problems)}")


def skipped_path(out: str | os.PathLike) -> Path:
    """Where ``on_error=skip`` records the images extraction or import left out of the store ``out``
    (``<out>.skipped.jsonl``, one JSON object per image with its reason)."""
    out = Path(out)
    return out.with_name(out.name + ".skipped.jsonl")


# --------------------------------------------------------------------------- writing


class FeatureStoreWriter:
    """Write a feature store atomically and resumably (see the module docstring).

    ``with FeatureStoreWriter(path, provenance={...}) as w: w.add(image_id, features=..., boxes=..., ...)``;
    ``w.done_ids`` holds the ids already stored (skip them when resuming).
    """

    def __init__(
        self, path: str | os.PathLike, provenance: Mapping[str, Any] | None = None, resume: bool = True,
        dtype: str = "float16", flush_every: int = 256, compression: str | None = None,
        compact_every: int = COMPACT_EVERY,
    ):
        if dtype not in ("float16", "float32"):
            raise ValueError(f"dtype must be float16 or float32, got {dtype!r}")
        self.path = Path(path)
        self.parts = self.path.with_name(self.path.name + ".parts")
        self.provenance = json.loads(json.dumps({**(provenance or {}), "vlkit_version": vlkit_version()}, default=str))
        self.dtype = dtype
        self.flush_every = flush_every
        self.compact_every = compact_every
        self.compression = compression
        self.resume = resume
        self.done_ids: set[str] = set()
        self._schema: dict[str, tuple[int, ...]] | None = None
        self._buffer: list[tuple[str, dict[str, Any]]] = []
        self._seq = 0
        self._levels: dict[str, int] = {}  # shard name -> compaction level (0: written by flush)
        self._closed = False
        self._remove_orphans()
        if not resume:
            shutil.rmtree(self.parts, ignore_errors=True)
            return
        self._finish_compaction()
        for source in self._sources():
            with open_h5(source) as f:
                attrs = file_attrs(f, source)
                diff = provenance_diff(attrs["provenance"], self.provenance)
                diff += ["dtype"] if attrs["dtype"] != dtype else []
                if diff:
                    raise FeatureStoreError(
                        f"{source}: written with different settings ({', '.join(diff)}); resume=False starts over"
                    )
                self._check_schema(attrs["schema"], str(source))
                self.done_ids.update(unescape_id(k) for k in f.keys())
                if source != self.path:
                    self._levels[source.name] = int(f.attrs.get("level", 0))
        shards = self._shards()
        self._seq = int(shards[-1].stem.split("-")[1]) + 1 if shards else 0

    def _shards(self) -> list[Path]:
        return sorted(self.parts.glob("shard-*.h5")) if self.parts.is_dir() else []

    def _remove_orphans(self) -> None:
        """Delete the temporary files a killed writer left (a shard or the final merge in progress)."""
        remove_orphans(self.path)
        if self.parts.is_dir():
            for name in {n[1:].split(".tmp-")[0] for n in os.listdir(self.parts) if n.startswith(".") and ".tmp-" in n}:
                remove_orphans(self.parts / name)

    def _finish_compaction(self) -> None:
        """Delete the shards a compacted shard replaces (left when a kill came between its rename and their deletion)."""
        for shard in self._shards():
            with open_h5(shard) as f:
                replaced = json.loads(f.attrs.get("replaces", "[]"))
            for name in replaced:
                (self.parts / name).unlink(missing_ok=True)

    def _next_shard(self) -> Path:
        self.parts.mkdir(parents=True, exist_ok=True)
        shard = self.parts / f"shard-{self._seq:06d}.h5"
        self._seq += 1
        return shard

    def _sources(self) -> list[Path]:
        existing = [self.path] if self.resume and self.path.exists() else []
        return existing + self._shards()

    def _check_schema(self, schema: dict[str, tuple[int, ...]], where: str) -> None:
        if not schema:  # an empty store fixes nothing
            return
        if self._schema is None:
            self._schema = schema
        elif schema != self._schema:
            raise FeatureStoreError(
                f"{self.path}: {where} has fields {schema} but the store has {self._schema}"
            )

    def add(self, image_id: str, *, features: Any, boxes: Any, image_h: int, image_w: int, **optional: Any) -> None:
        """Add one image; optional fields: ``cls_prob``, ``attr_prob``, ``conf``, ``box_wh``, ``objects_id``,
        ``objects_conf``, ``attrs_id``, ``attrs_conf``. Rows are re-sorted by descending ``conf``."""
        if self._closed:
            raise FeatureStoreError(f"{self.path}: writer is closed")
        image_id = str(image_id)
        unknown = sorted(set(optional) - set(FIELDS))
        if unknown:
            raise TypeError(f"image {image_id!r}: unknown fields {unknown}; known: {sorted(FIELDS)}")
        if image_id in self.done_ids:
            raise FeatureStoreError(f"{self.path}: image {image_id!r} is already in the store")
        data = {"features": features, "boxes": boxes, **{k: v for k, v in optional.items() if v is not None}}
        rows = {}
        n = None
        for name, value in data.items():
            rank, dtype = FIELDS[name]
            arr = np.asarray(value, dtype=dtype or self.dtype)
            if arr.ndim != rank or (n is not None and arr.shape[0] != n):
                raise ValueError(f"image {image_id!r}: field {name} has shape {arr.shape}; expected rank {rank} with {n} rows")
            n = arr.shape[0]
            rows[name] = arr
        if rows["boxes"].shape[1] != 4:
            raise ValueError(f"image {image_id!r}: boxes must be [N, 4], got {rows['boxes'].shape}")
        if int(image_h) <= 0 or int(image_w) <= 0:
            raise regions_error(self.path, image_id, [f"image size must be positive, got h={image_h}, w={image_w}"])
        problems = region_problems(rows["features"], rows["boxes"], int(image_h), int(image_w),
                                   **{k: rows[k] for k in CHECKED if k in rows})
        if problems:
            raise regions_error(self.path, image_id, problems)
        self._check_schema({k: tuple(v.shape[1:]) for k, v in sorted(rows.items())}, f"image {image_id!r}")
        if "conf" in rows:
            order = np.argsort(-rows["conf"].astype(np.float64), kind="stable")
            rows = {k: v[order] for k, v in rows.items()}
        rows["image_h"], rows["image_w"] = int(image_h), int(image_w)
        self._buffer.append((image_id, rows))
        self.done_ids.add(image_id)
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def _write_attrs(self, f) -> None:
        schema = self._schema or {}
        f.attrs["vlkit_format"] = FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["provenance"] = json.dumps(self.provenance, sort_keys=True)
        f.attrs["schema"] = json.dumps({k: list(v) for k, v in schema.items()})
        f.attrs["dtype"] = self.dtype
        f.attrs["box_order"] = "descending conf" if "conf" in schema else "as written"
        f.attrs["has_soft_labels"] = "cls_prob" in schema
        f.attrs["boxes"] = "xyxy, " + str(self.provenance.get("box_units", "pixels"))

    def flush(self) -> None:
        """Commit the buffered images as a new shard (atomically); then `compact` what has piled up."""
        if not self._buffer:
            return
        shard = self._next_shard()
        with atomic_path(shard) as tmp:
            with open_h5(tmp, "w") as f:
                self._write_attrs(f)
                for image_id, rows in self._buffer:
                    g = f.create_group(escape_id(image_id))
                    g.attrs["image_h"], g.attrs["image_w"] = rows["image_h"], rows["image_w"]
                    for name, arr in rows.items():
                        if name in ("image_h", "image_w"):
                            continue
                        g.create_dataset(name, data=arr, compression=self.compression if arr.ndim == 2 else None)
        self._buffer.clear()
        self._levels[shard.name] = 0
        self.compact()

    def compact(self) -> None:
        """While ``compact_every`` shards share a level, merge them into one shard of the next level
        (atomically; it records the names it replaces), then delete them."""
        while self.compact_every > 1:
            by_level: dict[int, list[str]] = {}
            for name, level in sorted(self._levels.items()):
                by_level.setdefault(level, []).append(name)
            full = [(level, names) for level, names in sorted(by_level.items()) if len(names) >= self.compact_every]
            if not full:
                return
            level, names = full[0]
            target = self._next_shard()
            with atomic_path(target) as tmp:
                with open_h5(tmp, "w") as dst:
                    self._write_attrs(dst)
                    dst.attrs["replaces"] = json.dumps(names)
                    dst.attrs["level"] = level + 1
                    copy_images([self.parts / n for n in names], dst)
            for name in names:
                (self.parts / name).unlink(missing_ok=True)
                del self._levels[name]
            self._levels[target.name] = level + 1

    def close(self) -> Path:
        """Flush and merge everything into ``path`` (atomic rename); returns the path."""
        if self._closed:
            return self.path
        self.flush()
        self._closed = True
        shards = self._shards()
        if not shards and self.path.exists() and self.resume:
            return self.path
        sources = self._sources()
        with atomic_path(self.path) as tmp:
            with open_h5(tmp, "w") as dst:
                self._write_attrs(dst)
                dst.attrs["num_images"] = copy_images(sources, dst)
        shutil.rmtree(self.parts, ignore_errors=True)
        return self.path

    def __enter__(self) -> "FeatureStoreWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # keep what is complete for a resumed run; never publish a partial store
            self._closed = True
            try:
                self.flush()
            except Exception as err:  # noqa: BLE001 - the first failure (a full disk fails this flush too) is reported
                log.warning("%s: the last %d buffered image(s) could not be kept (%s); a resumed run extracts them "
                            "again", self.path, len(self._buffer), err)


# --------------------------------------------------------------------------- reading


@dataclass
class Regions:
    """Regions of one image as loaded: float32 arrays, rows sorted by descending confidence."""

    features: np.ndarray
    boxes: np.ndarray
    image_h: int
    image_w: int
    conf: np.ndarray | None = None
    box_wh: np.ndarray | None = None
    cls_prob: np.ndarray | None = None
    attr_prob: np.ndarray | None = None
    objects_id: np.ndarray | None = None
    objects_conf: np.ndarray | None = None
    attrs_id: np.ndarray | None = None
    attrs_conf: np.ndarray | None = None

    def __len__(self) -> int:
        return self.features.shape[0]


def num_boxes(conf: np.ndarray, conf_th: float = 0.2, max_bb: int = 100, min_bb: int = 10) -> int:
    """UNITER ``compute_num_bb``: ``min(max_bb, max(min_bb, #(conf > conf_th)))``, at most ``len(conf)``."""
    return min(max_bb, max(min_bb, int((np.asarray(conf) > conf_th).sum())), len(conf))


class FeatureStore:
    """Read-only access to a feature store: one h5 file, or a sharded store (a directory of shard files
    with ``index.json``, `vlkit.features.shards`) read exactly like one file. Files are opened lazily once
    per process, so a store object can be handed to DataLoader workers. Errors name the file (the shard)
    at fault."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._owner: dict[str, str] | None = None  # sharded: image id -> shard file name
        if self.path.is_dir():
            index = read_index(self.path)
            self._meta = {k: index[k] for k in ("provenance", "schema", "dtype")}
            self._owner = {i: s["file"] for s in index["shards"] for i in s["ids"]}
            self._shard_sizes = {s["file"]: s["num_images"] for s in index["shards"]}
            self._extra: dict[str, Any] = {"vlkit_format": FORMAT, "dtype": index["dtype"], "sharded": True,
                                           "num_shards": len(index["shards"]), "num_images": len(self._owner)}
            if index["shards"]:
                with open_h5(self.path / index["shards"][0]["file"]) as f:
                    self._extra.update({k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()
                                        if k in ("box_order", "has_soft_labels", "boxes", "format_version")})
                self._extra["box_order"] = "descending conf" if "conf" in index["schema"] else "as written"
                self._extra["has_soft_labels"] = "cls_prob" in index["schema"]
        else:
            if not self.path.exists():
                parts = self.path.with_name(self.path.name + ".parts")
                hint = f"; an unfinished run left {parts} (run again with resume=true)" if parts.exists() else ""
                raise FileNotFoundError(f"{self.path}: feature store not found{hint}")
            with open_h5(self.path) as f:
                self._meta = file_attrs(f, self.path)
                self._extra = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()
                               if k not in ("provenance", "schema")}
        self._files: dict[str, Any] = {}
        self._pid: int | None = None
        self._ids: list[str] | None = None

    def _h5(self, shard: str | None = None):
        """The open h5 file (of ``shard`` in a sharded store), opened once per process; a shard is checked
        on first opening against the index (its provenance, schema, dtype and image count)."""
        if self._pid != os.getpid():
            self._files, self._pid = {}, os.getpid()
        name = shard or ""
        f = self._files.get(name)
        if f is None:
            path = self.path / shard if shard else self.path
            f = open_h5(path)
            if shard:
                self._check_shard(f, path, shard)
            self._files[name] = f
        return f

    def _check_shard(self, f, path: Path, shard: str) -> None:
        attrs = file_attrs(f, path)
        diff = provenance_diff(attrs["provenance"], self._meta["provenance"])
        diff += ["dtype"] if attrs["dtype"] != self._meta["dtype"] else []
        diff += ["schema"] if attrs["schema"] and attrs["schema"] != self._meta["schema"] else []
        diff += ["image count"] if len(f) != self._shard_sizes[shard] else []
        if diff:
            f.close()
            raise FeatureStoreError(f"{path}: differs from the index {self.path / 'index.json'} ({', '.join(diff)}); "
                                    f"rebuild it with `vlkit merge-features src={self.path}`")

    def _group(self, image_id: str):
        """(h5 group of ``image_id`` or None, the file that holds it)."""
        if self._owner is None:
            return self._h5().get(escape_id(image_id)), self.path
        shard = self._owner.get(image_id)
        if shard is None:
            return None, self.path
        return self._h5(shard).get(escape_id(image_id)), self.path / shard

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": {}, "_pid": None}

    def close(self) -> None:
        if self._pid == os.getpid():
            for f in self._files.values():
                f.close()
        self._files = {}

    def __enter__(self) -> "FeatureStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def attrs(self) -> dict[str, Any]:
        """Provenance plus format facts (schema, dtype, box order)."""
        return {**self._meta["provenance"], **self._extra, "schema": self._meta["schema"]}

    @property
    def schema(self) -> dict[str, tuple[int, ...]]:
        return self._meta["schema"]

    @property
    def feature_dim(self) -> int:
        return int(self.schema["features"][0]) if "features" in self.schema else 0

    @property
    def num_classes(self) -> int | None:
        return int(self.schema["cls_prob"][0]) if "cls_prob" in self.schema else None

    @property
    def has_soft_labels(self) -> bool:
        return "cls_prob" in self.schema

    def ids(self) -> list[str]:
        if self._ids is None:
            self._ids = list(self._owner) if self._owner is not None else [unescape_id(k) for k in self._h5().keys()]
        return list(self._ids)

    def __contains__(self, image_id: object) -> bool:
        if self._owner is not None:
            return str(image_id) in self._owner
        return escape_id(str(image_id)) in self._h5()

    def __len__(self) -> int:
        return len(self._owner) if self._owner is not None else len(self._h5())

    def load(
        self, image_id: str, num_bb: int | None = None, conf_th: float = 0.2, max_bb: int = 100, min_bb: int = 10
    ) -> Regions:
        """Regions of ``image_id``: the first ``num_bb`` rows, or the UNITER adaptive count."""
        image_id = str(image_id)
        g, path = self._group(image_id)
        if g is None:
            raise KeyError(f"{self.path}: image id {image_id!r} not in the store")
        try:
            total = g["features"].shape[0]
            if num_bb is not None:
                n = min(int(num_bb), total)
            elif "conf" in g:
                n = num_boxes(g["conf"][()], conf_th, max_bb, min_bb)
            else:
                raise FeatureStoreError(
                    f"{path}: image {image_id!r} has no 'conf' for adaptive box counts; pass num_bb"
                )
            out = {}
            for name in self.schema:
                ds = g[name]
                if ds.shape[0] != total:
                    raise FeatureStoreError(f"{path}: image {image_id!r}: {name} has {ds.shape[0]} rows, features {total}")
                arr = ds[:n]
                out[name] = arr.astype(np.float32) if arr.dtype.kind == "f" else arr.astype(np.int64)
            image_h, image_w = int(g.attrs["image_h"]), int(g.attrs["image_w"])
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise FeatureStoreError(f"{path}: image {image_id!r} is unreadable ({type(e).__name__}: {e})") from e
        if "features" not in out or "boxes" not in out:
            raise FeatureStoreError(f"{path}: image {image_id!r} has no features / boxes (schema {self.schema})")
        problems = region_problems(out["features"], out["boxes"], image_h, image_w,
                                   **{k: out[k] for k in CHECKED if k in out})
        if problems:
            raise regions_error(path, image_id, problems)
        return Regions(image_h=image_h, image_w=image_w, **out)


__all__ = ["FeatureStore", "FeatureStoreWriter", "FeatureStoreError", "InvalidRegionsError", "Regions", "num_boxes",
           "regions_error", "skipped_path"]
