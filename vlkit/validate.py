"""Validation of the data vlkit reads and writes: images, regions, batches, and the bad-example policy.

Every check names its culprit (file, image id, example id, key) in the message. The functions come in
pairs: ``*_problems(...)`` returns a list of what is wrong (empty when nothing is), for callers that
collect every problem before stopping (the preflight); ``check_*(...)`` raises `DataError` with them.

- `decode_image`: a file, bytes or PIL image -> an RGB PIL image with the EXIF orientation applied;
  16-bit and float images scaled to 8 bits (not clipped), palette and alpha images composited on a
  white background, CMYK / grayscale converted; empty, truncated and non-image files refused.
- `image_size_problems`: images too small or too elongated for a detector.
- `region_problems`: at least one box, finite values, boxes well-ordered and inside the image.
- `nonfinite_inputs`: which examples of a batch carry NaN / inf inputs.
- `check_no_custom_code`: a tokenizer, config or model folder whose JSON maps a class to Python code of its own
  (``auto_map``) is refused, naming the folder and the file: vlkit never runs such code (``trust_remote_code=False``).
- `SkipLog` and ``ON_ERROR``: ``on_error: raise | skip``; skipped ids are counted, logged and written
  with their reason as JSON lines (``skipped.jsonl``).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

log = logging.getLogger("vlkit.data")

ON_ERROR = ("raise", "skip")
SKIPPED_FILE = "skipped.jsonl"
MIN_IMAGE_SIDE = 10  # px: smaller images carry no detectable region
MAX_ASPECT_RATIO = 20.0  # longer side / shorter side
BOX_TOLERANCE = 1.0  # px a box may reach past the image border (detectors clip to [0, w - 1] or [0, w])
WHITE = (255, 255, 255)


class DataError(ValueError):
    """An input that vlkit refuses; the message names the file, id or key at fault."""


class SkippedExample(DataError):
    """An example (or image) left out under ``on_error=skip``; already recorded in the `SkipLog`."""


def check_on_error(value: str, key: str = "data.on_error") -> str:
    if value not in ON_ERROR:
        raise ValueError(f"{key}={value!r}; choose one of {' | '.join(ON_ERROR)}")
    return value


# --------------------------------------------------------------------------------------------------
# images
# --------------------------------------------------------------------------------------------------
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")  # what decode_image reads


@dataclass
class ImageFolder:
    """The images of a folder and of its subfolders (image id: the file stem) and every other file, by reason."""

    root: Path
    images: dict[str, Path]
    not_read: dict[str, list[Path]]

    def report(self) -> str:
        """``"<n> file(s) of <root> not read: <count> <reason> (<first files>); ..."``, or ``""``."""
        if not self.not_read:
            return ""
        parts = [f"{len(paths)} {reason} ({first([p.relative_to(self.root) for p in paths], limit=3)})"
                 for reason, paths in sorted(self.not_read.items())]
        total = sum(len(p) for p in self.not_read.values())
        return f"{total} file(s) of {self.root} not read: {'; '.join(parts)}"


def image_folder(root: str | os.PathLike, suffixes: Sequence[str] = IMAGE_SUFFIXES) -> ImageFolder:
    """Every file under ``root``, subfolders included: images by their suffix, the rest counted per reason
    (hidden, another suffix) and logged; two images of the same stem are a `DataError` naming both."""
    root = Path(root)
    if not root.is_dir():
        raise (NotADirectoryError if root.exists() else FileNotFoundError)(f"image folder {root} is not a folder")
    suffixes = tuple(s.lower() for s in suffixes)
    images: dict[str, Path] = {}
    not_read: dict[str, list[Path]] = {}
    for path in sorted(p for p in root.rglob("*") if not p.is_dir()):
        suffix = path.suffix.lower()
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            reason = "hidden"
        elif suffix not in suffixes:
            reason = f"with suffix {suffix or '(none)'}, not an image format vlkit reads ({', '.join(suffixes)})"
        elif path.stem in images:
            raise DataError(f"image folder {root}: two images are named {path.stem!r} ({images[path.stem]} and {path}): "
                            "image ids are file names without the suffix")
        else:
            images[path.stem] = path
            continue
        not_read.setdefault(reason, []).append(path)
    folder = ImageFolder(root, images, not_read)
    if not_read:
        log.warning(folder.report())
    return folder


class CustomCodeError(DataError):
    """A folder that maps a class to Python code of its own (``auto_map``): vlkit does not run it."""


def custom_code(folder: str | os.PathLike) -> tuple[str, str, str] | None:
    """``(JSON file, class, Python file)`` of the first ``auto_map`` entry among a folder's JSON files (a config, a
    tokenizer or processor config: what transformers imports from the folder under ``trust_remote_code``); None when
    none maps one."""
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # not ours to judge: the loader names a damaged file
        mapped = data.get("auto_map") if isinstance(data, dict) else None
        for auto_class, refs in (mapped.items() if isinstance(mapped, dict) else ()):
            for ref in refs if isinstance(refs, (list, tuple)) else [refs]:
                if isinstance(ref, str) and "." in ref:
                    repo, _, module = ref.rpartition("--")
                    file = module.rsplit(".", 1)[0].replace(".", "/") + ".py"
                    return path.name, auto_class, file + (f" of the hub repository {repo}" if repo else "")
    return None


def check_no_custom_code(folder: str | os.PathLike, key: str) -> None:
    """Refuse (`CustomCodeError`, naming ``key``, the folder, the JSON file and the Python file) a folder whose
    classes are its own code (`custom_code`), before transformers could ask to run it."""
    found = custom_code(folder)
    if found:
        json_file, auto_class, file = found
        raise CustomCodeError(f"{key}={folder}: {json_file} maps {auto_class} to custom code ({file}, auto_map); vlkit "
                              "never runs code from a tokenizer, config or model folder (trust_remote_code=False): "
                              "use a folder whose classes transformers provides (one written by save_pretrained of "
                              "a standard tokenizer or model), or remove auto_map if those classes are standard")


def _name(image_id: Any, path: Any) -> str:
    if image_id is not None and path is not None:
        return f"image {str(image_id)!r} ({path})"
    return f"image {str(image_id)!r}" if image_id is not None else f"image {path}"


def decode_image(source: Any, image_id: Any = None, background: tuple[int, int, int] = WHITE):
    """``source`` (a path, bytes or a PIL image) -> an RGB PIL image, upright as viewers show it.

    - EXIF orientation is applied (`PIL.ImageOps.exif_transpose`), so boxes and ``image_h`` /
      ``image_w`` are in the frame people see;
    - 16-bit (``I;16*``, ``I``) images are scaled by 255/65535 and float (``F``) images from [0, 1]
      (or clipped to [0, 255] when larger), instead of Pillow's clipping, which turns them white;
    - palette images with transparency and images with alpha are composited on ``background``;
      CMYK, grayscale and bilevel images are converted to RGB;
    - an empty, truncated, corrupt or non-image file raises `DataError` naming the image.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    path = None
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            if path.stat().st_size == 0:
                raise DataError(f"{_name(image_id, path)}: the file is empty (0 bytes)")
        except FileNotFoundError as err:
            raise DataError(f"{_name(image_id, path)}: the file does not exist") from err
    elif isinstance(source, (bytes, bytearray)):
        if not source:
            raise DataError(f"{_name(image_id, None)}: no bytes (empty file)")
        import io

        source = io.BytesIO(source)
    try:
        if hasattr(source, "convert"):  # already a PIL image
            source.load()
            image = ImageOps.exif_transpose(source)
        else:
            with Image.open(source) as opened:
                opened.load()  # decodes now: a truncated file raises here, not later
                image = ImageOps.exif_transpose(opened)  # a copy, upright
    except DataError:
        raise
    except UnidentifiedImageError as err:
        raise DataError(f"{_name(image_id, path)}: not an image file Pillow can read") from err
    except Image.DecompressionBombError as err:
        raise DataError(f"{_name(image_id, path)}: too many pixels ({err})") from err
    except (OSError, SyntaxError, ValueError, TypeError, SystemError) as err:
        raise DataError(f"{_name(image_id, path)}: cannot decode ({type(err).__name__}: {err})") from err
    return _to_rgb(image, background)


