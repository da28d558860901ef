"""Image sources: ``image_id`` -> the image fields of an example (region features from a feature store, pixels
from a folder of files or a shapes world, a memory cache of either), and the one entry point that builds the
source a data config names (`build_image_source`). Bad images follow ``data.on_error`` (see `vlkit.data.pairs`).
"""
from __future__ import annotations

import itertools
import logging
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from vlkit.features.patches import pixel_transform
from vlkit.features.store import FeatureStore
from vlkit.validate import IMAGE_SUFFIXES, DataError, SkipLog, check_on_error, decode_image, image_folder

log = logging.getLogger("vlkit.data")
# what an image source raises for one bad image: a missing id, an unreadable or invalid file or store entry
IMAGE_ERRORS = (DataError, KeyError, OSError, RuntimeError)


# --------------------------------------------------------------------------------------------
# Image sources: image_id -> the image fields of an example
# --------------------------------------------------------------------------------------------
class RegionSource:
    """Regions of a `vlkit.features.store.FeatureStore` (or its path).

    The number of boxes is chosen at load time: ``num_bb`` fixed, else UNITER's
    ``min(max_bb, max(min_bb, #(conf > conf_th)))``. Boxes are normalised by the image w / h; the
    store's ``box_wh`` (the box size as the source format stored it) rides along as ``region_wh``.
    ``global_feature=True`` adds ``region_global``: the mean of all the image's stored regions, before
    the box count is cut (ViLBERT's task loaders compute their [IMG] feature that way).
    """

    def __init__(self, store: Any, num_bb: int | None = None, conf_th: float = 0.2, max_bb: int = 100,
                 min_bb: int = 10, soft_labels: bool = True, global_feature: bool = False):
        if isinstance(store, (str, os.PathLike)):
            store = FeatureStore(store)
        self.store = store
        self.load_kwargs = {"num_bb": num_bb, "conf_th": conf_th, "max_bb": max_bb, "min_bb": min_bb}
        self.soft_labels = soft_labels
        self.global_feature = global_feature
        self._units: dict[str, int] = {}

    def __call__(self, image_id: str) -> dict[str, Tensor]:
        r = self.store.load(image_id, **self.load_kwargs)
        self._units[image_id] = len(r.features)
        scale = torch.tensor([r.image_w, r.image_h, r.image_w, r.image_h], dtype=torch.float32)
        out = {"region_feats": torch.as_tensor(r.features, dtype=torch.float32),
               "region_boxes": torch.as_tensor(r.boxes, dtype=torch.float32) / scale,
               "image_size": torch.tensor([r.image_h, r.image_w], dtype=torch.long)}
        if self.soft_labels and r.cls_prob is not None:
            out["region_soft_labels"] = torch.as_tensor(r.cls_prob, dtype=torch.float32)
        if r.box_wh is not None:
            out["region_wh"] = torch.as_tensor(r.box_wh, dtype=torch.float32)
        if self.global_feature:
            every = self.store.load(image_id, num_bb=sys.maxsize).features
            out["region_global"] = torch.as_tensor(every, dtype=torch.float32).sum(0) / len(every)
        return out

    def units(self, image_id: str) -> int:
        """Number of regions this image contributes (cached)."""
        if image_id not in self._units:
            self._units[image_id] = len(self.store.load(image_id, **self.load_kwargs).features)
        return self._units[image_id]


class FolderImages:
    """``image_id`` -> PIL image of ``root/**/<image_id>.<ext>`` (the folder is indexed once)."""

    def __init__(self, root: str | os.PathLike, extensions: Sequence[str] = IMAGE_SUFFIXES):
        self.root, self.extensions = Path(root), tuple(e.lower() for e in extensions)
        self._index: dict[str, Path] | None = None

    def _build_index(self) -> dict[str, Path]:
        """The folder's images (`vlkit.validate.image_folder`: subfolders included, other files counted and logged)."""
        return image_folder(self.root, self.extensions).images

    def ids(self) -> set[str]:
        """Every image id of the folder."""
        if self._index is None:
            self._index = self._build_index()
        return set(self._index)

    def __call__(self, image_id: str):
        """The image as `vlkit.validate.decode_image` gives it (RGB, upright by its EXIF orientation)."""
        if self._index is None:
            self._index = self._build_index()
        if image_id not in self._index:
            raise KeyError(f"image {image_id!r} is not in {self.root} (extensions {', '.join(self.extensions)})")
        return decode_image(self._index[image_id], image_id)


