"""Parity fixtures made with the official code (`tests/fixtures/README.md`) and the vlkit input path
that feeds their raw inputs: feature stores written as a user would, image sources, collators."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from official_fixtures import FIXTURES


@pytest.fixture(scope="session")
def tensors():
    """``tensors("vilbert_pretrain")`` -> the fixture's safetensors (cached per session)."""
    from safetensors.torch import load_file

    cache: dict[str, dict[str, torch.Tensor]] = {}

    def load(name: str) -> dict[str, torch.Tensor]:
        if name not in cache:
            cache[name] = load_file(str(FIXTURES / f"{name}.safetensors"))
        return cache[name]

    return load


@pytest.fixture(scope="session")
def vilbert_stores(tensors, tmp_path_factory):
    """Feature stores of the ViLBERT fixtures' raw detections: ``pretrain`` (cc0..cc3 with ``cls_prob``) and
    ``multitask`` (images 1..8), float32 as the official LMDB / TSV features."""
    from vlkit.features.store import FeatureStoreWriter

    root = tmp_path_factory.mktemp("vilbert_stores")
    t = tensors("vilbert_pretrain")
    with FeatureStoreWriter(root / "pretrain.h5", dtype="float32") as w:
        for b in range(4):
            w.add(f"cc{b}", features=t["raw.features"][b].numpy(), boxes=t["raw.boxes_px"][b].numpy(),
                  image_h=int(t["raw.image_h"][b]), image_w=int(t["raw.image_w"][b]),
                  cls_prob=t["in.image_target"][b].numpy())  # the raw cls_prob (no padding: equal to image_target)
    t = tensors("vilbert_multitask")
    with FeatureStoreWriter(root / "multitask.h5", dtype="float32") as w:
        for i in range(1, 9):
            width, height = t[f"raw.image{i}.image_wh"].tolist()
            w.add(str(i), features=t[f"raw.image{i}.features"].numpy(), boxes=t[f"raw.image{i}.boxes_px"].numpy(),
                  image_h=height, image_w=width)
    return {"pretrain": root / "pretrain.h5", "multitask": root / "multitask.h5"}


@pytest.fixture(scope="session")
def uniter_store(tensors, tmp_path_factory):
    """The UNITER fixture's npz files (as ``save_to_npz`` wrote them) imported with ``import_features``."""
    from vlkit.features.importers import import_features

    root = tmp_path_factory.mktemp("uniter_store")
    t = tensors("uniter_pretrain")
    (root / "npz").mkdir()
    for i in range(4):
        np.savez(root / "npz" / f"img{i}.npz",
                 **{k: t[f"npz.img{i}.{k}"].numpy() for k in ("norm_bb", "features", "conf", "soft_labels")})
    return import_features(root / "npz", "uniter_npz", root / "uniter.h5", progress=False)


@pytest.fixture(scope="session")
def meter_images(tensors, tmp_path_factory):
    """The METER fixture's raw images as PNG files in a folder (the official loader reads encoded images)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("meter_images")
    t = tensors("meter_clip16_pretrain")
    for i in range(4):
        Image.fromarray(t[f"raw.image{i}.uint8_hwc"].numpy()).save(root / f"image{i}.png")
    return root