def _to_rgb(image, background: tuple[int, int, int]):
    from PIL import Image

    mode = image.mode
    if mode.startswith("I;16") or mode == "I":
        arr = np.asarray(image, dtype=np.float64)
        gray = np.clip(arr, 0, 65535) * (255.0 / 65535.0)
        image = Image.fromarray(np.round(gray).astype(np.uint8), "L")
    elif mode == "F":
        arr = np.asarray(image, dtype=np.float64)
        if not np.isfinite(arr).all():
            raise DataError("a float image holds NaN or inf pixels")
        gray = arr * 255.0 if arr.size and arr.min() >= 0 and arr.max() <= 1 else np.clip(arr, 0, 255)
        image = Image.fromarray(np.round(gray).astype(np.uint8), "L")
    elif mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        image = Image.alpha_composite(canvas, rgba)
    return image if image.mode == "RGB" else image.convert("RGB")


def rgb_array(source: Any, image_id: Any = None) -> np.ndarray:
    """`decode_image` as an HxWx3 uint8 array; an array is checked to be HxWx3 and returned as uint8."""
    if isinstance(source, np.ndarray) or (hasattr(source, "__array__") and not hasattr(source, "convert")):
        arr = np.asarray(source)
        if arr.ndim != 3 or arr.shape[2] != 3:
            raise DataError(f"{_name(image_id, None)}: expected an HxWx3 RGB array, got shape {arr.shape}")
        if arr.dtype != np.uint8:
            if not np.isfinite(arr).all():
                raise DataError(f"{_name(image_id, None)}: the pixel array holds NaN or inf")
            arr = np.clip(arr, 0, 255).astype(np.uint8)
        return arr
    return np.asarray(decode_image(source, image_id))