def _to_tensor(image) -> Tensor:
    from torchvision.transforms.functional import to_tensor

    return to_tensor(image)


class PixelSource:
    """Pixels: ``load(image_id)`` -> PIL image, then ``transform`` (PIL -> float [3, H, W]).

    ``units`` (for batching by input units) is the patch count ``(H // patch_size) *
    (W // patch_size)`` of the first transformed image: pixel pipelines produce one fixed size.
    """

    def __init__(self, load: Callable[[str], Any], transform: Callable[[Any], Tensor] | None = None,
                 patch_size: int = 16):
        self.load, self.transform, self.patch_size = load, transform or _to_tensor, patch_size
        self._units: int | None = None

    def __call__(self, image_id: str) -> dict[str, Tensor]:
        pixels = self.transform(self.load(image_id))
        if not isinstance(pixels, Tensor) or pixels.dim() != 3:
            raise TypeError(f"image {image_id!r}: the transform must return a [3, H, W] tensor, got "
                            f"{getattr(pixels, 'shape', type(pixels))}")
        if self._units is None:
            self._units = (pixels.shape[1] // self.patch_size) * (pixels.shape[2] // self.patch_size)
        return {"pixel_values": pixels}

    def units(self, image_id: str) -> int:
        if self._units is None:
            self(image_id)
        return self._units


def build_transform(size: int | None = None, mean: Sequence[float] | None = None,
                    std: Sequence[float] | None = None) -> Callable[[Any], Tensor]:
    """`vlkit.features.patches.pixel_transform` with explicit normalisation values (None: pixels in [0, 1])."""
    return pixel_transform("none", size, mean=mean, std=std)


class CachedSource:
    """An image source that keeps every image's fields in memory after its first load (``data.image.
    cache=true``): for small data read many times, and deterministic transforms only (no RandAugment)."""

    def __init__(self, source: Any):
        self.source = source
        self._fields: dict[str, dict[str, Tensor]] = {}

    def __call__(self, image_id: str) -> dict[str, Tensor]:
        if image_id not in self._fields:
            self._fields[image_id] = self.source(image_id)
        return dict(self._fields[image_id])

    def __getattr__(self, name: str) -> Any:  # units(), store, patch_size ... of the wrapped source
        if name in ("source", "_fields"):
            raise AttributeError(name)
        return getattr(self.source, name)


def build_image_source(cfg: Mapping[str, Any], world: Any = None, on_error: str = "raise",
                       skips: SkipLog | None = None):
    """An image source from the ``image`` block of a data config (see ``conf/data/*.yaml``); it carries
    the bad-example policy ``on_error`` (``data.on_error``) and the `SkipLog` ``skips`` for the datasets built on it."""
    if cfg.get("cache") and cfg.get("randaug"):
        raise ValueError("data.image.cache=true keeps the first augmented copy of every image: set "
                         "data.image.cache=false to train with data.image.randaug=true")
    source = _image_source(cfg, world)
    source = CachedSource(source) if cfg.get("cache") else source
    source.on_error = check_on_error(on_error)
    source.skips = skips if skips is not None else SkipLog()
    return source


def image_index(source: Any) -> tuple[set[str] | None, str]:
    """(every image id ``source`` can load, or None when it cannot tell; a description for messages):
    a feature store's ids, an image folder's files."""
    inner = getattr(source, "source", source)  # CachedSource
    store = getattr(inner, "store", None)
    if store is not None:
        return set(store.ids()), f"feature store {store.path}"
    load = getattr(inner, "load", None)
    if isinstance(load, FolderImages):
        return load.ids(), f"image folder {load.root}"
    return None, type(inner).__name__


def check_store_folder(path: str | os.PathLike) -> None:
    """A folder given as a feature store must be a sharded store (its ``index.json`` or ``.h5`` shards): a folder of
    image files, or any other folder, is a `DataError` saying what it is and what a region family reads instead."""
    folder = Path(path)
    if not folder.is_dir() or (folder / "index.json").is_file() or any(folder.glob("*.h5")):
        return  # a file, or a sharded store (its own reader checks it)
    try:  # the first image file at most two levels down (a system folder is not walked)
        images = next((p for p in itertools.chain(folder.glob("*"), folder.glob("*/*"))
                       if p.suffix.lower() in IMAGE_SUFFIXES), None)
    except OSError:
        images = None
    what = (f"a folder of images ({images.name} ...), not a feature store" if images is not None else
            "a folder that is not a feature store (no index.json, no .h5 shards)")
    raise DataError(f"data.image.path={path} is {what}: a region family reads region features extracted from images "
                    f"(vlkit extract-features images={path} out=features.h5, then data.image.path=features.h5); a pixel "
                    "family (model=meter) reads an image folder itself with data.image.source=folder")


_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def id_pattern(image_id: str) -> str | None:
    """The ``image_id_format`` an id follows around its last number (``shape_3`` -> ``shape_{}``,
    ``COCO_train2014_000000000009`` -> ``COCO_train2014_{:012d}``); None for an id without a number."""
    match = _LAST_NUMBER.search(image_id)
    if match is None:
        return None
    digits = match.group(1)
    field = f"{{:0{len(digits)}d}}" if len(digits) > 1 and digits.startswith("0") else "{}"
    return image_id[:match.start()] + field + image_id[match.end():]


def id_mismatch(wanted: Sequence[str], held: Collection[str], where: str) -> str:
    """Why the ids ``wanted`` miss a source that holds ``held`` (``where``: its description): the ``image_id_format``
    the wanted ids follow, the one the held ids follow, and how many wanted images the latter would find; "" when
    the ids follow no common numbered pattern."""
    def common(ids: Iterable[str]) -> str | None:
        patterns = Counter(id_pattern(i) for i in ids).most_common(1)
        return patterns[0][0] if patterns else None

    ours, theirs = common(wanted), common(held)
    if ours is None or theirs is None or ours == theirs:
        return ""
    numbers = [int(_LAST_NUMBER.search(i).group(1)) for i in wanted if id_pattern(i) == ours]
    found = sum(theirs.format(n) in held for n in numbers)
    return (f"; the data's ids follow image_id_format {ours!r}, the {where}'s {theirs!r}: image_id_format "
            f"{theirs!r} finds {found} of these {len(wanted)} images")


def _image_source(cfg: Mapping[str, Any], world: Any = None):
    kind = cfg.get("source", "features")
    if kind == "features":
        if not cfg.get("path"):
            raise ValueError("data.image.path must name a feature store (.h5) when data.image.source=features")
        check_store_folder(cfg["path"])
        source = RegionSource(cfg["path"], num_bb=cfg.get("num_bb"), conf_th=cfg.get("conf_th", 0.2),
                              max_bb=cfg.get("max_bb", 100), min_bb=cfg.get("min_bb", 10),
                              global_feature=bool(cfg.get("global_feature", False)))
        if cfg.get("num_bb") is None and "conf" not in source.store.schema:  # said once, not once per image
            raise DataError(f"the feature store {source.store.path} holds no detector confidences "
                            "('conf'; BUTD TSV features without cls_prob carry none), so the adaptive box count "
                            "(data.image.conf_th, min_bb, max_bb) cannot apply: set data.image.num_bb, a fixed number "
                            "of boxes per image (36 for BUTD's 36-box features)")
        return source
    if "mean" in cfg or "std" in cfg:
        raise ValueError("data.image.mean / data.image.std are no longer read: name the normalisation with "
                         "data.image.transform (clip | imagenet | vit | none)")
    transform = pixel_transform(cfg.get("transform") or "none", cfg.get("size"), bool(cfg.get("randaug", False)))
    if kind == "folder":
        if not cfg.get("path"):
            raise ValueError("data.image.path must name an image folder when data.image.source=folder")
        return PixelSource(FolderImages(cfg["path"]), transform, cfg.get("patch_size") or 16)
    if kind == "shapes":
        if world is None:
            raise ValueError("data.image.source=shapes only works with data=shapes")
        return PixelSource(world.load_image, transform, cfg.get("patch_size") or 16)
    if kind == "shards":  # the image bytes come with each streamed row (vlkit.data.stream), not by id
        return PixelSource(_streamed_only, transform, cfg.get("patch_size") or 16)
    raise ValueError(f"unknown data.image.source {kind!r}; use features, folder, shapes or shards")


def _streamed_only(image_id: str):
    raise KeyError(f"image {image_id!r}: with data.image.source=shards images come with the streamed rows of "
                   "data=shards; they cannot be loaded by id")
