"""The h5py region-feature store, and importers of the formats users already hold.

Layout: one group per image id (``/<image_id>/``; ``%`` and ``/`` in ids are %-escaped) with datasets
``features`` [N, D] (float16 or float32), ``boxes`` [N, 4] (float32 pixels, xyxy), optional ``cls_prob``
[N, C] (background first), ``attr_prob`` [N, A], ``conf`` [N], ``objects_id``/``objects_conf``,
``attrs_id``/``attrs_conf``, and attributes ``image_h``, ``image_w``. Rows are sorted by descending
``conf`` (file attribute ``box_order``). File attributes record the format, the field schema and the
extractor's provenance (JSON).

Writes are atomic and resumable: ``FeatureStoreWriter`` buffers images and writes them in shard files
``<out>.parts/shard-*.h5`` (each via temp file + rename); ``close`` merges the shards (and, on resume,
the existing store) into a temp file renamed over ``<out>``. A killed run loses at most the buffered
images; the next run with ``resume=True`` skips every image already in a shard or in ``<out>``.

The number of boxes is chosen at load time: a fixed ``num_bb`` (first rows) or, as UNITER's
``compute_num_bb``, ``min(max_bb, max(min_bb, #(conf > conf_th)))`` over the confidence-sorted rows.
"""
from __future__ import annotations

import base64
import csv
import io
import json
import os
import shutil
import sys
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from vlkit.io import atomic_path, safe_pickle_load

FORMAT = "vlkit-features"
FORMAT_VERSION = 1
# field -> (rank, storage dtype; None = the writer's feature dtype)
FIELDS: dict[str, tuple[int, str | None]] = {
    "features": (2, None), "boxes": (2, "float32"), "cls_prob": (2, None), "attr_prob": (2, None),
    "conf": (1, "float32"), "objects_id": (1, "int32"), "objects_conf": (1, "float32"),
    "attrs_id": (1, "int32"), "attrs_conf": (1, "float32"),
}
REQUIRED = ("features", "boxes")
_UNCOMPARED = ("vlkit_version",)


class FeatureStoreError(RuntimeError):
    """A store file that cannot be read or written as asked (the message names the file and image)."""


def _key(image_id: str) -> str:
    key = str(image_id).replace("%", "%25").replace("/", "%2F")
    return "%2E" if key == "." else key


def _unkey(key: str) -> str:
    return "." if key == "%2E" else key.replace("%2F", "/").replace("%25", "%")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vlkit")
    except PackageNotFoundError:
        import vlkit

        return vlkit.__version__


def _open_h5(path: Path, mode: str = "r"):
    import h5py

    try:
        return h5py.File(path, mode)
    except OSError as e:
        raise FeatureStoreError(f"{path}: cannot open as HDF5 ({e}); the file is truncated or not a feature store") from e


def _file_attrs(f, path: Path) -> dict[str, Any]:
    if f.attrs.get("vlkit_format") != FORMAT:
        raise FeatureStoreError(f"{path}: not a vlkit feature store (missing vlkit_format={FORMAT!r} attribute)")
    if int(f.attrs.get("format_version", 0)) > FORMAT_VERSION:
        raise FeatureStoreError(f"{path}: format version {f.attrs['format_version']} is newer than this vlkit reads")
    return {
        "provenance": json.loads(f.attrs["provenance"]),
        "schema": {k: tuple(v) for k, v in json.loads(f.attrs["schema"]).items()},
        "dtype": str(f.attrs["dtype"]),
    }


def _provenance_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    keys = (set(a) | set(b)) - set(_UNCOMPARED)
    return sorted(k for k in keys if a.get(k) != b.get(k))


# --------------------------------------------------------------------------- writing


