"""Load released bottom-up-attention checkpoints into ``vlkit.features.detector.BottomUpDetector``.

Two public formats:

* ``d2`` - airsplay/py-bottom-up-attention ``faster_rcnn_from_caffe_attr.pkl``: a pickled dict of numpy
  arrays (read with the restricted unpickler; no class is ever instantiated). detectron2 order: the
  background is the LAST class column, box regression has no background rows, the RPN has one sigmoid
  logit per anchor with anchors ordered size-major, and the attribute head puts "no attribute" last.
* ``bua`` - MILVLG/bottom-up-attention.pytorch ``bua-caffe-frcn-r101-k10-100.pth`` (``torch.load`` with
  ``weights_only=True``): Caffe order (background first), 2-way softmax RPN objectness laid out as
  [A background | A foreground] channels, predictor names ``cls_embed``/``attr_linear1``/``attr_linear2``.

Both become vlkit's Caffe layout: background column first, ``fg - bg`` objectness logits (softmax over
two logits equals the sigmoid of their difference), anchors ratio-major. Every key is accounted for in
a ``ConversionReport``; ``strict`` refuses anything missing, unused or of the wrong shape.
"""
from __future__ import annotations

import os

import numpy as np
import torch
from torch import Tensor

from vlkit.released import ConversionReport, check_released
from vlkit.io import safe_pickle_load, torch_load_weights

_PRED = "roi_heads.box_predictor."
_RPN = "proposal_generator.rpn_head."
_BUA_RENAMES = {"cls_embed.": "cls_embedding.", "attr_linear1.": "fc_attr.", "attr_linear2.": "attr_score."}
_BN_STATS = ("running_mean", "running_var")


def read_checkpoint(path: str | os.PathLike) -> dict[str, Tensor]:
    """The flat ``name -> tensor`` dict of a ``.pkl`` (restricted unpickler) or ``.pth`` (weights_only)."""
    path = check_released(path, "detector checkpoint")
    if path.suffix == ".pkl":
        obj = safe_pickle_load(path)
    else:
        obj = torch_load_weights(path)
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or "blobs" in obj:
        raise ValueError(f"{path}: expected a dict of named arrays (detectron2 / bua state dict); Caffe2 'blobs' files are not supported")
    out = {}
    for k, v in obj.items():
        if not isinstance(v, (np.ndarray, Tensor)):
            raise ValueError(f"{path}: key {k!r} holds {type(v).__name__}, not an array")
        out[k[len("module."):] if k.startswith("module.") else k] = torch.as_tensor(np.asarray(v) if isinstance(v, np.ndarray) else v)
    return out


def _ignorable(key: str) -> bool:
    """Bookkeeping tensors some checkpoints carry: BN step counters, input normalisation, cached anchors."""
    return key.endswith("num_batches_tracked") or key in ("pixel_mean", "pixel_std") or ".anchor_generator." in key


def detect_format(state: dict[str, Tensor]) -> str:
    if f"{_PRED}attr_linear1.weight" in state or f"{_PRED}cls_embed.weight" in state:
        return "bua"
    if f"{_PRED}cls_score.weight" in state:
        return "d2"
    raise ValueError("not a bottom-up-attention checkpoint: no roi_heads.box_predictor.cls_score.weight")


def _rotate_last_first(t: Tensor) -> Tensor:
    return torch.cat([t[-1:], t[:-1]])


def _d2_anchor_order(num_scales: int, num_ratios: int) -> Tensor:
    """For vlkit anchor ``r * S + s`` (ratio-major), the detectron2 index ``s * R + r`` (size-major)."""
    return torch.tensor([s * num_ratios + r for r in range(num_ratios) for s in range(num_scales)])


