"""Fixtures for the features tests: tiny detectors and writers of the public file formats."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vlkit.features.detector import BottomUpDetector, DetectorConfig

TINY = dict(
    name="tiny", stage_blocks=(1, 1, 1, 1), stem_channels=8, res2_channels=8, res2_bottleneck=4, rpn_channels=16,
    anchor_scales=(1, 2, 4), num_classes=7, num_attributes=5, attr_embed_dim=4, attr_hidden=8, pooler_resolution=4,
    min_size=96, max_size=160, rpn_min_size=4.0, rpn_pre_nms_topk=300, rpn_post_nms_topk=40, min_boxes=3, max_boxes=12,
)


def _tiny_config(**overrides) -> DetectorConfig:
    return DetectorConfig(**{**TINY, **overrides})


def _randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random values in every parameter and buffer (positive variances), so layouts matter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.state_dict().items()):
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=g) * 0.3)
    return model


@pytest.fixture
def tiny_config():
    """``tiny_config(**overrides)``: a small bottleneck C4 detector config (7 classes, 5 attributes)."""
    return _tiny_config


@pytest.fixture
def randomize():
    """``randomize(model, seed=0)``: fill every float parameter and buffer with random values."""
    return _randomize


@pytest.fixture
def tiny_detector() -> BottomUpDetector:
    torch.manual_seed(0)
    model = _randomize(BottomUpDetector(_tiny_config())).eval()
    with torch.no_grad():  # small RPN deltas: proposals stay near their (varied) anchors
        model.proposal_generator.rpn_head.anchor_deltas.weight.mul_(0.01)
    return model


@pytest.fixture
def rgb_images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(3)]