def image_size_problems(height: int, width: int, min_side: int = MIN_IMAGE_SIDE,
                        max_aspect: float = MAX_ASPECT_RATIO) -> list[str]:
    """Why an image of ``height`` x ``width`` pixels is unusable (empty when it is usable)."""
    out = []
    if min(height, width) < min_side:
        out.append(f"{width}x{height} px (w x h) is smaller than {min_side} px on a side")
    elif max(height, width) / min(height, width) > max_aspect:
        out.append(f"{width}x{height} px (w x h) has an aspect ratio of {max(height, width) / min(height, width):.0f}:1, "
                   f"more than {max_aspect:.0f}:1")
    return out


def check_image_size(image_id: Any, height: int, width: int, min_side: int = MIN_IMAGE_SIDE,
                     max_aspect: float = MAX_ASPECT_RATIO, where: str | None = None) -> None:
    problems = image_size_problems(height, width, min_side, max_aspect)
    if problems:
        prefix = f"{where}: " if where else ""
        raise DataError(f"{prefix}image {str(image_id)!r}: {'; '.join(problems)}")


# --------------------------------------------------------------------------------------------------
# regions
# --------------------------------------------------------------------------------------------------
def _first_bad_rows(mask: np.ndarray, limit: int = 3) -> str:
    rows = np.nonzero(mask)[0][:limit].tolist()
    return ", ".join(map(str, rows))


def region_problems(features: Any, boxes: Any, image_h: Any = None, image_w: Any = None, normalized: bool = False,
                    tolerance: float | None = None, **extra: Any) -> list[str]:
    """What is wrong with one image's regions (empty when nothing is).

    ``features`` [N, D] and ``boxes`` [N, 4] (xyxy) must have N >= 1 rows and D >= 1 columns and hold
    finite values; every box has x1 <= x2 and y1 <= y2 and lies inside the image (``image_w`` x
    ``image_h`` pixels, or the unit square when ``normalized``) up to ``tolerance`` (1 px, or 1e-3
    normalised). Other float fields in ``extra`` (``cls_prob``, ``conf`` ...) must be finite.
    """
    out: list[str] = []
    feats = np.asarray(features)
    bxs = np.asarray(boxes, dtype=np.float64)
    if feats.ndim != 2:
        return [f"features have shape {feats.shape}, expected [boxes, feature_dim]"]
    if bxs.ndim != 2 or bxs.shape[1] != 4:
        return [f"boxes have shape {bxs.shape}, expected [boxes, 4]"]
    if feats.shape[0] == 0 or bxs.shape[0] == 0:
        return ["no boxes (every image needs at least one region)"]
    if feats.shape[1] == 0:
        return ["features have 0 dimensions"]
    if feats.shape[0] != bxs.shape[0]:
        out.append(f"{feats.shape[0]} feature rows but {bxs.shape[0]} boxes")
    if feats.dtype.kind == "f":
        bad = ~np.isfinite(feats).all(axis=1)
        if bad.any():
            out.append(f"features hold NaN or inf (rows {_first_bad_rows(bad)})")
    for name, value in extra.items():
        if value is None:
            continue
        arr = np.asarray(value)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            out.append(f"{name} holds NaN or inf")
    return out + box_problems(bxs, image_h, image_w, normalized, tolerance)