def convert_state_dict(state: dict[str, Tensor], model: torch.nn.Module, source: str = "<state>") -> tuple[dict[str, Tensor], ConversionReport]:
    """Map a d2 / bua state dict onto ``model``'s keys and layout; returns (state_dict, report)."""
    cfg = model.cfg
    fmt = detect_format(state)
    report = ConversionReport(source=source, format=fmt)
    src = dict(state)
    for k in [k for k in src if _ignorable(k)]:
        src.pop(k)
        report.ignored.append(k)
    if fmt == "bua":
        for k in list(src):
            for old, new in _BUA_RENAMES.items():
                if k.startswith(_PRED + old):
                    nk = _PRED + new + k[len(_PRED + old):]
                    src[nk] = src.pop(k)
                    report.renamed.append((k, nk))
        obj = src.get(_RPN + "objectness_logits.weight")
        if obj is not None and obj.shape[0] == 2 * cfg.num_anchors:
            a = cfg.num_anchors
            for p in ("weight", "bias"):
                t = src[_RPN + f"objectness_logits.{p}"]
                src[_RPN + f"objectness_logits.{p}"] = t[a:] - t[:a]
            report.transformed.append("RPN objectness: 2-way softmax [bg | fg] -> sigmoid logit fg - bg")
    else:
        perm = _d2_anchor_order(len(cfg.anchor_scales), len(cfg.anchor_ratios))
        for p in ("weight", "bias"):
            k = _RPN + f"objectness_logits.{p}"
            if k in src and src[k].shape[0] == len(perm):
                src[k] = src[k][perm]
            k = _RPN + f"anchor_deltas.{p}"
            if k in src and src[k].shape[0] == 4 * len(perm):
                src[k] = src[k].reshape(len(perm), 4, *src[k].shape[1:])[perm].reshape(src[k].shape)
        report.transformed.append("RPN anchors: detectron2 size-major -> Caffe ratio-major order")
        for name in ("cls_score.weight", "cls_score.bias", "cls_embedding.weight", "attr_score.weight", "attr_score.bias"):
            if _PRED + name in src:
                src[_PRED + name] = _rotate_last_first(src[_PRED + name])
                report.transformed.append(f"{name}: background (last) -> column 0")
        for p in ("weight", "bias"):
            k = _PRED + f"bbox_pred.{p}"
            if k in src and src[k].shape[0] == 4 * (cfg.num_classes - 1):
                src[k] = torch.cat([src[k].new_zeros(4, *src[k].shape[1:]), src[k]])
                report.filled.append(f"bbox_pred.{p}: zero background regression rows")
    target = model.state_dict()
    # Caffe-converted norms may carry only scale and shift (detectron2 fills mean 0, var 1).
    for k in target:
        if k.endswith(_BN_STATS) and k not in src and k.rsplit(".", 1)[0] + ".weight" in src:
            src[k] = torch.zeros_like(target[k]) if k.endswith("running_mean") else torch.ones_like(target[k])
            report.filled.append(k)
    out = {}
    for k, v in target.items():
        if k not in src:
            report.missing.append(k)
        elif tuple(src[k].shape) != tuple(v.shape):
            report.mismatched.append((k, tuple(src[k].shape), tuple(v.shape)))
        else:
            out[k] = src[k].to(v.dtype)
    report.unexpected = sorted(set(src) - set(target))
    report.mapped = len(out)
    return out, report


def load_butd_checkpoint(model: torch.nn.Module, path: str | os.PathLike, strict: bool = True) -> ConversionReport:
    """Load ``faster_rcnn_from_caffe_attr.pkl`` or ``bua-caffe-frcn-r101-*.pth`` into ``model`` in place."""
    state, report = convert_state_dict(read_checkpoint(path), model, source=str(path))
    if strict and not report.ok:
        raise ValueError(f"{path}: checkpoint does not match the {model.cfg.name} detector\n{report}")
    model.load_state_dict(state, strict=strict)
    return report


__all__ = ["read_checkpoint", "detect_format", "convert_state_dict", "load_butd_checkpoint"]