class FeatureStoreWriter:
    """Write a feature store atomically and resumably (see the module docstring).

    ``with FeatureStoreWriter(path, provenance={...}) as w: w.add(image_id, features=..., boxes=..., ...)``;
    ``w.done_ids`` holds the ids already stored (skip them when resuming).
    """

    def __init__(
        self, path: str | os.PathLike, provenance: Mapping[str, Any] | None = None, resume: bool = True,
        dtype: str = "float16", flush_every: int = 256, compression: str | None = None,
    ):
        if dtype not in ("float16", "float32"):
            raise ValueError(f"dtype must be float16 or float32, got {dtype!r}")
        self.path = Path(path)
        self.parts = self.path.with_name(self.path.name + ".parts")
        self.provenance = json.loads(json.dumps({**(provenance or {}), "vlkit_version": _version()}, default=str))
        self.dtype = dtype
        self.flush_every = flush_every
        self.compression = compression
        self.resume = resume
        self.done_ids: set[str] = set()
        self._schema: dict[str, tuple[int, ...]] | None = None
        self._buffer: list[tuple[str, dict[str, Any]]] = []
        self._seq = 0
        self._closed = False
        if not resume:
            shutil.rmtree(self.parts, ignore_errors=True)
            return
        for source in self._sources():
            with _open_h5(source) as f:
                attrs = _file_attrs(f, source)
                diff = _provenance_diff(attrs["provenance"], self.provenance)
                diff += ["dtype"] if attrs["dtype"] != dtype else []
                if diff:
                    raise FeatureStoreError(
                        f"{source}: written with different settings ({', '.join(diff)}); resume=False starts over"
                    )
                self._check_schema(attrs["schema"], str(source))
                self.done_ids.update(_unkey(k) for k in f.keys())
        shards = self._shards()
        self._seq = int(shards[-1].stem.split("-")[1]) + 1 if shards else 0

    def _shards(self) -> list[Path]:
        return sorted(self.parts.glob("shard-*.h5")) if self.parts.is_dir() else []

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
        """Add one image; optional fields: ``cls_prob``, ``attr_prob``, ``conf``, ``objects_id``,
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
        for name in ("features", "boxes"):
            if not np.isfinite(rows[name]).all():
                raise ValueError(f"image {image_id!r}: field {name} holds NaN or inf")
        if int(image_h) <= 0 or int(image_w) <= 0:
            raise ValueError(f"image {image_id!r}: image size must be positive, got h={image_h}, w={image_w}")
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
        """Write the buffered images to a new shard (atomically)."""
        if not self._buffer:
            return
        self.parts.mkdir(parents=True, exist_ok=True)
        shard = self.parts / f"shard-{self._seq:06d}.h5"
        with atomic_path(shard) as tmp:
            with _open_h5(tmp, "w") as f:
                self._write_attrs(f)
                for image_id, rows in self._buffer:
                    g = f.create_group(_key(image_id))
                    g.attrs["image_h"], g.attrs["image_w"] = rows.pop("image_h"), rows.pop("image_w")
                    for name, arr in rows.items():
                        g.create_dataset(name, data=arr, compression=self.compression if arr.ndim == 2 else None)
        self._seq += 1
        self._buffer.clear()

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
            with _open_h5(tmp, "w") as dst:
                self._write_attrs(dst)
                total = 0
                for source in sources:
                    with _open_h5(source) as src:
                        for name in src:
                            src.copy(src[name], dst, name=name)
                            total += 1
                dst.attrs["num_images"] = total
        shutil.rmtree(self.parts, ignore_errors=True)
        return self.path

    def __enter__(self) -> "FeatureStoreWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # keep what is complete for a resumed run; never publish a partial store
            self.flush()
            self._closed = True


# --------------------------------------------------------------------------- reading


@dataclass
class Regions:
    """Regions of one image as loaded: float32 arrays, rows sorted by descending confidence."""

    features: np.ndarray
    boxes: np.ndarray
    image_h: int
    image_w: int
    conf: np.ndarray | None = None
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
    """Read-only access to a feature store; the h5 file is opened lazily once per process, so a
    store object can be handed to DataLoader workers."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            parts = self.path.with_name(self.path.name + ".parts")
            hint = f"; an unfinished run left {parts} (run again with resume=true)" if parts.exists() else ""
            raise FileNotFoundError(f"{self.path}: feature store not found{hint}")
        with _open_h5(self.path) as f:
            self._meta = _file_attrs(f, self.path)
            self._extra = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()
                           if k not in ("provenance", "schema")}
        self._file = None
        self._pid: int | None = None
        self._ids: list[str] | None = None

    def _h5(self):
        if self._file is None or self._pid != os.getpid():
            self._file = _open_h5(self.path)
            self._pid = os.getpid()
        return self._file

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None, "_pid": None}

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None

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
            self._ids = [_unkey(k) for k in self._h5().keys()]
        return list(self._ids)

    def __contains__(self, image_id: object) -> bool:
        return _key(str(image_id)) in self._h5()

    def __len__(self) -> int:
        return len(self._h5())

    def load(
        self, image_id: str, num_bb: int | None = None, conf_th: float = 0.2, max_bb: int = 100, min_bb: int = 10
    ) -> Regions:
        """Regions of ``image_id``: the first ``num_bb`` rows, or the UNITER adaptive count."""
        image_id = str(image_id)
        g = self._h5().get(_key(image_id))
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
                    f"{self.path}: image {image_id!r} has no 'conf' for adaptive box counts; pass num_bb"
                )
            out = {}
            for name in self.schema:
                ds = g[name]
                if ds.shape[0] != total:
                    raise FeatureStoreError(f"{self.path}: image {image_id!r}: {name} has {ds.shape[0]} rows, features {total}")
                arr = ds[:n]
                out[name] = arr.astype(np.float32) if arr.dtype.kind == "f" else arr.astype(np.int64)
            return Regions(image_h=int(g.attrs["image_h"]), image_w=int(g.attrs["image_w"]), **out)
        except (OSError, KeyError) as e:
            raise FeatureStoreError(f"{self.path}: image {image_id!r} is unreadable ({e})") from e


