"""Loading released BUTD checkpoints: detectron2 .pkl (restricted unpickler) and bua .pth (weights_only)."""
from __future__ import annotations

import collections
import os
import pickle

import numpy as np
import pytest
import torch

from vlkit.features.detector.convert import load_butd_checkpoint
from vlkit.features.detector import BottomUpDetector
from vlkit.io import UnsafePickleError

_PRED = "roi_heads.box_predictor."
_RPN = "proposal_generator.rpn_head."


@pytest.fixture
def reference(tiny_config, randomize):
    model = randomize(BottomUpDetector(tiny_config()), seed=3).eval()
    with torch.no_grad():  # released checkpoints have no background box regression in d2 order
        model.roi_heads.box_predictor.bbox_pred.weight[:4] = 0
        model.roi_heads.box_predictor.bbox_pred.bias[:4] = 0
        model.proposal_generator.rpn_head.anchor_deltas.weight.mul_(0.01)
    return model


def _d2_state(model: BottomUpDetector) -> dict[str, np.ndarray]:
    """The detectron2 layout of ``model``: background last, no background regression, size-major anchors."""
    cfg = model.cfg
    state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    for name in ("cls_score.weight", "cls_score.bias", "cls_embedding.weight", "attr_score.weight", "attr_score.bias"):
        w = state[_PRED + name]
        state[_PRED + name] = np.concatenate([w[1:], w[:1]])
    for p in ("weight", "bias"):
        state[_PRED + f"bbox_pred.{p}"] = state[_PRED + f"bbox_pred.{p}"][4:]
    n_s, n_r = len(cfg.anchor_scales), len(cfg.anchor_ratios)
    ours_of_d2 = [r * n_s + s for s in range(n_s) for r in range(n_r)]  # d2 index s*R+r holds ours r*S+s
    for p in ("weight", "bias"):
        k = _RPN + f"objectness_logits.{p}"
        state[k] = state[k][ours_of_d2]
        k = _RPN + f"anchor_deltas.{p}"
        t = state[k]
        state[k] = t.reshape(len(ours_of_d2), 4, *t.shape[1:])[ours_of_d2].reshape(t.shape)
    return state


def _bua_state(model: BottomUpDetector) -> dict[str, torch.Tensor]:
    """The bottom-up-attention.pytorch layout: 2-way objectness [bg | fg], renamed attribute head."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    renames = {"cls_embedding.": "cls_embed.", "fc_attr.": "attr_linear1.", "attr_score.": "attr_linear2."}
    for k in list(state):
        for old, new in renames.items():
            if k.startswith(_PRED + old):
                state[_PRED + new + k[len(_PRED + old):]] = state.pop(k)
    g = torch.Generator().manual_seed(5)
    for p in ("weight", "bias"):
        k = _RPN + f"objectness_logits.{p}"
        bg = torch.randn(state[k].shape, generator=g)
        state[k] = torch.cat([bg, state[k] + bg])  # softmax([bg, fg])[1] == sigmoid(fg - bg)
    state["backbone.stem.conv1.norm.num_batches_tracked"] = torch.tensor(7)
    return state


def _assert_same_outputs(a: BottomUpDetector, b: BottomUpDetector, images) -> None:
    for ra, rb in zip(a.run(images), b.run(images)):
        for key in ("rois", "features", "cls_prob", "attr_prob"):
            torch.testing.assert_close(ra[key], rb[key], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("protocol", [2, 5])  # detectron2-era pickles and the newest protocol
def test_detectron2_pkl_loads_to_identical_outputs(tmp_path, reference, tiny_config, rgb_images, protocol):
    path = tmp_path / "faster_rcnn_from_caffe_attr.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": _d2_state(reference), "__author__": "test"}, f, protocol=protocol)
    model = BottomUpDetector(tiny_config()).eval()
    report = load_butd_checkpoint(model, path)
    assert report.ok and report.format == "d2" and report.mapped == len(model.state_dict())
    assert any("background" in t for t in report.transformed)
    _assert_same_outputs(reference, model, rgb_images)


def test_bua_pth_loads_to_identical_outputs(tmp_path, reference, tiny_config, rgb_images):
    path = tmp_path / "bua-caffe-frcn-r101-k10-100.pth"
    torch.save({"model": _bua_state(reference), "iteration": 0}, path)
    model = BottomUpDetector(tiny_config()).eval()
    report = load_butd_checkpoint(model, path)
    assert report.ok and report.format == "bua"
    assert "backbone.stem.conv1.norm.num_batches_tracked" in report.ignored
    assert len(report.renamed) == 5 and any("objectness" in t for t in report.transformed)
    _assert_same_outputs(reference, model, rgb_images)


def test_missing_norm_statistics_are_filled_and_reported(tmp_path, reference, tiny_config, rgb_images):
    norm = reference.backbone.stem.conv1.norm
    norm.running_mean.zero_()
    norm.running_var.fill_(1.0)
    state = _d2_state(reference)
    del state["backbone.stem.conv1.norm.running_mean"], state["backbone.stem.conv1.norm.running_var"]
    path = tmp_path / "d2.pkl"
    path.write_bytes(pickle.dumps(state))  # a bare dict of arrays is accepted too
    model = BottomUpDetector(tiny_config()).eval()
    report = load_butd_checkpoint(model, path)
    assert "backbone.stem.conv1.norm.running_var" in report.filled
    _assert_same_outputs(reference, model, rgb_images)


def test_strict_key_mapping_reports_missing_unexpected_and_shapes(tmp_path, reference, tiny_config):
    state = _d2_state(reference)
    del state["roi_heads.res5.0.conv2.weight"]
    state["roi_heads.extra.weight"] = np.zeros(3, np.float32)
    path = tmp_path / "broken.pkl"
    path.write_bytes(pickle.dumps({"model": state}))
    with pytest.raises(ValueError) as err:
        load_butd_checkpoint(BottomUpDetector(tiny_config()), path)
    msg = str(err.value)
    assert "broken.pkl" in msg and "roi_heads.res5.0.conv2.weight" in msg and "roi_heads.extra.weight" in msg
    wrong = BottomUpDetector(tiny_config(num_attributes=9))
    path.write_bytes(pickle.dumps({"model": _d2_state(reference)}))
    with pytest.raises(ValueError, match="shape mismatch.*attr_score"):
        load_butd_checkpoint(wrong, path)


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned-by-pickle",))


@pytest.mark.parametrize("evil", [_Payload(), collections.Counter(a=1)])
def test_restricted_unpickler_refuses_classes(tmp_path, monkeypatch, reference, tiny_config, evil):
    monkeypatch.chdir(tmp_path)
    state = _d2_state(reference)
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"model": state, "extra": evil}))
    with pytest.raises(UnsafePickleError, match="evil.pkl"):
        load_butd_checkpoint(BottomUpDetector(tiny_config()), path)
    assert not (tmp_path / "pwned-by-pickle").exists()
