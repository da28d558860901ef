"""Image-text pair datasets over Hugging Face `datasets`, image sources and the `VLCollator`.

An example is a dict: ``id``, ``image_id``, ``input_ids`` [T] and the image side from an image
source (``region_feats`` [K, D], ``region_boxes`` [K, 4] normalised xyxy, optional
``region_soft_labels`` [K, C], ``image_size`` [2] (h, w), optional ``region_wh`` [K, 2] and ``region_global``
[D]; or ``pixel_values`` [3, H, W]); task
datasets add a ``targets`` dict. `VLCollator` turns a list of them into a `VLBatch`.

Bad examples follow ``data.on_error`` (carried by the image source, see `build_image_source`):
``raise`` stops at the first one with an error naming it; ``skip`` leaves it out (``dataset[i]`` is
None and the collators drop it), counted, logged and recorded with its reason in the run's
``skipped.jsonl`` (`vlkit.validate.SkipLog`).
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from vlkit.data import formats
from vlkit.data.tokenizers import build_tokenizer
from vlkit.registry import register_dataset
from vlkit.types import VLBatch
from vlkit.validate import (IMAGE_SUFFIXES, DataError, SkipLog, check_on_error, check_unique_ids, decode_image,
                            image_folder)

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
            from vlkit.features.store import FeatureStore

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
    from vlkit.features.patches import pixel_transform

    return pixel_transform("none", size, mean=mean, std=std)


# --------------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------------
class ImageTextPairs(torch.utils.data.Dataset):
    """Captions tokenised as ``[CLS] caption [SEP]`` (any HF tokenizer) paired with an image source.

    ``max_len`` counts the special tokens. Over-long captions are truncated by default (counted in
    ``truncated`` and logged); with ``filter_long=True`` they are dropped instead, as UNITER does (its
    ``max_txt_len`` excludes [CLS]/[SEP], so UNITER's 60 is ``max_len=62`` here). Task datasets read
    their text from ``text_key`` (a question, a statement, a hypothesis) and give ``targets(record) ->
    dict`` per example, which `VLCollator` merges into ``VLBatch.targets``.

    ``on_error`` (default: the image source's, else ``raise``): an empty or whitespace-only text raises
    `DataError` listing every such example, and so does an image that fails to load, naming it; with
    ``skip`` those examples are left out and recorded in ``skips`` (a `vlkit.validate.SkipLog`).
    """

    def __init__(self, records: Any, tokenizer: Any, image_source: Any, max_len: int = 62,
                 filter_long: bool = False, text_key: str = "caption",
                 targets: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 on_error: str | None = None, skips: SkipLog | None = None):
        import datasets

        data = records if isinstance(records, datasets.Dataset) else datasets.Dataset.from_list(list(records))
        if len(data) == 0:
            raise ValueError("ImageTextPairs: no records (is the split empty?)")
        missing = {"id", "image_id", text_key} - set(data.column_names)
        if missing:
            raise KeyError(f"ImageTextPairs: records lack {', '.join(sorted(missing))} (have {data.column_names})")
        if max_len < 3:
            raise ValueError(f"ImageTextPairs: max_len={max_len} leaves no room for a caption")
        check_unique_ids(data["id"], "example")  # the skip policy and the preflight name examples by id
        self.on_error = check_on_error(on_error or getattr(image_source, "on_error", None) or "raise")
        if skips is None:
            skips = getattr(image_source, "skips", None)
        self.skips = skips if skips is not None else SkipLog()
        texts = list(data[text_key])
        empty = [k for k, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
        if empty:
            all_ids = [str(x) for x in data["id"]]
            names = [all_ids[k] for k in empty]
            if self.on_error == "raise":
                from vlkit.validate import first

                raise DataError(f"{len(empty)} example(s) have an empty or whitespace-only {text_key}: "
                                f"{first(names)} (data.on_error=skip leaves them out)")
            for name in names:
                self.skips.add("example", name, f"empty {text_key}")
            keep = sorted(set(range(len(texts))) - set(empty))
            if not keep:
                raise DataError(f"ImageTextPairs: every {text_key} is empty")
            data, texts = data.select(keep), [texts[k] for k in keep]
        ids = tokenizer(texts, truncation=False)["input_ids"]
        long = [k for k, x in enumerate(ids) if len(x) > max_len]
        self.truncated: list[tuple[str, int]] = []  # (example id, tokens before truncation)
        if filter_long:
            keep = [k for k, x in enumerate(ids) if len(x) <= max_len]
            data, ids = data.select(keep), [ids[k] for k in keep]
        elif long:
            cut = tokenizer([texts[k] for k in long], truncation=True, max_length=max_len)["input_ids"]
            all_ids = [str(x) for x in data["id"]]
            self.truncated = [(all_ids[k], len(ids[k])) for k in long]
            for k, x in zip(long, cut):
                ids[k] = x
            worst = max(self.truncated, key=lambda t: t[1])
            log.warning("%d of %d %ss are longer than max_len=%d tokens and were truncated (longest: example %r, "
                        "%d tokens); filter_long=true drops them instead", len(long), len(texts), text_key, max_len,
                        worst[0], worst[1])
        if len(data) == 0:
            raise ValueError(f"ImageTextPairs: every caption is longer than max_len={max_len}")
        self._set_data(data.add_column("input_ids", ids), targets is not None)
        self.tokenizer, self.image_source, self.targets = tokenizer, image_source, targets
        self.max_len, self.filter_long, self.text_key = max_len, filter_long, text_key

    def _set_data(self, data: Any, keep_records: bool) -> None:
        self.data = data
        self._rows = [(str(r), str(m)) for r, m in zip(data["id"], data["image_id"])]  # fast row access
        self._ids = [torch.tensor(x, dtype=torch.long) for x in data["input_ids"]]
        self._records = data.to_list() if keep_records else None

    def __len__(self) -> int:
        return len(self.data)

    def image_ids(self) -> list[str]:
        return [m for _, m in self._rows]

    def example_ids(self) -> list[str]:
        return [r for r, _ in self._rows]

    def drop(self, example_ids: Iterable[str]) -> int:
        """Leave the examples ``example_ids`` out (the preflight's ``skip``); returns how many were dropped."""
        gone = set(map(str, example_ids))
        keep = [k for k, (r, _) in enumerate(self._rows) if r not in gone]
        dropped = len(self._rows) - len(keep)
        if not dropped:
            return 0
        if not keep:
            raise DataError(f"every example of this dataset was skipped (see {self.skips.path or 'the log'})")
        self._set_data(self.data.select(keep), self._records is not None)
        return dropped

    def load_image(self, example_id: str, image_id: str) -> dict[str, Any] | None:
        """The image fields of ``image_id`` for example ``example_id``; None when ``on_error=skip`` left it out."""
        try:
            return self.image_source(image_id)
        except IMAGE_ERRORS as err:
            if self.on_error == "raise":
                raise
            reason = str(err).strip("'\"") if isinstance(err, KeyError) else str(err)
            self.skips.add("example", example_id, reason, image_id=image_id)
            return None

    def __getitem__(self, i: int) -> dict[str, Any] | None:
        i = int(i)
        example_id, image_id = self._rows[i]
        fields = self.load_image(example_id, image_id)
        if fields is None:
            return None
        example = {"id": example_id, "image_id": image_id, "input_ids": self._ids[i], **fields}
        if self.targets is not None:
            example["targets"] = self.targets(self._records[i])
        return example

    def lengths(self) -> list[tuple[int, int]]:
        """(text tokens, image units) per example, for `vlkit.data.batching` (0 units for an image
        ``on_error=skip`` leaves out)."""
        out = []
        for ids, (example_id, image_id) in zip(self._ids, self._rows):
            try:
                units = self.image_source.units(image_id)
            except IMAGE_ERRORS as err:
                if self.on_error == "raise":
                    raise
                self.skips.add("example", example_id, str(err), image_id=image_id)
                units = 0
            out.append((len(ids), units))
        return out

    def collator(self, **kwargs: Any) -> "VLCollator":
        return VLCollator(pad_token_id=self.tokenizer.pad_token_id or 0, **kwargs)


# --------------------------------------------------------------------------------------------
# Collation
# --------------------------------------------------------------------------------------------
def pad_stack(tensors: Sequence[Tensor], value: float = 0) -> Tensor:
    """Stack tensors of equal rank, padding every dimension up to the largest with ``value``."""
    shape = [max(t.shape[d] for t in tensors) for d in range(tensors[0].dim())]
    out = tensors[0].new_full((len(tensors), *shape), value)
    for k, t in enumerate(tensors):
        out[(k, *(slice(0, n) for n in t.shape))] = t
    return out


def _lengths_mask(lengths: Sequence[int]) -> Tensor:
    return torch.arange(max(lengths, default=0))[None, :] < torch.tensor(lengths)[:, None]


class VLCollator:
    """List of examples -> `VLBatch`: pads text (``pad_token_id``) and regions (zeros, mask 0),
    stacks pixels, ``image_size``. ``targets`` dicts are merged key by key: tensors are stacked
    (padded with ``target_pad_values[key]``, default 0, when their shapes differ), numbers become
    a tensor, anything else is kept as a list."""

    def __init__(self, pad_token_id: int = 0, target_pad_values: Mapping[str, float] | None = None):
        self.pad_token_id = pad_token_id
        self.target_pad_values = dict(target_pad_values or {})

    def __call__(self, examples: Sequence[Mapping[str, Any] | None]) -> VLBatch:
        if not examples:
            raise ValueError("VLCollator: empty list of examples")
        kept = [e for e in examples if e is not None]  # None: an example data.on_error=skip left out
        if not kept:
            raise DataError(f"VLCollator: all {len(examples)} examples of a batch were skipped (data.on_error=skip); "
                            "the data is mostly bad: see the run's skipped.jsonl")
        examples = kept
        ids = [str(e.get("id", k)) for k, e in enumerate(examples)]
        self._check_same_fields(examples, ids)
        text = [torch.as_tensor(e["input_ids"], dtype=torch.long) for e in examples]
        fields: dict[str, Any] = {
            "input_ids": pad_stack(text, self.pad_token_id),
            "attention_mask": pad_stack([torch.as_tensor(e["attention_mask"], dtype=torch.long)
                                         if "attention_mask" in e else torch.ones(len(t), dtype=torch.long)
                                         for e, t in zip(examples, text)]),
            "ids": ids, "image_ids": [str(e["image_id"]) if "image_id" in e else None for e in examples],
        }
        if fields["image_ids"][0] is None:
            fields["image_ids"] = None
        first = examples[0]
        if "region_feats" in first:
            fields["region_feats"] = pad_stack([e["region_feats"] for e in examples])
            fields["region_boxes"] = pad_stack([e["region_boxes"] for e in examples])
            fields["region_mask"] = _lengths_mask([len(e["region_feats"]) for e in examples]).long()
            for name in ("region_soft_labels", "region_wh"):
                if name in first:
                    fields[name] = pad_stack([e[name] for e in examples])
            if "region_global" in first:
                fields["region_global"] = torch.stack([e["region_global"] for e in examples])
        if "image_size" in first:
            fields["image_size"] = torch.stack([torch.as_tensor(e["image_size"]) for e in examples])
        if "pixel_values" in first:
            shapes = {tuple(e["pixel_values"].shape) for e in examples}
            if len(shapes) > 1:
                raise ValueError("VLCollator: pixel_values of different sizes in one batch: "
                                 + ", ".join(f"{i}: {tuple(e['pixel_values'].shape)}" for i, e in zip(ids, examples)))
            fields["pixel_values"] = torch.stack([e["pixel_values"] for e in examples])
        if "targets" in first:
            fields["targets"] = self._targets([e["targets"] for e in examples], ids)
        return VLBatch(**fields)

    @staticmethod
    def _check_same_fields(examples: Sequence[Mapping[str, Any]], ids: list[str]) -> None:
        keys = set(examples[0])
        for i, e in zip(ids, examples):
            if "input_ids" not in e:
                raise KeyError(f"VLCollator: example {i!r} has no input_ids")
            if set(e) != keys:
                raise KeyError(f"VLCollator: example {i!r} has fields {sorted(e)}, example {ids[0]!r} has {sorted(keys)}")

    def _targets(self, targets: Sequence[Mapping[str, Any]], ids: list[str]) -> dict[str, Any]:
        keys = list(targets[0])
        out = {}
        for i, t in zip(ids, targets):
            if set(t) != set(keys):
                raise KeyError(f"VLCollator: example {i!r} has targets {sorted(t)}, example {ids[0]!r} has {sorted(keys)}")
        for key in keys:
            values = [t[key] for t in targets]
            if all(isinstance(v, Tensor) for v in values):
                ranks = {v.dim() for v in values}
                if len(ranks) > 1:
                    raise ValueError(f"VLCollator: target {key!r} has tensors of ranks {sorted(ranks)} in one batch")
                out[key] = pad_stack(values, self.target_pad_values.get(key, 0))
            elif all(isinstance(v, (bool, int, float)) for v in values):
                out[key] = torch.tensor(values)
            else:
                out[key] = list(values)
        return out


# --------------------------------------------------------------------------------------------
# Registered datasets: `data=<name>` in YAML -> DATASETS.get(name)(cfg) -> ImageTextPairs
# --------------------------------------------------------------------------------------------
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


def _image_source(cfg: Mapping[str, Any], world: Any = None):
    kind = cfg.get("source", "features")
    if kind == "features":
        if not cfg.get("path"):
            raise ValueError("data.image.path must name a feature store (.h5) when data.image.source=features")
        return RegionSource(cfg["path"], num_bb=cfg.get("num_bb"), conf_th=cfg.get("conf_th", 0.2),
                            max_bb=cfg.get("max_bb", 100), min_bb=cfg.get("min_bb", 10),
                            global_feature=bool(cfg.get("global_feature", False)))
    from vlkit.features.patches import pixel_transform

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


def build_pairs(cfg: Mapping[str, Any], records: Iterable[dict], world: Any = None) -> ImageTextPairs:
    """`ImageTextPairs` over ``records`` with the tokenizer, lengths, image source and ``on_error`` of ``cfg``."""
    return ImageTextPairs(list(records), build_tokenizer(cfg.get("tokenizer")),
                          build_image_source(cfg.get("image", {}), world, cfg.get("on_error") or "raise"),
                          max_len=cfg.get("max_len", 62), filter_long=cfg.get("filter_long", False))


def _split_list(split: Any) -> list[str]:
    return [split] if isinstance(split, str) else list(split)


@register_dataset("shapes")
def shapes_pairs(cfg: Mapping[str, Any]) -> ImageTextPairs:
    """Captions of the embedded shapes world (5 per image) for ``cfg.split``, images rendered on the fly."""
    from vlkit.data.shapes import ShapesWorld

    world = ShapesWorld.from_cfg(cfg)
    records = [{"id": f"{i}#{k}", "image_id": world.image_id(i), "caption": c}
               for split in _split_list(cfg.get("split", "train")) for i in world.indices(split)
               for k, c in enumerate(world.captions(i))]
    return build_pairs(cfg, records, world)


@register_dataset("coco")
def coco_pairs(cfg: Mapping[str, Any]) -> ImageTextPairs:
    """COCO captions (``cfg.path``): COCO's own ``captions_*.json`` or the Karpathy json (splits ``cfg.split``)."""
    return build_pairs(cfg, formats.read_caption_json(cfg["path"], _split_list(cfg.get("split", "train")),
                                                      cfg.get("image_id", "stem")))


@register_dataset("flickr30k")
def flickr30k_pairs(cfg: Mapping[str, Any]) -> ImageTextPairs:
    """Flickr30k captions from ``dataset_flickr30k.json`` (``cfg.path``), splits ``cfg.split``."""
    return coco_pairs(cfg)


@register_dataset("cc")
def cc_pairs(cfg: Mapping[str, Any]) -> ImageTextPairs:
    """Conceptual Captions tsv (``cfg.path``); image ids by ``cfg.image_id`` (index | hash)."""
    return build_pairs(cfg, formats.read_cc_tsv(cfg["path"], cfg.get("image_id", "index"),
                                                tuple(cfg.get("columns", ("caption", "url")))))


@register_dataset("sbu")
def sbu_pairs(cfg: Mapping[str, Any]) -> ImageTextPairs:
    """SBU captions (``cfg.captions`` + ``cfg.urls``)."""
    return build_pairs(cfg, formats.read_sbu(cfg["captions"], cfg["urls"], cfg.get("image_id", "index")))


@register_dataset("vg")
def vg_pairs(cfg: Mapping[str, Any]) -> ImageTextPairs:
    """Visual Genome region descriptions (``cfg.path``) as image-level captions."""
    return build_pairs(cfg, formats.read_vg_regions(cfg["path"]))


@register_dataset("jsonl")
def jsonl_pairs(cfg: Mapping[str, Any]) -> ImageTextPairs:
    """Any JSON lines of ``{image_id, caption}`` (``cfg.path``)."""
    return build_pairs(cfg, formats.read_caption_jsonl(cfg["path"]))