# --------------------------------------------------------------------------- importers

Record = tuple[str, Callable[[], dict[str, Any]]]
IMPORT_FORMATS = ("lxmert_tsv", "butd_tsv", "uniter_npz", "bua_npz")
LXMERT_FIELDS = ("img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id", "attrs_conf", "num_boxes", "boxes", "features")


def _files(src: Path, suffixes: tuple[str, ...]) -> list[Path]:
    if src.is_dir():
        files = sorted(p for p in src.iterdir() if p.suffix in suffixes)
        if not files:
            raise FileNotFoundError(f"{src}: no {'/'.join(suffixes)} files")
        return files
    if not src.exists():
        raise FileNotFoundError(f"{src}: not found")
    return [src]


def _b64(value: str, dtype: str, n: int, where: str, name: str, width: int | None = None) -> np.ndarray:
    """Decode a base64 array of ``n`` rows: [n] (``width`` None), [n, width], or [n, D] (``width`` -1)."""
    try:
        arr = np.frombuffer(base64.b64decode(value, validate=True), dtype=dtype)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: field {name} is not valid base64 {dtype} ({e})") from e
    if width is None and arr.size == n:
        return arr
    if width is not None and n > 0 and arr.size % n == 0 and width in (-1, arr.size // n):
        return arr.reshape(n, -1)
    if width is not None and n == 0 and arr.size == 0:
        return arr.reshape(0, max(width, 0))
    raise ValueError(f"{where}: field {name} has {arr.size} values, which do not fit num_boxes={n}")


def _tsv_rows(path: Path, widths: tuple[int, ...]) -> Iterator[tuple[str, list[str]]]:
    csv.field_size_limit(sys.maxsize)
    with open(path, newline="") as f:
        for lineno, row in enumerate(csv.reader(f, delimiter="\t"), 1):
            if not row:
                continue
            where = f"{path}:{lineno}"
            if len(row) not in widths:
                raise ValueError(f"{where}: {len(row)} tab-separated fields, expected {' or '.join(map(str, widths))}")
            yield where, row


def _int(value: str, where: str, name: str) -> int:
    try:
        return int(float(value))
    except ValueError as e:
        raise ValueError(f"{where}: field {name}={value[:20]!r} is not a number") from e


def lxmert_tsv_records(src: str | os.PathLike) -> Iterator[Record]:
    """LXMERT / py-bottom-up-attention TSV (``img_id, img_h, img_w, objects_id, objects_conf, attrs_id,
    attrs_conf, num_boxes, boxes, features``, arrays base64). ``conf`` = ``objects_conf``."""
    for path in _files(Path(src), (".tsv", ".csv")):
        for where, row in _tsv_rows(path, (len(LXMERT_FIELDS),)):
            r = dict(zip(LXMERT_FIELDS, row))
            where = f"{where} (id {r['img_id']!r})"

            def parse(r: dict[str, str] = r, where: str = where) -> dict[str, Any]:
                n = _int(r["num_boxes"], where, "num_boxes")
                objects_conf = _b64(r["objects_conf"], "float32", n, where, "objects_conf")
                return {
                    "features": _b64(r["features"], "float32", n, where, "features", -1),
                    "boxes": _b64(r["boxes"], "float32", n, where, "boxes", 4),
                    "image_h": _int(r["img_h"], where, "img_h"), "image_w": _int(r["img_w"], where, "img_w"),
                    "conf": objects_conf, "objects_conf": objects_conf,
                    "objects_id": _b64(r["objects_id"], "int64", n, where, "objects_id"),
                    "attrs_id": _b64(r["attrs_id"], "int64", n, where, "attrs_id"),
                    "attrs_conf": _b64(r["attrs_conf"], "float32", n, where, "attrs_conf"),
                }

            yield r["img_id"], parse


def butd_tsv_records(src: str | os.PathLike) -> Iterator[Record]:
    """BUTD TSV (``image_id, image_w, image_h, num_boxes, boxes, features``) or ViLBERT's CC variant with
    ``cls_prob`` [N, 1601]. With ``cls_prob``, ``conf`` is its best foreground probability."""
    for path in _files(Path(src), (".tsv", ".csv")):
        for where, row in _tsv_rows(path, (6, 7)):
            where = f"{where} (id {row[0]!r})"

            def parse(row: list[str] = row, where: str = where) -> dict[str, Any]:
                n = _int(row[3], where, "num_boxes")
                out = {
                    "image_w": _int(row[1], where, "image_w"), "image_h": _int(row[2], where, "image_h"),
                    "boxes": _b64(row[4], "float32", n, where, "boxes", 4),
                    "features": _b64(row[5], "float32", n, where, "features", -1),
                }
                if len(row) == 7:
                    cls_prob = _b64(row[6], "float32", n, where, "cls_prob", -1)
                    out.update(cls_prob=cls_prob, conf=cls_prob[:, 1:].max(axis=1) if n else np.zeros(0))
                return out

            yield row[0], parse


def _image_sizes(image_sizes: Mapping[str, Any] | str | os.PathLike | None) -> Mapping[str, Any] | None:
    if image_sizes is None or isinstance(image_sizes, Mapping):
        return image_sizes
    return json.loads(Path(image_sizes).read_text())


def uniter_npz_records(src: str | os.PathLike, image_sizes: Mapping[str, Any] | str | os.PathLike | None = None) -> Iterator[Record]:
    """UNITER npz directory (float16 ``norm_bb`` [N, 6], ``features``, ``conf``, ``soft_labels``); the id
    is the file stem. ``norm_bb`` is normalised: with ``image_sizes`` (``{id: [h, w]}`` or a JSON file)
    boxes become pixels; without, they stay normalised and image_h = image_w = 1."""
    sizes = _image_sizes(image_sizes)
    for path in _files(Path(src), (".npz",)):

        def parse(path: Path = path) -> dict[str, Any]:
            with np.load(path, allow_pickle=False) as z:
                missing = [k for k in ("norm_bb", "features", "conf", "soft_labels") if k not in z.files]
                if missing:
                    raise ValueError(f"{path}: not a UNITER npz (missing {missing})")
                norm_bb, feats, conf, soft = z["norm_bb"], z["features"], z["conf"], z["soft_labels"]
            h, w = (1, 1) if sizes is None else sizes.get(path.stem, (None, None))
            if h is None:
                raise KeyError(f"{path}: image id {path.stem!r} has no entry in image_sizes")
            boxes = norm_bb[:, :4].astype(np.float32) * np.array([w, h, w, h], dtype=np.float32)
            return {"features": feats, "boxes": boxes, "image_h": h, "image_w": w, "conf": conf, "cls_prob": soft}

        yield path.stem, parse


def _npz_object(path: Path, name: str) -> Any:
    """An object array stored in an npz, unpickled with the restricted unpickler."""
    with zipfile.ZipFile(path) as z:
        try:
            raw = z.read(f"{name}.npy")
        except KeyError as e:
            raise ValueError(f"{path}: no {name!r} array") from e
    f = io.BytesIO(raw)
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    _, _, dtype = read_header(f)
    if dtype.hasobject:
        return safe_pickle_load(f.read())
    return np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)


