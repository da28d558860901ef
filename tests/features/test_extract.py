"""End to end: the shipped shapes detector, `vlkit extract-features`, resumable extraction."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torchvision.ops import box_iou

from vlkit.cli import compose, main as cli
from vlkit.data.shapes import ATTRIBUTES, OBJECT_CLASSES, ShapesWorld
from vlkit.features.detector import ASSETS, extract_features, load_detector
from vlkit.features.store import FeatureStore


@pytest.fixture(scope="module")
def shapes_detector():
    return load_detector("shapes")


@pytest.fixture(scope="module")
def world():
    return ShapesWorld(seed=4242, num_images=12)  # a seed the detector was not trained on


def test_shipped_detector_finds_the_objects(shapes_detector, world):
    cfg = shapes_detector.cfg
    assert cfg.class_names == OBJECT_CLASSES and cfg.attribute_names == ATTRIBUTES and cfg.feature_dim == 256
    meta = json.loads((ASSETS / "shapes_detector.json").read_text())["meta"]
    assert meta["map50"] > 0.5 and (ASSETS / "shapes_detector.safetensors").stat().st_size < 8 * 2**20
    found = correct = total = 0
    outs = shapes_detector.extract([world.image(i) for i in range(len(world))])
    for i, out in enumerate(outs):
        scene = world.scene(i)
        gt = torch.tensor([[o.box[0], o.box[1], o.box[2] - 1, o.box[3] - 1] for o in scene.objects])
        iou = box_iou(gt, torch.from_numpy(out["boxes"]))
        for obj, row in zip(scene.objects, iou):
            total += 1
            if row.max() >= 0.5:
                found += 1
                correct += int(out["objects_id"][int(row.argmax())] + 1 == obj.class_id)
    assert found / total >= 0.8 and correct / max(found, 1) >= 0.8


def test_cli_extracts_a_folder_with_the_shapes_detector(tmp_path, world, capsys):
    images = tmp_path / "images"
    images.mkdir()
    for i in range(6):
        world.image(i).save(images / f"{world.image_id(i)}.png")
    out = tmp_path / "feats.h5"
    assert cli(["extract-features", f"images={images}", f"out={out}", "device=cpu", "batch_size=4", "progress=false"]) == 0
    assert "6 images, feature_dim 256" in capsys.readouterr().out
    store = FeatureStore(out)
    assert sorted(store.ids(), key=int) == [str(i) for i in range(6)]
    assert store.num_classes == len(OBJECT_CLASSES) and store.has_soft_labels
    assert store.attrs["detector"] == "shapes" and len(store.attrs["weights_sha256"]) == 64
    r = store.load("0")
    assert 10 <= len(r) <= 36 and r.attr_prob.shape == (len(r), len(ATTRIBUTES))
    assert (r.boxes >= 0).all() and (r.boxes <= 127).all() and np.all(np.diff(r.conf) <= 0)


def test_extraction_resumes_after_interruption(tmp_path, shapes_detector, world):
    out = tmp_path / "feats.h5"
    pairs = [(world.image_id(i), world.image(i)) for i in range(6)]

    def interrupted():
        yield from pairs[:4]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract_features(interrupted(), out, detector=shapes_detector, batch_size=2, progress=False)
    assert not out.exists()
    calls = []
    real = shapes_detector.extract
    shapes_detector.extract = lambda imgs, **kw: calls.append(len(imgs)) or real(imgs, **kw)
    try:
        extract_features(pairs, out, detector=shapes_detector, batch_size=2, progress=False)
    finally:
        del shapes_detector.extract
    assert sum(calls) == 2  # only the two images the interrupted run never finished
    store = FeatureStore(out)
    assert len(store) == 6
    fresh = shapes_detector.extract([pairs[1][1]])[0]
    np.testing.assert_allclose(store.load("1", num_bb=100).features, fresh["features"], rtol=1e-2, atol=1e-2)


def test_config_and_butd_needs_weights(tmp_path):
    cfg = compose("extract-features", ["images=x", "out=y.h5"])
    assert cfg.detector == "shapes" and cfg.weights is None and cfg.resume
    (tmp_path / "img").mkdir()
    ShapesWorld(num_images=1).image(0).save(tmp_path / "img" / "a.png")
    with pytest.raises(ValueError, match="weights=PATH"):
        cli(["extract-features", f"images={tmp_path / 'img'}", f"out={tmp_path / 'o.h5'}", "detector=butd"])


def test_mixed_sizes_are_grouped_never_padded(tmp_path, tiny_detector):
    rng = np.random.default_rng(0)
    shapes = [(48, 64), (64, 48), (48, 64), (30, 90), (64, 48)]
    pairs = [(f"im{i}", rng.integers(0, 256, (*hw, 3), dtype=np.uint8)) for i, hw in enumerate(shapes)]
    out = extract_features(pairs, tmp_path / "f.h5", detector=tiny_detector, batch_size=2, dtype="float32", progress=False)
    store = FeatureStore(out)
    assert sorted(store.ids()) == [p[0] for p in pairs]
    for image_id, img in pairs:
        alone = tiny_detector.extract([img])[0]
        got = store.load(image_id, num_bb=100)
        assert (got.image_h, got.image_w) == img.shape[:2]
        np.testing.assert_allclose(got.features, alone["features"], rtol=1e-4, atol=1e-4)
