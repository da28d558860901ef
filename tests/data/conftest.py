"""Fixtures of the data tests: a small shapes world, its files on disk and a phrase resolver that
reads the world's English back independently of the generator."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from vlkit.data.shapes import COLORS, KINDS, SIZES, ShapesWorld, write_shapes

NUM_IMAGES = 40
_PLURALS = {k + ("es" if k.endswith("s") else "s"): k for k in KINDS}
_POSITION = re.compile(r"^(.*?)\s*(on the left|on the right|at the top|at the bottom)$")


@pytest.fixture(scope="session")
def world() -> ShapesWorld:
    return ShapesWorld(seed=0, num_images=NUM_IMAGES)


@pytest.fixture(scope="session")
def reader() -> SimpleNamespace:
    """``reader.parse_phrase`` / ``reader.matching`` / ``reader.resolve`` (defined below)."""
    return SimpleNamespace(parse_phrase=parse_phrase, matching=matching, resolve=resolve)


@pytest.fixture(scope="session")
def shapes_dir(tmp_path_factory, world):
    out = tmp_path_factory.mktemp("shapes")
    write_shapes(world, out)
    return out


def parse_phrase(phrase: str) -> tuple[str | None, str | None, str | None, str | None]:
    """"the large red circle on the left" -> (size, color, kind, position); kind None for shape/object."""
    m = _POSITION.match(phrase.strip())
    head, position = (m.group(1), m.group(2).split()[-1]) if m else (phrase.strip(), None)
    words = head.split()
    if words and words[0] in ("the", "a", "an"):
        words = words[1:]
    size = words.pop(0) if words and words[0] in SIZES else None
    color = words.pop(0) if words and words[0] in COLORS else None
    assert len(words) == 1, f"cannot parse {phrase!r}"
    noun = _PLURALS.get(words[0], words[0])
    assert noun in KINDS or noun in ("shape", "object", "shapes", "objects"), f"unknown noun in {phrase!r}"
    return size, color, noun if noun in KINDS else None, position


def matching(scene, size, color, kind):
    return [o for o in scene.objects if (size is None or o.size == size) and (color is None or o.color == color)
            and (kind is None or o.kind == kind)]


def resolve(scene, phrase: str, margin: float):
    """The one object ``phrase`` refers to; fails the test if the phrase is ambiguous or refers to nothing."""
    size, color, kind, position = parse_phrase(phrase)
    objs = matching(scene, size, color, kind)
    if position is None:
        assert len(objs) == 1, f"{phrase!r} matches {len(objs)} objects in scene {scene.image_id}"
        return objs[0]
    assert len(objs) == 2, f"{phrase!r}: a positional description needs exactly two candidates, got {len(objs)}"
    axis = 0 if position in ("left", "right") else 1
    a, b = sorted(objs, key=lambda o: o.center[axis])
    assert b.center[axis] - a.center[axis] >= margin, f"{phrase!r}: candidates too close to tell apart"
    return a if position in ("left", "top") else b
