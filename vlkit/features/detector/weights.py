"""Detector weights: saving a detector (safetensors + config json), loading the shipped shapes detector,
a saved one, or the ResNet-101 BUTD detector from released checkpoints."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from vlkit.features.detector.convert import load_butd_checkpoint
from vlkit.features.detector.network import BottomUpDetector, DetectorConfig, preset
from vlkit.io import atomic_path, atomic_write_text, sha256_file

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def save_detector(
    model: BottomUpDetector, directory: str | os.PathLike, name: str, meta: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write ``<name>.safetensors`` (floats as ``dtype``) and ``<name>.json`` (config + ``meta``) atomically;
    returns the json path."""
    from safetensors.torch import save_file

    directory = Path(directory)
    state = {
        k: (v.to(dtype) if v.is_floating_point() else v).detach().contiguous().cpu()
        for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")
    }
    with atomic_path(directory / f"{name}.safetensors") as tmp:
        save_file(state, str(tmp))
    doc = {"config": model.cfg.to_dict(), "meta": meta or {}}
    atomic_write_text(directory / f"{name}.json", json.dumps(doc, indent=1))
    return directory / f"{name}.json"


def shapes_detector_config() -> DetectorConfig:
    """The shipped shapes detector's configuration (its feature size and classes), without its weights."""
    return DetectorConfig.from_dict(json.loads((ASSETS / "shapes_detector.json").read_text())["config"])


def load_detector(
    name: str | os.PathLike = "shapes", weights: str | os.PathLike | None = None, device: str | torch.device = "cpu",
    random_init: bool = False, **overrides: Any,
) -> BottomUpDetector:
    """Build a detector ready for inference.

    ``"shapes"`` (default): the shipped shapes detector. ``"butd"``: the ResNet-101 BUTD detector with
    ``weights`` converted from ``faster_rcnn_from_caffe_attr.pkl`` (detectron2 format) or
    ``bua-caffe-frcn-r101-k10-100.pth``. A path to a ``.json`` written by ``save_detector`` loads that
    detector. ``random_init=True`` skips weights (benchmarks, tests). ``overrides`` edit the config
    (e.g. ``min_boxes=36, max_boxes=36``).
    """
    from safetensors.torch import load_file

    name = str(name)
    if name in ("butd", "butd_r101"):
        model = BottomUpDetector(preset("butd_r101", **overrides))
        if not random_init:
            if weights is None:
                raise ValueError(
                    "detector=butd needs weights=PATH (faster_rcnn_from_caffe_attr.pkl or bua-caffe-frcn-r101-k10-100.pth)"
                )
            load_butd_checkpoint(model, weights, strict=True)
            model.provenance = {"detector": "butd_r101", "weights": Path(weights).name, "weights_sha256": sha256_file(weights)}
        return model.to(device).eval()
    json_path = ASSETS / "shapes_detector.json" if name == "shapes" else Path(name)
    if json_path.suffix != ".json":
        raise ValueError(f"unknown detector {name!r}: use 'shapes', 'butd' or a detector .json written by save_detector")
    if not json_path.exists():
        raise FileNotFoundError(f"{json_path}: detector config not found")
    doc = json.loads(json_path.read_text())
    cfg = DetectorConfig.from_dict({**doc["config"], **overrides})
    model = BottomUpDetector(cfg)
    if not random_init:
        wpath = Path(weights) if weights is not None else json_path.with_suffix(".safetensors")
        missing, unexpected = model.load_state_dict(load_file(str(wpath)), strict=False)
        missing = [k for k in missing if not k.endswith("num_batches_tracked")]
        if missing or unexpected:
            raise ValueError(f"{wpath}: weights do not match the config (missing {missing[:5]}, unexpected {unexpected[:5]})")
        model.provenance = {"detector": cfg.name, "weights": wpath.name, "weights_sha256": sha256_file(wpath)}
    return model.to(device).eval()
