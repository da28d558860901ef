"""Importers of the region-feature formats users already hold, into a vlkit feature store: LXMERT /
py-bottom-up-attention TSV, BUTD TSV (and ViLBERT's CC variant), UNITER npz directories and
bottom-up-attention.pytorch npz files."""
from __future__ import annotations

import base64
import csv
import io
import json
import os
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from vlkit.features.store import FeatureStoreWriter, skipped_path
from vlkit.io import safe_pickle_load
from vlkit.validate import DataError, SkipLog, check_on_error

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

            parse.where = where
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

            parse.where = where
            yield row[0], parse


def _image_sizes(image_sizes: Mapping[str, Any] | str | os.PathLike | None) -> Mapping[str, Any] | None:
    if image_sizes is None or isinstance(image_sizes, Mapping):
        return image_sizes
    return json.loads(Path(image_sizes).read_text())


def uniter_npz_records(src: str | os.PathLike, image_sizes: Mapping[str, Any] | str | os.PathLike | None = None) -> Iterator[Record]:
    """UNITER npz directory (float16 ``norm_bb`` [N, 6], ``features``, ``conf`` [N] or [N, 1], ``soft_labels``);
    the id is the file stem. ``norm_bb`` is normalised: with ``image_sizes`` (``{id: [h, w]}`` or a JSON file)
    boxes become pixels; without, they stay normalised and image_h = image_w = 1. The stored box width and
    height (``norm_bb[:, 4:6]``) go to the store's ``box_wh``."""
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
            # conf is [N, 1] in the npz save_to_npz writes; w/H, h/H (columns 4:6) are kept as stored (UNITER's
            # 7-d position multiplies these fp16 values, data.py L248-252)
            return {"features": feats, "boxes": boxes, "image_h": h, "image_w": w, "conf": conf.reshape(len(conf)),
                    "cls_prob": soft, "box_wh": norm_bb[:, 4:6].astype(np.float32)}

        parse.where = str(path)
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
        return safe_pickle_load(f.read(), source=f"{path} ({name}.npy)")
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

        parse.where = str(path)
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
    on_error: str = "raise",
) -> Path:
    """Import ``src`` (file or directory) in ``format`` (one of ``IMPORT_FORMATS``) into the store ``out``.

    Every record is validated as the store validates (at least one box, finite values, boxes inside the
    image and well-ordered); a bad record raises naming its file, line and image id, or with
    ``on_error="skip"`` is left out and recorded with its reason in ``<out>.skipped.jsonl``.
    """
    from tqdm.auto import tqdm

    check_on_error(on_error, "on_error")
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
    skips = SkipLog(skipped_path(out)) if on_error == "skip" else None
    with FeatureStoreWriter(out, provenance=provenance, resume=resume, dtype=dtype) as w:
        resumed, seen = set(w.done_ids), {}  # stored by an earlier run; image id -> where this import read it
        for image_id, parse in tqdm(records, desc=f"import {format}", unit="img", disable=not progress):
            where = getattr(parse, "where", None)
            if image_id in resumed:
                continue
            try:
                if image_id in seen:  # the same image twice in the source: refused (skip: the second recorded)
                    raise DataError(f"image {image_id!r} appears again (first at {seen[image_id] or 'an earlier record'}); "
                                    "an import holds each image once")
                seen[image_id] = where
                w.add(image_id, **parse())
            except (DataError, ValueError, KeyError) as err:
                message = str(err).strip("'\"") if isinstance(err, KeyError) else str(err)
                if where and where not in message:
                    message = f"{where}: {message}"
                if skips is None:
                    raise (type(err)(message) if isinstance(err, DataError) else err) from err
                skips.add("image", image_id, message)
        has_soft = w._schema is not None and "cls_prob" in w._schema
    if not has_soft:
        warnings.warn(f"{out}: {format} carries no soft object labels (cls_prob); MRC objectives need them", stacklevel=2)
    return Path(out)




__all__ = ["import_features", "IMPORT_FORMATS", "lxmert_tsv_records", "butd_tsv_records", "uniter_npz_records",
           "bua_npz_records"]
