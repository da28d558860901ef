"""Fixtures of the reliability catalogue: hand-written feature stores (bypassing the writer's
validation, as an old or foreign tool would write them), caption files, the console script in-process,
and the shipped shapes detector."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

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


@pytest.fixture
def data(tmp_path):
    """``data(n=6, soft=True, **bad)``: a valid raw store of ``n`` images plus 3 captions each; returns
    (store, captions, image ids)."""

    def make(n: int = 6, soft: bool = True, name: str = "store.h5", feat: int = FEAT, extra_captions=()):
        images = {f"img{k}": regions(k, soft=soft, feat=feat) for k in range(n)}
        store = raw_store(tmp_path / name, images)
        caps = captions(tmp_path / f"{Path(name).stem}.jsonl", list(images), extra=extra_captions)
        return store, caps, list(images)

    return make


@pytest.fixture
def vlkit_console(capsys):
    """``vlkit_console(*args) -> (exit status, stdout, stderr)``: the console script, in-process."""
    from vlkit.cli import console

    def run(*args: str, debug: bool = False):
        import os

        old = os.environ.pop("VLKIT_DEBUG", None)
        if debug:
            os.environ["VLKIT_DEBUG"] = "1"
        try:
            code = console(list(args))
        finally:
            os.environ.pop("VLKIT_DEBUG", None)
            if old is not None:
                os.environ["VLKIT_DEBUG"] = old
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture(scope="session")
def shapes_detector():
    from vlkit.features.detector import load_detector

    return load_detector("shapes")


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(autouse=True)
def quiet_hf(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