def box_problems(boxes: Any, image_h: Any = None, image_w: Any = None, normalized: bool = False,
                 tolerance: float | None = None) -> list[str]:
    """What is wrong with boxes [N, 4] (xyxy) of one image: NaN / inf, x2 < x1 or y2 < y1, outside the
    ``image_w`` x ``image_h`` px image (or the unit square when ``normalized``) by more than ``tolerance``."""
    out: list[str] = []
    bxs = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    finite = np.isfinite(bxs).all(axis=1)
    if not finite.all():
        out.append(f"boxes hold NaN or inf (rows {_first_bad_rows(~finite)})")
    b = np.where(finite[:, None], bxs, 0.0)
    inverted = (b[:, 2] < b[:, 0]) | (b[:, 3] < b[:, 1])
    if inverted.any():
        k = int(np.nonzero(inverted)[0][0])
        out.append(f"box {k} {_fmt_box(bxs[k])} is not ordered x1 <= x2, y1 <= y2 (rows {_first_bad_rows(inverted)})")
    if normalized:
        h = w = 1.0
        tol = 1e-3 if tolerance is None else tolerance
    else:
        if image_h is None or image_w is None:
            return out
        h, w = float(image_h), float(image_w)
        if not (h > 0 and w > 0):
            return out + [f"image size h={image_h}, w={image_w} is not positive"]
        tol = BOX_TOLERANCE if tolerance is None else tolerance
    outside = (b[:, 0] < -tol) | (b[:, 1] < -tol) | (b[:, 2] > w + tol) | (b[:, 3] > h + tol)
    if outside.any():
        k = int(np.nonzero(outside)[0][0])
        frame = "the unit square (normalised boxes)" if normalized else f"the {w:g}x{h:g} px image (w x h)"
        out.append(f"box {k} {_fmt_box(bxs[k])} lies outside {frame} (rows {_first_bad_rows(outside)})")
    return out


def _fmt_box(box: np.ndarray) -> str:
    return "[" + ", ".join(f"{v:g}" for v in box.tolist()) + "]"


def check_regions(image_id: Any, features: Any, boxes: Any, image_h: Any = None, image_w: Any = None,
                  where: str | None = None, normalized: bool = False, **extra: Any) -> None:
    """Raise `DataError` naming ``where`` (a file) and ``image_id`` when `region_problems` finds any."""
    problems = region_problems(features, boxes, image_h, image_w, normalized=normalized, **extra)
    if problems:
        prefix = f"{where}: " if where else ""
        raise DataError(f"{prefix}image {str(image_id)!r}: {'; '.join(problems)}")


# --------------------------------------------------------------------------------------------------
# batches
# --------------------------------------------------------------------------------------------------
BATCH_INPUTS = ("region_feats", "region_boxes", "region_soft_labels", "pixel_values")


def nonfinite_inputs(batch: Any) -> list[dict[str, Any]]:
    """``[{field, example, image}]`` for every example of ``batch`` (a `VLBatch`) whose image inputs
    hold NaN or inf (padded regions ignored)."""
    import torch

    found = []
    ids = list(getattr(batch, "ids", None) or [])
    image_ids = list(getattr(batch, "image_ids", None) or [])
    mask = getattr(batch, "region_mask", None)
    for name in BATCH_INPUTS:
        value = getattr(batch, name, None)
        if value is None or not torch.is_floating_point(value):
            continue
        bad = ~torch.isfinite(value)
        if name.startswith("region") and mask is not None and value.dim() >= 2:
            bad = bad & mask.bool().reshape(*mask.shape, *([1] * (value.dim() - 2)))
        rows = bad.reshape(len(value), -1).any(dim=1).nonzero().flatten().tolist()
        for r in rows:
            found.append({"field": name, "example": ids[r] if r < len(ids) else r,
                          "image": image_ids[r] if r < len(image_ids) else None})
    return found


