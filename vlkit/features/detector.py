"""Bottom-up-attention Faster R-CNN (Anderson et al. 2018, §3.1) on torchvision ops, no detectron2.

One implementation, two presets (official-code.md §4):

* ``butd_r101``: the Caffe Visual Genome detector. ResNet-101 C4 with the Caffe stem (max-pool pad 0,
  ceil), RPN on res4 (512 channels, 12 anchors 64-512 px, NMS 0.7, 6000 -> 300 proposals), RoIPool
  14x14, res5 with stride 1 and dilation 2, mean-pooled 2048-d features, 1601-way classifier
  (background first), class-specific box regression, attribute head (256-d embedding of the argmax
  class, 512 hidden, 401 attributes). Input BGR minus the Caffe means, shorter side 600, longer <= 1000.
* ``shapes``: a narrow ResNet-18-like C4 trunk of the same family trained on the shapes world
  (``scripts/train_shapes_detector.py``); its weights ship in ``vlkit/features/assets``.

Box conventions follow py-faster-rcnn (inclusive pixel boxes: width = x2 - x1 + 1, anchors centred at
``(stride - 1) / 2``); the legacy ``+1`` IoU of the Caffe NMS is obtained with ``torchvision.ops.nms``
on boxes whose far corner is moved by one pixel.

``extract`` applies the BUTD selection rule (``generate_tsv.py``): boxes are the proposals, a box's
``max_conf`` is its best class score over the classes 1.. for which it survives per-class NMS 0.3, keep
``max_conf >= 0.2`` and clamp the count to [10, 100] (or fixed 36). Rows come back sorted by
descending ``max_conf``. ``detect`` is standard Fast R-CNN inference (regressed boxes), used for mAP.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d, batched_nms, box_iou, nms, roi_pool

from vlkit.io import sha256_file

ASSETS = Path(__file__).resolve().parent / "assets"
CAFFE_PIXEL_MEAN_BGR = (102.9801, 115.9465, 122.7717)
_SCALE_CLAMP = math.log(1000.0 / 16)


@dataclass
class DetectorConfig:
    """Architecture, preprocessing and selection settings of a bottom-up-attention detector."""

    name: str = "butd_r101"
    # backbone (ResNet C4); channels double at every stage
    block: str = "bottleneck"  # "bottleneck" (ResNet-50/101) or "basic" (ResNet-18/34)
    stage_blocks: tuple[int, ...] = (3, 4, 23, 3)  # res2, res3, res4 (backbone), res5 (RoI head)
    stem_channels: int = 64
    res2_channels: int = 256
    res2_bottleneck: int = 64
    stride_in_1x1: bool = True  # MSRA/Caffe ResNet puts the stride in the first 1x1 conv
    norm: str = "frozen_bn"  # "frozen_bn" (inference / converted weights) or "bn" (training)
    res5_dilation: int = 2  # 2 -> res5 stride 1 and dilated conv2 (BUTD); 1 -> stride 2
    # RPN
    rpn_channels: int = 512
    anchor_scales: tuple[float, ...] = (4, 8, 16, 32)  # x feature stride (16)
    anchor_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)  # h / w
    rpn_nms_thresh: float = 0.7
    rpn_pre_nms_topk: int = 6000
    rpn_post_nms_topk: int = 300
    rpn_pre_nms_topk_train: int = 12000
    rpn_post_nms_topk_train: int = 2000
    rpn_min_size: float = 16.0  # in original-image pixels (scaled by the resize factor)
    # RoI head
    pooler_resolution: int = 14
    num_classes: int = 1601  # background first (Caffe order)
    num_attributes: int = 401  # index 0 = no attribute
    attr_embed_dim: int = 256
    attr_hidden: int = 512
    bbox_reg_weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
    # input
    pixel_mean: tuple[float, float, float] = CAFFE_PIXEL_MEAN_BGR
    pixel_std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    input_format: str = "BGR"  # channel order the network expects (images arrive as RGB)
    min_size: int = 600
    max_size: int = 1000
    # BUTD box selection
    test_nms: float = 0.3
    conf_thresh: float = 0.2
    min_boxes: int = 10
    max_boxes: int = 100
    # training (shapes preset)
    rpn_batch_per_image: int = 256
    roi_batch_per_image: int = 512
    roi_positive_fraction: float = 0.25
    attr_loss_weight: float = 0.5
    class_names: tuple[str, ...] = ()  # optional, background first
    attribute_names: tuple[str, ...] = ()  # optional, index 0 = no attribute

    feature_stride = 16

    @property
    def feature_dim(self) -> int:
        return self.res2_channels * 8

    @property
    def num_anchors(self) -> int:
        return len(self.anchor_scales) * len(self.anchor_ratios)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DetectorConfig":
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"DetectorConfig: unknown keys {unknown}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


PRESETS: dict[str, dict[str, Any]] = {
    "butd_r101": {},
    # trained by scripts/train_shapes_detector.py; classes / attributes are vlkit.data.shapes'
    # OBJECT_CLASSES (background first) and ATTRIBUTES (0 = no attribute); 128 px scenes run at 256
    "shapes": dict(
        name="shapes", block="basic", stage_blocks=(2, 2, 2, 1), stem_channels=16, res2_channels=32,
        res2_bottleneck=32, stride_in_1x1=False, norm="bn", rpn_channels=128, anchor_scales=(2, 3, 4, 6),
        rpn_pre_nms_topk=1000, rpn_post_nms_topk=100, rpn_pre_nms_topk_train=1000, rpn_post_nms_topk_train=200,
        rpn_min_size=4.0, pooler_resolution=7, num_classes=6, num_attributes=11, attr_embed_dim=32,
        attr_hidden=128, bbox_reg_weights=(10.0, 10.0, 5.0, 5.0), min_size=256, max_size=256, max_boxes=36,
        rpn_batch_per_image=128, roi_batch_per_image=32,
    ),
}


def preset(name: str, **overrides: Any) -> DetectorConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown detector preset {name!r}; choose from {sorted(PRESETS)}")
    return DetectorConfig(**{**PRESETS[name], **overrides})


# --------------------------------------------------------------------------- boxes and anchors


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


# --------------------------------------------------------------------------- network


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "frozen_bn":
        return FrozenBatchNorm2d(channels)
    if kind == "bn":
        return nn.BatchNorm2d(channels)
    raise ValueError(f"unknown norm {kind!r}; use 'frozen_bn' or 'bn'")


class ConvNorm(nn.Conv2d):
    """A bias-free conv carrying its norm (detectron2's key layout: ``conv.weight``, ``conv.norm.*``)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, dilation: int = 1, norm: str = "bn"):
        super().__init__(cin, cout, k, stride=stride, padding=dilation * (k // 2), dilation=dilation, bias=False)
        self.norm = _norm(norm, cout)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(super().forward(x))


class Bottleneck(nn.Module):
    def __init__(self, cin: int, cout: int, width: int, stride: int, dilation: int, cfg: DetectorConfig):
        super().__init__()
        s1, s3 = (stride, 1) if cfg.stride_in_1x1 else (1, stride)
        self.shortcut = ConvNorm(cin, cout, 1, stride, norm=cfg.norm) if cin != cout or stride != 1 else None
        self.conv1 = ConvNorm(cin, width, 1, s1, norm=cfg.norm)
        self.conv2 = ConvNorm(width, width, 3, s3, dilation, norm=cfg.norm)
        self.conv3 = ConvNorm(width, cout, 1, norm=cfg.norm)

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv3(F.relu(self.conv2(F.relu(self.conv1(x)))))
        return F.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, width: int, stride: int, dilation: int, cfg: DetectorConfig):
        super().__init__()
        self.shortcut = ConvNorm(cin, cout, 1, stride, norm=cfg.norm) if cin != cout or stride != 1 else None
        self.conv1 = ConvNorm(cin, cout, 3, stride, dilation, norm=cfg.norm)
        self.conv2 = ConvNorm(cout, cout, 3, 1, dilation, norm=cfg.norm)

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv2(F.relu(self.conv1(x)))
        return F.relu(out + (x if self.shortcut is None else self.shortcut(x)))


_BLOCKS = {"bottleneck": Bottleneck, "basic": BasicBlock}


def _stage(cfg: DetectorConfig, index: int, first_stride: int, dilation: int = 1) -> nn.Sequential:
    """ResNet stage ``index`` (0 = res2 ... 3 = res5)."""
    if cfg.block not in _BLOCKS:
        raise ValueError(f"unknown block {cfg.block!r}; use one of {sorted(_BLOCKS)}")
    cout = cfg.res2_channels * 2**index
    width = cfg.res2_bottleneck * 2**index
    cin = cfg.stem_channels if index == 0 else cout // 2
    blocks = []
    for i in range(cfg.stage_blocks[index]):
        blocks.append(_BLOCKS[cfg.block](cin if i == 0 else cout, cout, width, first_stride if i == 0 else 1, dilation, cfg))
    return nn.Sequential(*blocks)


class Stem(nn.Module):
    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.conv1 = ConvNorm(3, cfg.stem_channels, 7, 2, norm=cfg.norm)

    def forward(self, x: Tensor) -> Tensor:
        return F.max_pool2d(F.relu(self.conv1(x)), kernel_size=3, stride=2, padding=0, ceil_mode=True)


class Backbone(nn.Module):
    """Stem + res2..res4 (stride 16)."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.stem = Stem(cfg)
        self.res2 = _stage(cfg, 0, 1)
        self.res3 = _stage(cfg, 1, 2)
        self.res4 = _stage(cfg, 2, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.res4(self.res3(self.res2(self.stem(x))))


class RPNHead(nn.Module):
    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        cin = cfg.res2_channels * 4
        self.conv = nn.Conv2d(cin, cfg.rpn_channels, 3, padding=1)
        self.objectness_logits = nn.Conv2d(cfg.rpn_channels, cfg.num_anchors, 1)  # sigmoid (fg - bg of Caffe)
        self.anchor_deltas = nn.Conv2d(cfg.rpn_channels, cfg.num_anchors * 4, 1)
        for layer in (self.conv, self.objectness_logits, self.anchor_deltas):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Objectness logits [B, H*W*A] and deltas [B, H*W*A, 4], ordered (y, x, anchor)."""
        t = F.relu(self.conv(x))
        b, _, h, w = x.shape
        logits = self.objectness_logits(t).permute(0, 2, 3, 1).reshape(b, -1)
        deltas = self.anchor_deltas(t).view(b, -1, 4, h, w).permute(0, 3, 4, 1, 2).reshape(b, -1, 4)
        return logits, deltas


class RPN(nn.Module):
    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.cfg = cfg
        self.rpn_head = RPNHead(cfg)
        self.register_buffer(
            "cell_anchors", cell_anchors(cfg.feature_stride, cfg.anchor_scales, cfg.anchor_ratios), persistent=False
        )

    def proposals(self, logits: Tensor, deltas: Tensor, anchors: Tensor, size: tuple[int, int], scale: float) -> Tensor:
        """Caffe proposal layer for one image: decode, clip, drop small, top-k, NMS, top-k."""
        cfg = self.cfg
        pre, post = (
            (cfg.rpn_pre_nms_topk_train, cfg.rpn_post_nms_topk_train) if self.training
            else (cfg.rpn_pre_nms_topk, cfg.rpn_post_nms_topk)
        )
        boxes = clip_boxes(decode_boxes(deltas, anchors, (1.0, 1.0, 1.0, 1.0)), *size)
        min_size = cfg.rpn_min_size * scale
        big = ((boxes[:, 2] - boxes[:, 0] + 1) >= min_size) & ((boxes[:, 3] - boxes[:, 1] + 1) >= min_size)
        boxes, scores = boxes[big], logits[big]
        scores, idx = scores.topk(min(pre, scores.numel()))
        boxes = boxes[idx]
        keep = legacy_nms(boxes, scores, cfg.rpn_nms_thresh)[:post]
        return boxes[keep]


class BoxPredictor(nn.Module):
    """Classifier (background first), class-specific regression and the attribute head."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        d = cfg.feature_dim
        self.cls_score = nn.Linear(d, cfg.num_classes)
        self.bbox_pred = nn.Linear(d, cfg.num_classes * 4)
        self.cls_embedding = nn.Embedding(cfg.num_classes, cfg.attr_embed_dim)
        self.fc_attr = nn.Linear(d + cfg.attr_embed_dim, cfg.attr_hidden)
        self.attr_score = nn.Linear(cfg.attr_hidden, cfg.num_attributes)
        nn.init.normal_(self.cls_score.weight, std=0.01)
        nn.init.normal_(self.bbox_pred.weight, std=0.001)
        for layer in (self.cls_score, self.bbox_pred):
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor, classes: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Class logits, box deltas and attribute logits; the attribute head embeds ``classes``
        (ground truth while training) or the argmax over all classes, background included."""
        logits = self.cls_score(x)
        deltas = self.bbox_pred(x)
        emb = self.cls_embedding(logits.argmax(-1) if classes is None else classes)
        attr = self.attr_score(F.relu(self.fc_attr(torch.cat([x, emb], dim=-1))))
        return logits, deltas, attr


class RoIHeads(nn.Module):
    def __init__(self, cfg: DetectorConfig, roi_chunk: int = 256):
        super().__init__()
        self.cfg = cfg
        self.roi_chunk = roi_chunk
        self.res5 = _stage(cfg, 3, 1 if cfg.res5_dilation > 1 else 2, cfg.res5_dilation)
        self.box_predictor = BoxPredictor(cfg)

    def pooled_features(self, feats: Tensor, rois: list[Tensor]) -> Tensor:
        """RoIPool on the C4 map, res5, mean pooling: [sum(len(rois)), feature_dim]."""
        x = roi_pool(feats, rois, self.cfg.pooler_resolution, 1.0 / self.cfg.feature_stride)
        if self.training or x.shape[0] <= self.roi_chunk:
            return self.res5(x).mean(dim=(2, 3))
        return torch.cat([self.res5(c).mean(dim=(2, 3)) for c in x.split(self.roi_chunk)])


@dataclass
class Prepared:
    """Images resized and normalised for the network, all of one size."""

    tensor: Tensor  # [B, 3, H, W]
    scales: list[float]  # resize factor of each image
    sizes: list[tuple[int, int]]  # original (h, w)


class BottomUpDetector(nn.Module):
    """The BUTD Faster R-CNN: ``backbone`` (C4), ``proposal_generator`` (RPN), ``roi_heads`` (res5 + predictor)."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.cfg = cfg
        self.backbone = Backbone(cfg)
        self.proposal_generator = RPN(cfg)
        self.roi_heads = RoIHeads(cfg)
        self.register_buffer("pixel_mean", torch.tensor(cfg.pixel_mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(cfg.pixel_std).view(1, 3, 1, 1), persistent=False)
        self.provenance: dict[str, Any] = {"detector": cfg.name, "weights": "random-init", "weights_sha256": ""}

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    # ----------------------------------------------------------------- preprocessing
    def resize_scale(self, h: int, w: int) -> float:
        """Caffe ``_get_image_blob``: shorter side to ``min_size`` unless the longer one exceeds ``max_size``."""
        lo, hi = min(h, w), max(h, w)
        scale = self.cfg.min_size / lo
        if np.round(scale * hi) > self.cfg.max_size:
            scale = self.cfg.max_size / hi
        return float(scale)

    def prepare(self, images: Sequence[Any]) -> Prepared:
        """RGB images (PIL or HxWx3 uint8 arrays) of one resized size -> normalised network input."""
        tensors, scales, sizes = [], [], []
        for img in images:
            arr = _as_rgb_array(img)
            h, w = arr.shape[:2]
            s = self.resize_scale(h, w)
            x = torch.tensor(arr, device=self.device).permute(2, 0, 1)[None].float()
            if self.cfg.input_format == "BGR":
                x = x.flip(1)
            x = (x - self.pixel_mean) / self.pixel_std
            x = F.interpolate(x, size=(round(h * s), round(w * s)), mode="bilinear", align_corners=False)
            tensors.append(x)
            scales.append(s)
            sizes.append((h, w))
        shapes = {tuple(t.shape[-2:]) for t in tensors}
        if len(shapes) > 1:
            raise ValueError(f"prepare: images resize to different sizes {sorted(shapes)}; group them first")
        return Prepared(torch.cat(tensors), scales, sizes)

    # ----------------------------------------------------------------- forward pieces
    def proposals(self, prep: Prepared, logits: Tensor, deltas: Tensor, anchors: Tensor) -> list[Tensor]:
        size = tuple(prep.tensor.shape[-2:])
        return [
            self.proposal_generator.proposals(logits[i].detach(), deltas[i].detach(), anchors, size, prep.scales[i])
            for i in range(len(prep.scales))
        ]

    @torch.no_grad()
    def run(self, images: Sequence[Any], given_boxes: Sequence[Any] | None = None) -> list[dict[str, Tensor]]:
        """Raw per-image outputs: ``rois`` (original pixels), ``features``, ``cls_prob``, ``attr_prob``, ``deltas``.

        ``given_boxes`` (one [N, 4] array of original-pixel xyxy boxes per image) replaces the proposals.
        """
        prep = self.prepare(images)
        feats = self.backbone(prep.tensor)
        if given_boxes is None:
            logits, deltas, anchors = self.rpn_outputs(feats)
            rois = self.proposals(prep, logits.sigmoid(), deltas, anchors)
        else:
            if len(given_boxes) != len(prep.scales):
                raise ValueError(f"given_boxes has {len(given_boxes)} entries for {len(prep.scales)} images")
            rois = [
                torch.as_tensor(np.asarray(b, dtype=np.float32).reshape(-1, 4), device=self.device) * s
                for b, s in zip(given_boxes, prep.scales)
            ]
        pooled = self.roi_heads.pooled_features(feats, rois)
        logits, deltas, attr = self.roi_heads.box_predictor(pooled)
        out, start = [], 0
        for r, s in zip(rois, prep.scales):
            sl = slice(start, start + len(r))
            start += len(r)
            out.append({
                "rois": r / s, "features": pooled[sl], "cls_prob": logits[sl].softmax(-1),
                "attr_prob": attr[sl].softmax(-1), "deltas": deltas[sl], "scale": s,
            })
        for o, (h, w) in zip(out, prep.sizes):
            o["image_h"], o["image_w"] = h, w
        return out

    def rpn_outputs(self, feats: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits, deltas = self.proposal_generator.rpn_head(feats)
        anchors = grid_anchors(self.proposal_generator.cell_anchors, feats.shape[2], feats.shape[3], self.cfg.feature_stride)
        return logits, deltas, anchors

    # ----------------------------------------------------------------- public inference
    @torch.no_grad()
    def extract(
        self, images: Sequence[Any], given_boxes: Sequence[Any] | None = None, conf_thresh: float | None = None,
        min_boxes: int | None = None, max_boxes: int | None = None,
    ) -> list[dict[str, Any]]:
        """Region features per image with the BUTD selection rule (numpy outputs).

        Keys: ``features`` [N, D], ``boxes`` [N, 4] (original pixels, xyxy), ``image_h``, ``image_w``,
        ``cls_prob`` [N, C] (background first), ``attr_prob`` [N, A], ``conf`` [N] (``max_conf``),
        ``objects_id``/``objects_conf`` (argmax/max over the foreground columns, 0-based),
        ``attrs_id``/``attrs_conf`` (likewise over attributes 1..). With ``given_boxes`` every given box
        is kept in the given order and ``conf`` is its best foreground probability.
        """
        cfg = self.cfg
        conf_thresh = cfg.conf_thresh if conf_thresh is None else conf_thresh
        min_boxes = cfg.min_boxes if min_boxes is None else min_boxes
        max_boxes = cfg.max_boxes if max_boxes is None else max_boxes
        results = []
        for raw in self.run(images, given_boxes):
            if given_boxes is None:
                keep, max_conf = butd_select(raw["rois"], raw["cls_prob"], cfg.test_nms, conf_thresh, min_boxes, max_boxes)
            else:
                keep = torch.arange(len(raw["rois"]), device=self.device)
                max_conf = raw["cls_prob"][:, 1:].amax(-1)
            cls_prob, attr_prob = raw["cls_prob"][keep], raw["attr_prob"][keep]
            obj_conf, obj_id = cls_prob[:, 1:].max(-1)
            attr_conf, attr_id = attr_prob[:, 1:].max(-1)
            results.append(_numpy({
                "features": raw["features"][keep], "boxes": raw["rois"][keep], "image_h": raw["image_h"],
                "image_w": raw["image_w"], "cls_prob": cls_prob, "attr_prob": attr_prob, "conf": max_conf[keep],
                "objects_id": obj_id, "objects_conf": obj_conf, "attrs_id": attr_id, "attrs_conf": attr_conf,
            }))
        return results

    @torch.no_grad()
    def detect(
        self, images: Sequence[Any], score_thresh: float = 0.05, nms_thresh: float | None = None, max_dets: int = 100
    ) -> list[dict[str, np.ndarray]]:
        """Fast R-CNN detections (regressed class-specific boxes, per-class NMS): ``boxes``, ``scores``,
        ``labels`` (class index, background = 0 excluded), in original pixels."""
        nms_thresh = self.cfg.test_nms if nms_thresh is None else nms_thresh
        results = []
        for raw in self.run(images):
            r, c = raw["cls_prob"].shape
            boxes = decode_boxes(raw["deltas"], raw["rois"] * raw["scale"], self.cfg.bbox_reg_weights) / raw["scale"]
            boxes = clip_boxes(boxes, raw["image_h"], raw["image_w"]).view(r, c, 4)[:, 1:].reshape(-1, 4)
            scores = raw["cls_prob"][:, 1:].reshape(-1)
            labels = torch.arange(1, c, device=self.device).repeat(r)
            ok = scores > score_thresh
            boxes, scores, labels = boxes[ok], scores[ok], labels[ok]
            keep = class_nms(boxes, scores, labels, nms_thresh)[:max_dets]
            results.append(_numpy({"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]}))
        return results

    # ----------------------------------------------------------------- training
    def losses(self, images: Sequence[Any], targets: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
        """Faster R-CNN training losses for one same-size batch.

        ``targets[i]``: ``boxes`` [M, 4] original pixels, ``labels`` [M] (1..C-1), ``attributes`` [M, k]
        attribute ids padded with -1 (give an object without attributes id 0, "no attribute").
        """
        from torchvision.models.detection._utils import BalancedPositiveNegativeSampler, Matcher

        cfg = self.cfg
        prep = self.prepare(images)
        feats = self.backbone(prep.tensor)
        logits, deltas, anchors = self.rpn_outputs(feats)
        gts = [
            {k: torch.as_tensor(np.asarray(t[k]), device=self.device) for k in ("boxes", "labels", "attributes")}
            for t in targets
        ]
        for g, s in zip(gts, prep.scales):
            g["boxes"] = g["boxes"].float().reshape(-1, 4) * s
        # RPN: anchors with IoU >= 0.7 (or best for a gt) are positive, < 0.3 negative
        rpn_matcher = Matcher(0.7, 0.3, allow_low_quality_matches=True)
        rpn_sampler = BalancedPositiveNegativeSampler(cfg.rpn_batch_per_image, 0.5)
        labels, targets_d = [], []
        for g in gts:
            idx = rpn_matcher(box_iou(g["boxes"], anchors))
            lab = (idx >= 0).float()
            lab[idx == Matcher.BETWEEN_THRESHOLDS] = -1
            labels.append(lab)
            targets_d.append(encode_boxes(anchors, g["boxes"][idx.clamp(min=0)], (1.0, 1.0, 1.0, 1.0)))
        pos, neg = rpn_sampler(labels)
        pos, neg = torch.stack(pos).bool(), torch.stack(neg).bool()
        sampled = pos | neg
        n_rpn = max(int(sampled.sum()), 1)
        loss_rpn_cls = F.binary_cross_entropy_with_logits(logits[sampled], torch.stack(labels)[sampled], reduction="sum") / n_rpn
        loss_rpn_loc = F.smooth_l1_loss(deltas[pos], torch.stack(targets_d)[pos], beta=1 / 9, reduction="sum") / n_rpn
        # RoI head: proposals + gt boxes, IoU >= 0.5 foreground
        proposals = self.proposals(prep, logits.sigmoid(), deltas, anchors)
        roi_matcher = Matcher(0.5, 0.5, allow_low_quality_matches=False)
        roi_sampler = BalancedPositiveNegativeSampler(cfg.roi_batch_per_image, cfg.roi_positive_fraction)
        rois, roi_labels, roi_idx = [], [], []
        for p, g in zip(proposals, gts):
            p = torch.cat([p, g["boxes"]])
            idx = roi_matcher(box_iou(g["boxes"], p))
            lab = torch.where(idx >= 0, g["labels"][idx.clamp(min=0)], torch.zeros_like(idx))
            rois.append(p)
            roi_labels.append(lab)
            roi_idx.append(idx)
        pos_m, neg_m = roi_sampler(roi_labels)
        sel = [(pm | nm).nonzero().squeeze(1) for pm, nm in zip(pos_m, neg_m)]
        rois_s = [r[s] for r, s in zip(rois, sel)]
        labels_s = torch.cat([l[s] for l, s in zip(roi_labels, sel)])
        gt_boxes_s = torch.cat([g["boxes"][i[s].clamp(min=0)] for g, i, s in zip(gts, roi_idx, sel)])
        gt_attr_s = torch.cat([g["attributes"].reshape(len(g["boxes"]), -1)[i[s].clamp(min=0)] for g, i, s in zip(gts, roi_idx, sel)])
        pooled = self.roi_heads.pooled_features(feats, rois_s)
        cls_logits, box_deltas, attr_logits = self.roi_heads.box_predictor(pooled, classes=labels_s)
        fg = labels_s > 0
        n_roi = max(len(labels_s), 1)
        loss_cls = F.cross_entropy(cls_logits, labels_s)
        tgt = encode_boxes(torch.cat(rois_s)[fg], gt_boxes_s[fg], cfg.bbox_reg_weights)
        pred = box_deltas.view(len(labels_s), -1, 4)[fg, labels_s[fg]]
        loss_box = F.smooth_l1_loss(pred, tgt, beta=1.0, reduction="sum") / n_roi
        attr_t = gt_attr_s[fg]
        valid = attr_t >= 0
        rows = valid.nonzero()[:, 0]
        if len(rows):
            loss_attr = F.cross_entropy(attr_logits[fg][rows], attr_t[valid].long())
        else:
            loss_attr = attr_logits.sum() * 0.0
        return {
            "loss_rpn_cls": loss_rpn_cls, "loss_rpn_loc": loss_rpn_loc, "loss_cls": loss_cls,
            "loss_box_reg": loss_box, "loss_attr": cfg.attr_loss_weight * loss_attr,
        }


# --------------------------------------------------------------------------- evaluation


def average_precision(
    detections: Sequence[dict[str, Any]], ground_truths: Sequence[dict[str, Any]], iou_thresh: float = 0.5
) -> dict[int, float]:
    """Per-class AP at ``iou_thresh`` (PASCAL VOC all-point interpolation), for classes with ground truth.

    ``detections[i]``: ``boxes`` [D, 4], ``scores`` [D], ``labels`` [D]; ``ground_truths[i]``: ``boxes``,
    ``labels``. Detections are taken by descending score; one is a true positive when its best-overlapping
    unmatched ground truth of its class has IoU >= ``iou_thresh`` (as COCO). mAP = mean of the values.
    """
    if len(detections) != len(ground_truths):
        raise ValueError(f"{len(detections)} detection lists for {len(ground_truths)} images")
    classes = sorted({int(c) for g in ground_truths for c in np.asarray(g["labels"]).reshape(-1)})
    aps = {}
    for c in classes:
        scored, n_gt = [], 0
        for img, (det, gt) in enumerate(zip(detections, ground_truths)):
            gmask = np.asarray(gt["labels"]).reshape(-1) == c
            n_gt += int(gmask.sum())
            dmask = np.asarray(det["labels"]).reshape(-1) == c
            dboxes = torch.as_tensor(np.asarray(det["boxes"], dtype=np.float32).reshape(-1, 4)[dmask])
            gboxes = torch.as_tensor(np.asarray(gt["boxes"], dtype=np.float32).reshape(-1, 4)[gmask])
            ious = box_iou(dboxes, gboxes).numpy() if len(dboxes) and len(gboxes) else np.zeros((len(dboxes), len(gboxes)))
            for s, row in zip(np.asarray(det["scores"]).reshape(-1)[dmask], ious):
                scored.append((float(s), img, row))
        scored.sort(key=lambda t: -t[0])
        matched: dict[int, set[int]] = {}
        tp = np.zeros(len(scored))
        for k, (_, img, row) in enumerate(scored):
            taken = matched.setdefault(img, set())
            free = [j for j in np.argsort(-row) if row[j] >= iou_thresh and j not in taken]
            if free:
                taken.add(int(free[0]))
                tp[k] = 1
        ctp = np.cumsum(tp)
        recall = ctp / max(n_gt, 1)
        precision = ctp / np.arange(1, len(scored) + 1)
        mrec = np.concatenate([[0.0], recall, [1.0]])
        mpre = np.concatenate([[0.0], precision, [0.0]])
        mpre = np.maximum.accumulate(mpre[::-1])[::-1]
        steps = np.nonzero(mrec[1:] != mrec[:-1])[0]
        aps[c] = float(np.sum((mrec[steps + 1] - mrec[steps]) * mpre[steps + 1]))
    return aps


# --------------------------------------------------------------------------- helpers


def _as_rgb_array(img: Any) -> np.ndarray:
    """PIL image (any mode), path, or HxWx3 uint8 RGB array -> HxWx3 uint8 RGB array."""
    if isinstance(img, (str, os.PathLike)):
        from PIL import Image

        with Image.open(img) as im:
            return np.asarray(im.convert("RGB"))
    if hasattr(img, "convert"):
        return np.asarray(img.convert("RGB"))
    arr = np.asarray(img)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"expected an HxWx3 RGB image, got an array of shape {arr.shape}")
    return arr.astype(np.uint8, copy=False)


def _numpy(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().float().cpu().numpy() if isinstance(v, Tensor) and v.is_floating_point()
            else v.cpu().numpy() if isinstance(v, Tensor) else v for k, v in d.items()}


def save_detector(
    model: BottomUpDetector, directory: str | os.PathLike, name: str, meta: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write ``<name>.safetensors`` (floats as ``dtype``) and ``<name>.json`` (config + ``meta``) atomically;
    returns the json path."""
    from safetensors.torch import save_file

    from vlkit.io import atomic_path, atomic_write_text

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
            from vlkit.convert.detector import load_butd_checkpoint

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


def extract_features(
    images: Iterable[tuple[str, Any]], out: str | os.PathLike, detector: str | BottomUpDetector = "shapes",
    weights: str | os.PathLike | None = None, batch_size: int = 8, device: str = "cpu",
    min_boxes: int | None = None, max_boxes: int | None = None, conf_th: float | None = None,
    resume: bool = True, dtype: str = "float16", progress: bool = True, total: int | None = None,
) -> Path:
    """Extract region features of ``(image_id, image)`` pairs into the h5 store ``out``.

    ``image`` is a PIL image, an RGB uint8 array or a path (opened only when needed). Images already in
    the store (or in an interrupted run's completed shards) are skipped when ``resume`` is true.
    Batches group images of the same resized size, so batching never pads (features equal batch 1).
    """
    from tqdm.auto import tqdm

    from vlkit.features.store import FeatureStoreWriter

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = detector if isinstance(detector, BottomUpDetector) else load_detector(detector, weights, device=device)
    model = model.to(device).eval()
    cfg = model.cfg
    sel = {
        "conf_th": cfg.conf_thresh if conf_th is None else conf_th,
        "min_boxes": cfg.min_boxes if min_boxes is None else min_boxes,
        "max_boxes": cfg.max_boxes if max_boxes is None else max_boxes,
    }
    provenance = {
        **model.provenance, **sel, "nms": cfg.test_nms, "min_size": cfg.min_size, "max_size": cfg.max_size,
        "input_format": cfg.input_format, "pixel_mean": list(cfg.pixel_mean), "pixel_std": list(cfg.pixel_std),
        "box_source": "RPN proposals kept by the BUTD rule",
    }
    if total is None and hasattr(images, "__len__"):
        total = len(images)  # type: ignore[arg-type]
    with FeatureStoreWriter(out, provenance=provenance, resume=resume, dtype=dtype) as writer:
        bar = tqdm(total=total, desc=f"extract {Path(out).name}", unit="img", disable=not progress)
        pending: dict[tuple[int, int], list[tuple[str, np.ndarray]]] = {}

        def run(key: tuple[int, int]) -> None:
            batch = pending.pop(key)
            outs = model.extract([a for _, a in batch], conf_thresh=sel["conf_th"], min_boxes=sel["min_boxes"], max_boxes=sel["max_boxes"])
            for (image_id, _), o in zip(batch, outs):
                writer.add(image_id, **o)
            bar.update(len(batch))

        for image_id, image in images:
            image_id = str(image_id)
            if image_id in writer.done_ids:
                bar.update(1)
                continue
            try:
                arr = _as_rgb_array(image)
            except Exception as e:  # noqa: BLE001 - re-raised with the id
                raise ValueError(f"image {image_id!r}: cannot read ({e})") from e
            h, w = arr.shape[:2]
            s = model.resize_scale(h, w)
            key = (round(h * s), round(w * s))
            pending.setdefault(key, []).append((image_id, arr))
            if len(pending[key]) >= batch_size:
                run(key)
            elif sum(map(len, pending.values())) >= 4 * batch_size:  # bound memory with many sizes
                run(max(pending, key=lambda k: len(pending[k])))
        for key in list(pending):
            run(key)
        bar.close()
    return Path(out)
