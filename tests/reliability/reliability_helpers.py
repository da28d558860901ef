"""Helpers of the reliability catalogue: hand-written feature stores (bypassing the writer's validation,
as an old or foreign tool would write them), caption files, command-line arguments and a tiny
deterministic detector. Imported by the test modules (and the subprocesses of test_kill.py)."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

FEAT, CLASSES, BOXES = 16, 5, 12
CAPTIONS = ["a red circle", "a blue square on the left", "two green triangles", "a small yellow star",
            "the circle is above the square", "there is a purple shape"]


def regions(seed: int, n: int = BOXES, feat: int = FEAT, h: int = 100, w: int = 120, soft: bool = True) -> dict:
    """Valid regions of one image: boxes inside the h x w image, descending conf, soft labels."""
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 0.5, (n, 2)) * [w, h]
    wh = rng.uniform(0.1, 0.4, (n, 2)) * [w, h]
    out = {"features": rng.random((n, feat), dtype=np.float32),
           "boxes": np.concatenate([xy, xy + wh], 1).astype(np.float32),
           "conf": np.sort(rng.uniform(0.1, 1.0, n))[::-1].astype(np.float32), "image_h": h, "image_w": w}
    if soft:
        p = rng.random((n, CLASSES)).astype(np.float32)
        out["cls_prob"] = p / p.sum(1, keepdims=True)
    return out


def raw_store(path: Path, images: dict[str, dict]) -> Path:
    """A store in vlkit's layout written with h5py directly: no validation, whatever the regions hold."""
    schema: dict[str, list[int]] = {}
    with h5py.File(path, "w") as f:
        for image_id, fields in images.items():
            g = f.create_group(image_id)
            g.attrs["image_h"], g.attrs["image_w"] = fields["image_h"], fields["image_w"]
            for key, value in fields.items():
                if key not in ("image_h", "image_w"):
                    g.create_dataset(key, data=np.asarray(value))
                    schema[key] = list(np.asarray(value).shape[1:])
        f.attrs.update({"vlkit_format": "vlkit-features", "format_version": 1, "provenance": json.dumps({"x": 1}),
                        "schema": json.dumps(schema), "dtype": "float32", "box_order": "descending conf",
                        "has_soft_labels": "cls_prob" in schema, "num_images": len(images)})
    return path


def captions(path: Path, image_ids, per_image: int = 3, extra=()) -> Path:
    lines = [{"image_id": iid, "caption": CAPTIONS[(k + j) % len(CAPTIONS)]}
             for k, iid in enumerate(image_ids) for j in range(per_image)] + list(extra)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run_args(out: Path, steps: int = 2) -> list[str]:
    return [f"trainer.output_dir={out}", f"trainer.max_steps={steps}", "trainer.batch_size=4", "trainer.warmup=0",
            "trainer.progress=false", "trainer.trackers=[]", "trainer.lr=1e-3", "model.preset=tiny",
            "trainer.save_every=1"]


def jsonl_data(caps: Path, store: Path) -> list[str]:
    return ["data=jsonl", f"data.path={caps}", "data.tokenizer=shapes", f"data.image.path={store}", "data.max_len=20"]


def shapes_store(path: Path, num_images: int, poison_split: str | None = None) -> tuple[Path, list[str]]:
    """A raw store of the shapes world's first ``num_images`` images (data.num_images=N, seed 0): no feature
    extraction needed; the images of ``poison_split`` hold NaN features. Returns (store, poisoned ids)."""
    from vlkit.data.shapes import ShapesWorld

    world = ShapesWorld(0, num_images, 128)
    images = {world.image_id(i): regions(i, h=128, w=128) for i in range(num_images)}
    poisoned = [world.image_id(i) for i in world.indices(poison_split)] if poison_split else []
    for image_id in poisoned:
        images[image_id]["features"][:] = np.nan
    return raw_store(path, images), poisoned


def tiny_detector():
    """A small random-weight BUTD detector, the same in every process (seeded)."""
    import torch

    from vlkit.features.detector import BottomUpDetector, DetectorConfig

    torch.manual_seed(0)
    cfg = DetectorConfig(name="tiny", stage_blocks=(1, 1, 1, 1), stem_channels=8, res2_channels=8, res2_bottleneck=4,
                         rpn_channels=16, anchor_scales=(1, 2, 4), num_classes=7, num_attributes=5, attr_embed_dim=4,
                         attr_hidden=8, pooler_resolution=4, min_size=96, max_size=160, rpn_min_size=4.0,
                         rpn_pre_nms_topk=300, rpn_post_nms_topk=40, min_boxes=3, max_boxes=12)
    return BottomUpDetector(cfg).eval()
