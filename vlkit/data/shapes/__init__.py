"""The embedded default world: procedurally generated scenes of coloured shapes with captions,
VQA questions, referring expressions, NLVR2-style statements and SNLI-VE-style hypotheses.

Everything is a pure function of ``(seed, index)``: each kind of annotation draws from its own
``numpy.random.default_rng((seed, stream, index))`` stream, so any item can be built on its own. VQA
questions and NLVR2 statements are in addition balanced over their split, as VQA v2 balanced VQA v1
(`balance`): an image's are chosen among its candidates given the answers of the split's images before it
(in index order), so that every answer of a template is equally likely, also given the attributes its
text names, and a question-only model learns nothing beyond the question's type.
Image ids are the decimal image index (``"0"``, ``"1"``, ...), as Flickr30K ids are plain numbers;
integer-id formats (COCO, VQA) store ``int(image_id)``.

Modules: `scenes` (object vocabulary, scene generation, rendering), `language` (templates, annotations,
the closed-vocabulary tokenizer), `balance` (answers balanced over a split) and `writer` (the world on disk
in the official formats).
"""
from __future__ import annotations

import functools
from typing import Any

from vlkit.data.shapes.language import ShapesLanguage, shapes_tokenizer, shapes_vocab
from vlkit.data.shapes.scenes import (ATTRIBUTES, COLORS, KINDS, OBJECT_CLASSES, PALETTE, SIZES, SPLITS, Scene,
                                      ShapeObject, ShapeScenes, shape_mask)
from vlkit.data.shapes.writer import FILES, make_shapes_main, write_shapes


class ShapesWorld(ShapesLanguage, ShapeScenes):
    """Deterministic scenes and annotations: everything depends only on ``(seed, index)``."""


@functools.lru_cache(maxsize=8)
def _shared_world(args: tuple) -> ShapesWorld:
    return ShapesWorld(*args)


def shared_world(cfg: Any) -> ShapesWorld:
    """`ShapesWorld.from_cfg`, one instance per configuration and process, so that its annotations (the balanced
    VQA questions and NLVR2 statements take seconds to draw) are made once for every model family."""
    return _shared_world(ShapesWorld.cfg_args(cfg))


__all__ = ["ATTRIBUTES", "COLORS", "FILES", "KINDS", "OBJECT_CLASSES", "PALETTE", "SIZES", "SPLITS", "Scene",
           "ShapeObject", "ShapesWorld", "make_shapes_main", "shape_mask", "shapes_tokenizer", "shapes_vocab",
           "shared_world", "write_shapes"]
