"""Box operations of the detector: anchors, py-faster-rcnn box coding (inclusive pixel boxes), the Caffe
``+1`` NMS and the BUTD region selection rule."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import batched_nms, nms

_SCALE_CLAMP = math.log(1000.0 / 16)


def cell_anchors(stride: int, scales: Sequence[float], ratios: Sequence[float]) -> Tensor:
    """py-faster-rcnn ``generate_anchors``: ratio-major then scale, centred on ``(stride-1)/2``."""
    ctr = (stride - 1) / 2.0
    out = []
    for r in ratios:
        ws = np.round(np.sqrt(stride * stride / r))
        hs = np.round(ws * r)
        for s in scales:
            w, h = ws * s, hs * s
            out.append([ctr - 0.5 * (w - 1), ctr - 0.5 * (h - 1), ctr + 0.5 * (w - 1), ctr + 0.5 * (h - 1)])
    return torch.tensor(out, dtype=torch.float32)


def grid_anchors(cell: Tensor, height: int, width: int, stride: int) -> Tensor:
    """All anchors of an ``height x width`` map, ordered (y, x, anchor) like the Caffe RPN."""
    ys = torch.arange(height, dtype=cell.dtype, device=cell.device) * stride
    xs = torch.arange(width, dtype=cell.dtype, device=cell.device) * stride
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    shifts = torch.stack([xx, yy, xx, yy], dim=-1).reshape(-1, 1, 4)
    return (shifts + cell.to(shifts.device)[None]).reshape(-1, 4)


def _widths_centres(boxes: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    w = boxes[:, 2] - boxes[:, 0] + 1.0
    h = boxes[:, 3] - boxes[:, 1] + 1.0
    return w, h, boxes[:, 0] + 0.5 * w, boxes[:, 1] + 0.5 * h


def encode_boxes(reference: Tensor, target: Tensor, weights: Sequence[float]) -> Tensor:
    """Regression targets (dx, dy, dw, dh) taking ``reference`` boxes to ``target`` (py-faster-rcnn)."""
    rw, rh, rx, ry = _widths_centres(reference)
    tw, th, tx, ty = _widths_centres(target)
    wx, wy, ww, wh = weights
    return torch.stack(
        [wx * (tx - rx) / rw, wy * (ty - ry) / rh, ww * torch.log(tw / rw), wh * torch.log(th / rh)], dim=1
    )


def decode_boxes(deltas: Tensor, boxes: Tensor, weights: Sequence[float]) -> Tensor:
    """Apply ``deltas`` [R, K*4] to ``boxes`` [R, 4]; returns [R, K*4] (py-faster-rcnn ``bbox_transform_inv``)."""
    w, h, cx, cy = _widths_centres(boxes.to(deltas.dtype))
    wx, wy, ww, wh = weights
    dx, dy = deltas[:, 0::4] / wx, deltas[:, 1::4] / wy
    dw = (deltas[:, 2::4] / ww).clamp(max=_SCALE_CLAMP)
    dh = (deltas[:, 3::4] / wh).clamp(max=_SCALE_CLAMP)
    pcx, pcy = dx * w[:, None] + cx[:, None], dy * h[:, None] + cy[:, None]
    pw, ph = torch.exp(dw) * w[:, None], torch.exp(dh) * h[:, None]
    out = torch.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph], dim=2)
    return out.reshape(deltas.shape)


def clip_boxes(boxes: Tensor, height: float, width: float) -> Tensor:
    """Clip [..., 4k] boxes to the inclusive pixel range [0, w-1] x [0, h-1]."""
    out = boxes.clone()
    out[..., 0::2] = out[..., 0::2].clamp(0, width - 1)
    out[..., 1::2] = out[..., 1::2].clamp(0, height - 1)
    return out


def _legacy(boxes: Tensor) -> Tensor:
    """Boxes whose standard IoU equals the Caffe ``+1`` IoU of ``boxes``."""
    return boxes + boxes.new_tensor([0.0, 0.0, 1.0, 1.0])


def legacy_nms(boxes: Tensor, scores: Tensor, thresh: float) -> Tensor:
    return nms(_legacy(boxes), scores, thresh)


def class_nms(boxes: Tensor, scores: Tensor, classes: Tensor, thresh: float) -> Tensor:
    """Per-class legacy NMS; indices of the kept entries (a loop over classes when there are many)."""
    if scores.numel() <= 4000:
        return batched_nms(_legacy(boxes), scores, classes, thresh)
    order = torch.argsort(classes, stable=True)
    counts = torch.unique_consecutive(classes[order], return_counts=True)[1].tolist()
    keep = torch.cat([idx[legacy_nms(boxes[idx], scores[idx], thresh)] for idx in order.split(counts)])
    return keep[torch.argsort(scores[keep], descending=True, stable=True)]


def butd_select(
    boxes: Tensor, cls_prob: Tensor, nms_thresh: float = 0.3, conf_thresh: float = 0.2,
    min_boxes: int = 10, max_boxes: int = 100,
) -> tuple[Tensor, Tensor]:
    """BUTD ``get_detections_from_im``: indices of the kept boxes (by descending ``max_conf``) and ``max_conf``.

    ``max_conf[i]`` is the best score of box ``i`` over the foreground classes for which it survives
    per-class NMS; boxes with ``max_conf >= conf_thresh`` are kept, clamped to [min_boxes, max_boxes].
    Exact shortcut: NMS among entries scoring >= tau is unaffected by lower entries, so ``max_conf`` is
    exact wherever it is >= tau; tau drops towards 0 until ``min_boxes`` boxes reach it. ``max_conf``
    of unselected boxes below the final tau is reported as 0.
    """
    if min_boxes > max_boxes:
        raise ValueError(f"min_boxes ({min_boxes}) must not exceed max_boxes ({max_boxes})")
    r, c = cls_prob.shape
    scores = cls_prob[:, 1:]
    for tau in sorted({min(conf_thresh, t) for t in (conf_thresh, 0.01, 0.0)}, reverse=True):
        rows, cols = (scores >= tau).nonzero(as_tuple=True) if tau > 0 else (None, None)
        if rows is None:
            rows = torch.arange(r, device=boxes.device).repeat_interleave(c - 1)
            cols = torch.arange(c - 1, device=boxes.device).repeat(r)
        vals = scores[rows, cols]
        keep = class_nms(boxes[rows], vals, cols, nms_thresh)
        max_conf = torch.zeros(r, dtype=cls_prob.dtype, device=cls_prob.device)
        max_conf = max_conf.scatter_reduce(0, rows[keep], vals[keep], reduce="amax")
        if tau <= 0 or int((max_conf >= tau).sum()) >= min(min_boxes, r):
            break
    order = torch.sort(max_conf, descending=True, stable=True).indices
    n = int((max_conf >= conf_thresh).sum())
    n = min(max(n, min_boxes), max_boxes, r)
    return order[:n], max_conf
