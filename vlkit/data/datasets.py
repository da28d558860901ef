"""The registered image-text pair datasets: ``data=<name>`` in YAML -> ``DATASETS.get(name)(cfg)`` -> an
`ImageTextPairs` (the shapes world, COCO, Flickr30k, CC, SBU, VG, JSON lines; ``data=shards`` streams,
`vlkit.data.stream`; ``data=images`` has none: the images and tokenizer of a task's own files)."""
from __future__ import annotations

from typing import Any, Mapping

from vlkit.data import formats
from vlkit.data.pairs import ImageTextPairs, build_pairs
from vlkit.data.shapes import shared_world
from vlkit.registry import register_dataset
from vlkit.validate import DataError


def split_list(split: Any) -> list[str]:
    """A config's split or splits (``train``, ``[val, test]``) as a list of names."""
    return [split] if isinstance(split, str) else [str(v) for v in split]


@register_dataset("shapes")
def shapes_pairs(cfg: Mapping[str, Any]) -> ImageTextPairs:
    """Captions of the embedded shapes world (5 per image) for ``cfg.split``, images rendered on the fly."""
    world = shared_world(cfg)
    records = [{"id": f"{i}#{k}", "image_id": world.image_id(i), "caption": c}
               for split in split_list(cfg.get("split", "train")) for i in world.indices(split)
               for k, c in enumerate(world.captions(i))]
    return build_pairs(cfg, records, world)


@register_dataset("coco")
def coco_pairs(cfg: Mapping[str, Any]) -> ImageTextPairs:
    """COCO captions (``cfg.path``): COCO's own ``captions_*.json`` or the Karpathy json (splits ``cfg.split``)."""
    return build_pairs(cfg, formats.read_caption_json(cfg["path"], split_list(cfg.get("split", "train")),
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


@register_dataset("images")
def no_pairs(cfg: Mapping[str, Any]) -> ImageTextPairs:
    """``data=images`` gives images and a tokenizer for a task's own files, no captions to pre-train on."""
    raise DataError("data=images holds no captions (it gives a fine-tuning on a task's own files its images and "
                    "tokenizer): pre-train on image-text pairs, e.g. data=jsonl data.path=captions.jsonl")


@register_dataset("jsonl")
def jsonl_pairs(cfg: Mapping[str, Any]) -> ImageTextPairs:
    """Any JSON lines of ``{image_id, caption}`` (``cfg.path``)."""
    return build_pairs(cfg, formats.read_caption_jsonl(cfg["path"]))