def bua_npz_records(src: str | os.PathLike) -> Iterator[Record]:
    """bottom-up-attention.pytorch npz (``x``, ``bbox``, ``image_h``, ``image_w``, ``info``). It has no
    soft labels: the store gets no ``cls_prob``. ``conf`` = ``info['objects_conf']``."""
    for path in _files(Path(src), (".npz",)):

        def parse(path: Path = path) -> dict[str, Any]:
            with np.load(path, allow_pickle=False) as z:
                missing = [k for k in ("x", "bbox", "info") if k not in z.files]
                if missing:
                    raise ValueError(f"{path}: not a bottom-up-attention.pytorch npz (missing {missing})")
                feats, boxes = z["x"], z["bbox"]
                size = (z["image_h"], z["image_w"]) if "image_h" in z.files else None
            info = _npz_object(path, "info")
            info = info.item() if isinstance(info, np.ndarray) else info
            if not isinstance(info, dict):
                raise ValueError(f"{path}: 'info' is {type(info).__name__}, expected a dict")
            h, w = size if size is not None else (info["image_h"], info["image_w"])
            return {
                "features": feats, "boxes": boxes, "image_h": int(h), "image_w": int(w),
                "conf": info["objects_conf"], "objects_id": info["objects_id"], "objects_conf": info["objects_conf"],
                "attrs_id": info.get("attrs_id"), "attrs_conf": info.get("attrs_conf"),
            }

        yield path.stem, parse


