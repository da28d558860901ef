"""What the shipped shapes detector knows, and a cheap check that images look like it.

The shapes detector (``detector=shapes``) was trained on the shapes world only: shapes of 5 kinds in 7 flat colours
(`vlkit.shapes_vocabulary.PALETTE`) on a dark grey background. On other images (photos, other colours, other shapes) its
regions carry little: the region families answered colour questions of another shapes data set at 47-55% where
METER on pixels reached 100% (issue 43). `check_detector` samples a few images and says so before extraction.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from vlkit.shapes_vocabulary import PALETTE
from vlkit.validate import DataError, first, rgb_array, sample_evenly

log = logging.getLogger(__name__)
SAMPLE = 16  # images looked at
SIDE = 64  # each looked at at most this size (nearest neighbour: the colours stay those of the image)
LIKENESS = 0.75  # share of an image's pixels in the world's colours for it to look like the shapes world
TOLERANCE = 32  # largest per-channel distance to a palette colour (JPEG noise)
ADVICE = ("the shapes detector knows the shapes world only (its 7 colours and 5 kinds of shape on a dark grey "
          "background) and its regions carry little on other images: extract with the BUTD detector "
          "(detector=butd weights=faster_rcnn_from_caffe_attr.pkl, docs/features.md) or compare a pixel family "
          "(METER) on the image folder")


def shapes_likeness(image: Any) -> float:
    """The share of ``image``'s pixels (a PIL image, an array or a path) in the shapes world's colours: one of its 7
    shape colours, or a dark grey background (equal channels, 15-65)."""
    from PIL import Image

    pixels = Image.fromarray(rgb_array(image, "image"))
    pixels.thumbnail((SIDE, SIDE), Image.NEAREST)
    rgb = np.asarray(pixels, dtype=np.int16).reshape(-1, 3)
    palette = np.asarray(list(PALETTE.values()), dtype=np.int16)
    coloured = (np.abs(rgb[:, None, :] - palette[None]).max(-1) <= TOLERANCE).any(-1)
    grey = (rgb.max(-1) - rgb.min(-1) <= 10) & (rgb.max(-1) >= 15) & (rgb.max(-1) <= 65)
    return float((coloured | grey).mean())


def check_detector(images: Sequence[tuple[str, Any]], detector: Any, sample: int = SAMPLE) -> str | None:
    """A warning when ``detector`` is the shapes detector and some of ``images`` (``(image_id, image)`` pairs, a
    sample of ``sample`` spread evenly) do not look like the shapes world (`shapes_likeness` under `LIKENESS`);
    logged, and returned (None when they do, or for another detector). Unreadable images are left to extraction."""
    if detector != "shapes":
        return None
    foreign, looked = [], 0
    for image_id, image in sample_evenly(list(images), sample):
        try:
            likeness = shapes_likeness(image)
        except (DataError, OSError, ValueError):
            continue
        looked += 1
        if likeness < LIKENESS:
            foreign.append(f"{image_id} ({likeness:.0%})")
    if not foreign:
        return None
    message = (f"{len(foreign)} of {looked} images looked at do not look like the shapes world (share of their pixels "
               f"in its colours: {first(foreign, 3)}): {ADVICE}")
    log.warning(message)
    return message


__all__ = ["ADVICE", "check_detector", "shapes_likeness"]
