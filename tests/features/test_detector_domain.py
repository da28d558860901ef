"""Issue 43: the shipped shapes detector knows the shapes world only; extracting other images with it says so
(`check_detector`), on the command line and in a processor, and points to the BUTD weights or METER."""
import logging

import numpy as np
import pytest
from PIL import Image

from vlkit.cli import compose, main as cli
from vlkit.data.shapes import shared_world
from vlkit.features.detector.domain import check_detector, shapes_likeness


@pytest.fixture(scope="module")
def world():
    return shared_world({"name": "shapes", "seed": 0, "num_images": 8, "image_size": 128})


def _foreign(folder, n=4):
    """Shapes outside the world: teal, maroon, olive and pink squares and circles on white."""
    folder.mkdir()
    for k, colour in enumerate(["teal", "maroon", "olive", "pink"][:n]):
        image = Image.new("RGB", (96, 96), "white")
        image.paste(colour, (20, 20, 70, 70))
        image.save(folder / f"own_{k}.png")
    return folder


def test_the_shapes_world_looks_like_itself_and_other_images_do_not(world, tmp_path):
    assert all(shapes_likeness(world.image(i)) == 1.0 for i in range(8))
    rng = np.random.default_rng(0)
    assert shapes_likeness((rng.random((80, 80, 3)) * 255).astype(np.uint8)) < 0.3  # noise, a photo's stand-in
    folder = _foreign(tmp_path / "own")
    assert all(shapes_likeness(p) == 0.0 for p in folder.iterdir())
    assert check_detector([(str(i), world.image(i)) for i in range(8)], "shapes") is None
    images = [(p.stem, p) for p in sorted(folder.iterdir())]
    assert check_detector(images, "butd") is None  # the BUTD detector was trained on Visual Genome photos
    warning = check_detector(images, "shapes")
    assert warning.startswith("4 of 4 images looked at do not look like the shapes world")
    assert "'own_0 (0%)'" in warning and "detector=butd" in warning and "METER" in warning


def test_extract_features_warns_on_foreign_images(tmp_path, caplog):
    folder = _foreign(tmp_path / "own", n=2)
    with caplog.at_level(logging.WARNING, logger="vlkit.features.detector.domain"):
        assert cli(["extract-features", f"images={folder}", f"out={tmp_path / 'f.h5'}", "device=cpu",
                    "progress=false", "on_error=skip"]) == 0
    assert "2 of 2 images looked at do not look like the shapes world" in caplog.text


def test_extract_features_uses_one_thread_by_default():
    assert compose("extract-features", ["images=x", "out=y.h5"]).threads == 1


def test_a_region_processor_over_foreign_images_warns(tmp_path, caplog, monkeypatch):
    import vlkit

    monkeypatch.setenv("VLKIT_CACHE", str(tmp_path / "cache"))
    folder = _foreign(tmp_path / "own", n=2)
    with caplog.at_level(logging.WARNING, logger="vlkit.features.detector.domain"):
        vlkit.build_processor("uniter/tiny", tokenizer="shapes", images=str(folder))
    assert "2 of 2 images looked at do not look like the shapes world" in caplog.text