def nonfinite_parameters(module: Any) -> list[str]:
    """The names of ``module``'s parameters and buffers that hold NaN or inf."""
    import torch

    tensors = [*module.named_parameters(), *module.named_buffers()]
    return [n for n, t in tensors if t.is_floating_point() and not torch.isfinite(t).all()]


def describe_inputs(found: Sequence[Mapping[str, Any]], limit: int = 5) -> str:
    parts = [f"{f['field']} of example {f['example']!r}" + (f" (image {f['image']!r})" if f.get("image") else "")
             for f in found[:limit]]
    more = f" and {len(found) - limit} more" if len(found) > limit else ""
    return ", ".join(parts) + more


# --------------------------------------------------------------------------------------------------
# the bad-example policy
# --------------------------------------------------------------------------------------------------
class SkipLog:
    """What ``on_error=skip`` left out: each id once, with its reason, counted, logged as a warning and
    appended to a JSON-lines file (``bind(path)``; records made before are written on binding).
    Lines are flushed one by one, so a killed run keeps them; binding to a file that already has
    records (a resumed run) counts those and does not repeat them."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path: Path | None = None
        self.records: list[dict[str, Any]] = []
        self._seen: set[tuple[str, str]] = set()
        self._pending: list[dict[str, Any]] = []
        if path is not None:
            self.bind(path)

    def __len__(self) -> int:
        return len(self.records)

    @property
    def ids(self) -> list[str]:
        return [r["id"] for r in self.records]

    def bind(self, path: str | os.PathLike) -> None:
        path = Path(path)
        if self.path == path:
            return
        self.path = path
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                    self._seen.add((str(rec["kind"]), str(rec["id"])))
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut by a kill
        pending, self._pending = self._pending, []
        for rec in pending:
            self._write(rec)

    def add(self, kind: str, item_id: Any, reason: str, **extra: Any) -> bool:
        """Record that ``item_id`` (an ``example`` or ``image``) was skipped; False if it already was."""
        key = (kind, str(item_id))
        if key in self._seen:
            return False
        self._seen.add(key)
        rec = {"kind": kind, "id": str(item_id), "reason": reason, **extra}
        self.records.append(rec)
        log.warning("skipped %s %r (%d so far): %s", kind, str(item_id), len(self.records), reason)
        if self.path is None:
            self._pending.append(rec)
        else:
            self._write(rec)
        return True

    def _write(self, rec: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
            f.flush()

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for rec in self.records:
            counts[rec["kind"]] = counts.get(rec["kind"], 0) + 1
        return counts


def sample_evenly(items: Sequence[Any], k: int) -> list[Any]:
    """``k`` items spread evenly over ``items`` (all of them when there are at most ``k``)."""
    n = len(items)
    if k <= 0:
        return []
    if n <= k:
        return list(items)
    return [items[(i * n) // k] for i in range(k)]


def check_unique_ids(ids: Iterable[Any], what: str = "example", where: str = "") -> None:
    """`DataError` naming every id that appears more than once (and how often): an id names one item, so a
    duplicate would be dropped, skipped or scored in place of another."""
    from collections import Counter

    counts = Counter(map(str, ids))
    repeated = [(i, n) for i, n in counts.items() if n > 1]
    if repeated:
        shown = ", ".join(f"{i!r} ({n} times)" for i, n in repeated[:5])
        more = f" and {len(repeated) - 5} more" if len(repeated) > 5 else ""
        raise DataError(f"{where + ': ' if where else ''}{len(repeated)} {what} id(s) appear more than once: "
                        f"{shown}{more}; every {what} needs its own id")


def first(items: Iterable[Any], limit: int = 5) -> str:
    items = list(items)
    shown = ", ".join(repr(str(i)) for i in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


__all__ = ["DataError", "SkippedExample", "ON_ERROR", "SKIPPED_FILE", "check_on_error", "IMAGE_SUFFIXES", "ImageFolder",
           "image_folder", "decode_image", "rgb_array",
           "image_size_problems", "check_image_size", "region_problems", "box_problems", "check_regions",
           "nonfinite_inputs", "nonfinite_parameters", "describe_inputs", "SkipLog", "sample_evenly", "first",
           "check_unique_ids"]
