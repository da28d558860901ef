"""The detector network: its config and presets, the ResNet C4 trunk, RPN, RoI heads, and the
`BottomUpDetector` with preprocessing and inference (``run``, ``extract`` with the BUTD rule, ``detect``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d, roi_pool

from vlkit.features.detector.boxes import (butd_select, cell_anchors, class_nms, clip_boxes, decode_boxes,
                                           grid_anchors, legacy_nms)
from vlkit.shapes_vocabulary import ATTRIBUTES, OBJECT_CLASSES
from vlkit.validate import rgb_array

CAFFE_PIXEL_MEAN_BGR = (102.9801, 115.9465, 122.7717)


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
    # trained by scripts/train_shapes_detector.py; classes / attributes are the shapes world's
    # OBJECT_CLASSES (background first) and ATTRIBUTES (0 = no attribute); 128 px scenes run at 256
    "shapes": dict(
        name="shapes", block="basic", stage_blocks=(2, 2, 2, 1), stem_channels=16, res2_channels=32,
        res2_bottleneck=32, stride_in_1x1=False, norm="bn", rpn_channels=128, anchor_scales=(2, 3, 4, 6),
        rpn_pre_nms_topk=1000, rpn_post_nms_topk=100, rpn_pre_nms_topk_train=1000, rpn_post_nms_topk_train=200,
        rpn_min_size=4.0, pooler_resolution=7, num_classes=len(OBJECT_CLASSES), num_attributes=len(ATTRIBUTES), attr_embed_dim=32,
        attr_hidden=128, bbox_reg_weights=(10.0, 10.0, 5.0, 5.0), min_size=256, max_size=256, max_boxes=36,
        rpn_batch_per_image=128, roi_batch_per_image=32,
    ),
}


def preset(name: str, **overrides: Any) -> DetectorConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown detector preset {name!r}; choose from {sorted(PRESETS)}")
    return DetectorConfig(**{**PRESETS[name], **overrides})


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "frozen_bn":
        return FrozenBatchNorm2d(channels)
    if kind == "bn":
        return nn.BatchNorm2d(channels)
    raise ValueError(f"unknown norm {kind!r}; use 'frozen_bn' or 'bn'")


class ConvNorm(nn.Conv2d):
    """A bias-free conv carrying its norm (detectron2's key layout: ``conv.weight``, ``conv.norm.*``).

    At inference (eval mode, frozen or eval-mode batch norm) the norm is folded into the convolution: one
    conv with ``weight * scale`` and bias ``shift`` instead of a conv and a pass over its output; the folded
    weight takes the input's memory format (channels-last inputs run oneDNN's NHWC kernels)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, dilation: int = 1, norm: str = "bn"):
        super().__init__(cin, cout, k, stride=stride, padding=dilation * (k // 2), dilation=dilation, bias=False)
        self.norm = _norm(norm, cout)

    def folded(self) -> tuple[Tensor, Tensor]:
        """(weight, bias) of the conv with its norm folded in (eval-mode statistics)."""
        n = self.norm
        scale = n.weight * (n.running_var + n.eps).rsqrt()
        return self.weight * scale.view(-1, 1, 1, 1), n.bias - n.running_mean * scale

    def forward(self, x: Tensor) -> Tensor:
        if self.training or self.norm.training or not hasattr(self.norm, "running_var") or \
                self.norm.running_var is None:
            return self.norm(super().forward(x))
        weight, bias = self.folded()
        if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
            weight = weight.contiguous(memory_format=torch.channels_last)
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)


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
        """RoIPool on the C4 map, res5, mean pooling: [sum(len(rois)), feature_dim]; the RoIs of every
        image run through res5 together, in chunks of ``roi_chunk``, in the memory format of ``feats``."""
        # torchvision's RoIPool has no bfloat16 kernel: pool a bf16 (autocast) map in fp32
        pool_in = feats.float() if feats.dtype == torch.bfloat16 else feats
        x = roi_pool(pool_in, rois, self.cfg.pooler_resolution, 1.0 / self.cfg.feature_stride)
        if feats.is_contiguous(memory_format=torch.channels_last) and not feats.is_contiguous():
            x = x.contiguous(memory_format=torch.channels_last)
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

    # inference runs channels-last (NHWC): oneDNN's and cuDNN's fast convolution layout; False: NCHW
    channels_last = True

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    def layout(self, x: Tensor) -> Tensor:
        """The network input in the inference memory format (`channels_last`)."""
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last and not self.training else x

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
        feats = self.backbone(self.layout(prep.tensor))
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
        logits, deltas, attr = (t.float() for t in self.roi_heads.box_predictor(pooled))
        pooled = pooled.float()
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
        logits, deltas = (t.float() for t in self.proposal_generator.rpn_head(feats))  # boxes in fp32 under autocast
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


def _as_rgb_array(img: Any) -> np.ndarray:
    """PIL image (any mode), path, or HxWx3 uint8 RGB array -> HxWx3 uint8 RGB array (`vlkit.validate.rgb_array`:
    EXIF orientation applied, 16-bit / palette / alpha / CMYK images converted, bad files refused)."""
    return rgb_array(img)


def _numpy(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().float().cpu().numpy() if isinstance(v, Tensor) and v.is_floating_point()
            else v.cpu().numpy() if isinstance(v, Tensor) else v for k, v in d.items()}
