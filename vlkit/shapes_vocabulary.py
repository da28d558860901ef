"""The shapes world's vocabulary: the kinds, colours and sizes of its objects, the detector's classes and
attributes over them, and the colours it draws with.

Two rooms read it: the world that draws the scenes (`vlkit.data.shapes`) and the shipped shapes detector, which was
trained on them (`vlkit.features.detector`: its classes and attributes, and `domain`'s check that images look like
the world). It stands on the bottom floor, so neither of the two imports the other for it.
"""
from __future__ import annotations

KINDS: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "cross")
COLORS: tuple[str, ...] = ("red", "orange", "yellow", "green", "cyan", "blue", "purple")
SIZES: tuple[str, ...] = ("small", "medium", "large")
OBJECT_CLASSES: tuple[str, ...] = ("__background__",) + KINDS
ATTRIBUTES: tuple[str, ...] = ("__no_attribute__",) + COLORS + SIZES

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40), "orange": (245, 140, 20), "yellow": (240, 220, 40), "green": (40, 180, 60),
    "cyan": (40, 210, 220), "blue": (40, 80, 230), "purple": (150, 60, 200),
}
