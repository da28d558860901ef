"""The shapes world's scenes: scene generation from ``(seed, index)`` over the object vocabulary
(`vlkit.shapes_vocabulary`: kinds, colours, sizes) and the renderer."""
from __future__ import annotations

import io
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image, ImageDraw

from vlkit.shapes_vocabulary import ATTRIBUTES, COLORS, KINDS, OBJECT_CLASSES, PALETTE, SIZES

SPLITS: tuple[str, ...] = ("train", "val", "test")
# Side of a shape's square box in pixels at 128 px images, per size class (inclusive ranges).
_EXTENTS = {"small": (14, 20), "medium": (24, 32), "large": (38, 48)}
_BASE_SIZE = 128
_MIN_VISIBLE = 0.6  # fraction of its own pixels every object keeps after later objects are drawn
_PLACEMENT_TRIES = 60
_MARGIN = 8  # px at 128: centre distance that makes a spatial relation unambiguous
_STREAMS = {"scene": 1, "captions": 2, "vqa": 3, "refexp": 4, "nlvr2": 5, "snli_ve": 6, "nlvr2_pair": 7}


def _scale(image_size: int, px: float) -> float:
    return px * image_size / _BASE_SIZE


@dataclass(frozen=True)
class ShapeObject:
    """One shape: ``box`` is its tight pixel box (x1, y1, x2, y2), ``class_id`` indexes
    `OBJECT_CLASSES` and ``attribute_ids`` (colour, size) index `ATTRIBUTES`."""

    kind: str
    color: str
    size: str
    box: tuple[float, float, float, float]
    class_id: int
    attribute_ids: tuple[int, ...]

    @property
    def center(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2

    @property
    def extent(self) -> float:
        return self.box[2] - self.box[0]

    def matches(self, kind: str | None = None, color: str | None = None, size: str | None = None) -> bool:
        return (kind is None or self.kind == kind) and (color is None or self.color == color) \
            and (size is None or self.size == size)


def _make_object(kind: str, color: str, size: str, box: tuple[float, float, float, float]) -> ShapeObject:
    return ShapeObject(kind, color, size, box, OBJECT_CLASSES.index(kind),
                       (ATTRIBUTES.index(color), ATTRIBUTES.index(size)))


def _draw_shape(draw: ImageDraw.ImageDraw, kind: str, box: Sequence[float], fill: Any) -> None:
    """Draw ``kind`` filling the pixel box [x0, x1) x [y0, y1) exactly (it touches all four sides)."""
    x0, y0, x1, y1 = (int(v) for v in box)
    xr, yb = x1 - 1, y1 - 1  # last pixel column / row (PIL coordinates are inclusive)
    cx, cy = (x0 + xr) / 2, (y0 + yb) / 2
    if kind == "circle":
        draw.ellipse([x0, y0, xr, yb], fill=fill)
    elif kind == "square":
        draw.rectangle([x0, y0, xr, yb], fill=fill)
    elif kind == "triangle":
        draw.polygon([(x0, yb), (xr, yb), (cx, y0)], fill=fill)
    elif kind == "diamond":
        draw.polygon([(cx, y0), (xr, cy), (cx, yb), (x0, cy)], fill=fill)
    elif kind == "cross":
        t = max(2, (x1 - x0) // 3)
        a, b = x0 + ((x1 - x0) - t) // 2, y0 + ((y1 - y0) - t) // 2
        draw.rectangle([x0, b, xr, b + t - 1], fill=fill)
        draw.rectangle([a, y0, a + t - 1, yb], fill=fill)
    else:
        raise ValueError(f"unknown shape kind {kind!r}; known kinds: {', '.join(KINDS)}")


def shape_mask(kind: str, box: Sequence[float], width: int, height: int) -> np.ndarray:
    """Boolean [height, width] mask of the pixels ``kind`` covers in ``box``."""
    canvas = Image.new("1", (width, height), 0)
    _draw_shape(ImageDraw.Draw(canvas), kind, box, 1)
    return np.asarray(canvas, dtype=bool)


@dataclass(frozen=True)
class Scene:
    """A rendered-on-demand scene; objects are drawn in order (later ones may occlude earlier ones)."""

    image_id: str
    width: int
    height: int
    objects: tuple[ShapeObject, ...]
    background: int = 32

    def render(self) -> Image.Image:
        img = Image.new("RGB", (self.width, self.height), (self.background,) * 3)
        draw = ImageDraw.Draw(img)
        for obj in self.objects:
            _draw_shape(draw, obj.kind, obj.box, PALETTE[obj.color])
        return img

    def count(self, kind: str | None = None, color: str | None = None, size: str | None = None) -> int:
        return sum(o.matches(kind, color, size) for o in self.objects)


def _lru(cache: OrderedDict, key: int, make: Callable[[int], Any], maxsize: int) -> Any:
    """``cache[key]``, made by ``make(key)`` on a miss; the least recently used entry goes first."""
    if key in cache:
        cache.move_to_end(key)
    else:
        cache[key] = make(key)
        if len(cache) > maxsize:
            cache.popitem(last=False)
    return cache[key]


class ShapeScenes:
    """Deterministic scenes and their renders: everything depends only on ``(seed, index)``."""

    def __init__(self, seed: int = 0, num_images: int = 2000, image_size: int = 128, val_images: int | None = None,
                 test_images: int | None = None, eval_rounds: int = 1, train_rounds: int = 1):
        if seed < 0:
            raise ValueError(f"ShapesWorld: seed must be >= 0, got {seed}")
        if num_images < 1:
            raise ValueError(f"ShapesWorld: num_images must be >= 1, got {num_images}")
        if image_size < 64:
            raise ValueError(f"ShapesWorld: image_size must be >= 64 px, got {image_size}")
        if min(val_images or 0, test_images or 0) < 0:
            raise ValueError(f"ShapesWorld: val_images / test_images must be >= 0, got {val_images} / {test_images}")
        for name, rounds in (("eval_rounds", eval_rounds), ("train_rounds", train_rounds)):
            if rounds < 1:
                raise ValueError(f"ShapesWorld: {name} must be >= 1, got {rounds}")
        self.seed, self.image_size = int(seed), int(image_size)
        self.eval_rounds, self.train_rounds = int(eval_rounds), int(train_rounds)
        self.sized_splits = val_images is not None or test_images is not None
        if self.sized_splits:  # num_images training images, the evaluation images after them
            self.split_sizes = (int(num_images), int(val_images or 0), int(test_images or 0))
        else:  # Karpathy-style: the last 10% test, the 10% before them val
            tenth = int(num_images) // 10
            self.split_sizes = (int(num_images) - 2 * tenth, tenth, tenth)
        self.num_images = sum(self.split_sizes)
        self.margin = _scale(image_size, _MARGIN)
        self._scenes: OrderedDict[int, Scene] = OrderedDict()
        self._images: OrderedDict[int, Image.Image] = OrderedDict()

    @staticmethod
    def cfg_args(cfg: Any) -> tuple:
        """The constructor's arguments from a data config (``conf/data/shapes.yaml``: seed, num_images,
        image_size, val_images, test_images, eval_rounds, train_rounds)."""
        return (cfg.get("seed", 0), cfg.get("num_images", 2000), cfg.get("image_size", 128), cfg.get("val_images"),
                cfg.get("test_images"), cfg.get("eval_rounds") or 1, cfg.get("train_rounds") or 1)

    @classmethod
    def from_cfg(cls, cfg: Any) -> "ShapeScenes":
        """From a data config (`cfg_args`)."""
        return cls(*cls.cfg_args(cfg))

    def __len__(self) -> int:
        return self.num_images

    def __repr__(self) -> str:
        sizes = (f", val_images={self.split_sizes[1]}, test_images={self.split_sizes[2]}" if self.sized_splits else "")
        n = self.split_sizes[0] if self.sized_splits else self.num_images
        rounds = "".join(f", {name}={count}" for name, count in (("eval_rounds", self.eval_rounds),
                                                                  ("train_rounds", self.train_rounds)) if count != 1)
        return f"{type(self).__name__}(seed={self.seed}, num_images={n}, image_size={self.image_size}{sizes}{rounds})"

    def _rng(self, stream: str, i: int) -> np.random.Generator:
        return np.random.default_rng((self.seed, _STREAMS[stream], i))

    def _check(self, i: int) -> int:
        i = int(i)
        if not 0 <= i < self.num_images:
            raise IndexError(f"{self!r}: image index {i} out of range [0, {self.num_images})")
        return i

    # ---- ids and splits ---------------------------------------------------------------------
    def image_id(self, i: int) -> str:
        return str(self._check(i))

    def index_of(self, image_id: str) -> int:
        """Inverse of `image_id`."""
        if not str(image_id).isdigit():
            raise KeyError(f"{self!r}: {image_id!r} is not a shapes image id")
        return self._check(int(image_id))

    def split(self, i: int) -> str:
        """The split of image ``i``: train, then val, then test (in index order)."""
        i = self._check(i)
        return next(s for s in SPLITS if i in self.indices(s))

    def rounds(self, i: int) -> int:
        """How many rounds of annotations image ``i`` gets: ``train_rounds`` on train, ``eval_rounds`` on the
        evaluation splits (val, test). More labelled questions per image cost no images: on held-out images
        they lower an evaluation's variance, on training images they give fine-tuning more examples."""
        return self.train_rounds if self.split(i) == "train" else self.eval_rounds

    def indices(self, split: str) -> range:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; shapes splits: {', '.join(SPLITS)}")
        k = SPLITS.index(split)
        start = sum(self.split_sizes[:k])
        return range(start, start + self.split_sizes[k])

    # ---- scenes and images ------------------------------------------------------------------
    def scene(self, i: int) -> Scene:
        return _lru(self._scenes, self._check(i), self._make_scene, maxsize=65536)

    def _make_scene(self, i: int) -> Scene:
        rng = self._rng("scene", i)
        w = h = self.image_size
        n = int(rng.integers(1, 6))
        background = int(rng.integers(20, 61))
        owner = np.zeros((h, w), dtype=np.int16)  # which object (1-based) shows at each pixel
        areas: list[int] = []
        objects: list[ShapeObject] = []
        for _ in range(n):
            for _ in range(_PLACEMENT_TRIES):
                kind, color, size = KINDS[rng.integers(len(KINDS))], COLORS[rng.integers(len(COLORS))], \
                    SIZES[rng.integers(len(SIZES))]
                lo, hi = _EXTENTS[size]
                s = int(round(_scale(w, rng.integers(lo, hi + 1))))
                x0, y0 = int(rng.integers(1, w - s)), int(rng.integers(1, h - s))
                box = (float(x0), float(y0), float(x0 + s), float(y0 + s))
                mask = shape_mask(kind, box, w, h)
                trial = owner.copy()
                trial[mask] = len(objects) + 1
                visible = np.bincount(trial.ravel(), minlength=len(objects) + 2)[1:len(objects) + 1]
                if all(v >= _MIN_VISIBLE * a for v, a in zip(visible, areas)):
                    owner, areas = trial, areas + [int(mask.sum())]
                    objects.append(_make_object(kind, color, size, box))
                    break
        return Scene(str(i), w, h, tuple(objects), background)

    def image(self, i: int) -> Image.Image:
        """The rendered scene (RGB); recent renders are cached, a copy is returned."""
        return _lru(self._images, self._check(i), lambda k: self.scene(k).render(), maxsize=512).copy()

    def load_image(self, image_id: str) -> Image.Image:
        """`image` by image id (an image source for `vlkit.data.pairs.PixelSource`)."""
        return self.image(self.index_of(image_id))

    def png_bytes(self, i: int) -> bytes:
        buf = io.BytesIO()
        self.image(i).save(buf, format="PNG", optimize=False)
        return buf.getvalue()