_NOTES = {
    "lxmert_tsv": "LXMERT/py-bottom-up-attention TSV: no soft labels (cls_prob); conf = objects_conf",
    "butd_tsv": "BUTD TSV: cls_prob only in the 7-field (ViLBERT CC) variant; conf = best foreground cls_prob",
    "uniter_npz": "UNITER npz: float16 features and soft labels kept bit-exact",
    "bua_npz": "bottom-up-attention.pytorch npz: no soft labels (cls_prob); conf = objects_conf",
}


def import_features(
    src: str | os.PathLike, format: str, out: str | os.PathLike, resume: bool = True, dtype: str | None = None,
    image_sizes: Mapping[str, Any] | str | os.PathLike | None = None, progress: bool = True,
) -> Path:
    """Import ``src`` (file or directory) in ``format`` (one of ``IMPORT_FORMATS``) into the store ``out``."""
    from tqdm.auto import tqdm

    if format not in IMPORT_FORMATS:
        raise ValueError(f"unknown import format {format!r}; choose from {', '.join(IMPORT_FORMATS)}")
    if format == "uniter_npz":
        records = uniter_npz_records(src, image_sizes)
    else:
        records = {"lxmert_tsv": lxmert_tsv_records, "butd_tsv": butd_tsv_records, "bua_npz": bua_npz_records}[format](src)
    dtype = dtype or ("float16" if format == "uniter_npz" else "float32")
    provenance = {
        "extractor": f"import:{format}", "source": str(Path(src).resolve()), "note": _NOTES[format],
        "box_units": "normalized (no image_sizes given)" if format == "uniter_npz" and image_sizes is None else "pixels",
    }
    with FeatureStoreWriter(out, provenance=provenance, resume=resume, dtype=dtype) as w:
        for image_id, parse in tqdm(records, desc=f"import {format}", unit="img", disable=not progress):
            if image_id not in w.done_ids:
                w.add(image_id, **parse())
        has_soft = w._schema is not None and "cls_prob" in w._schema
    if not has_soft:
        warnings.warn(f"{out}: {format} carries no soft object labels (cls_prob); MRC objectives need them", stacklevel=2)
    return Path(out)


__all__ = [
    "FeatureStore", "FeatureStoreWriter", "FeatureStoreError", "Regions", "num_boxes", "import_features",
    "IMPORT_FORMATS", "lxmert_tsv_records", "butd_tsv_records", "uniter_npz_records", "bua_npz_records",
]
