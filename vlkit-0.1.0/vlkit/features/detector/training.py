"""Training the detector: the Faster R-CNN losses (RPN objectness and boxes, RoI classes, boxes and
attributes) of one batch, for ``scripts/train_shapes_detector.py``."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import box_iou

from vlkit.features.detector.boxes import encode_boxes
from vlkit.features.detector.network import BottomUpDetector


def losses(model: BottomUpDetector, images: Sequence[Any], targets: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
    """Faster R-CNN training losses for one same-size batch.

    ``targets[i]``: ``boxes`` [M, 4] original pixels, ``labels`` [M] (1..C-1), ``attributes`` [M, k]
    attribute ids padded with -1 (give an object without attributes id 0, "no attribute").
    """
    from torchvision.models.detection._utils import BalancedPositiveNegativeSampler, Matcher

    cfg = model.cfg
    prep = model.prepare(images)
    feats = model.backbone(prep.tensor)
    logits, deltas, anchors = model.rpn_outputs(feats)
    gts = [
        {k: torch.as_tensor(np.asarray(t[k]), device=model.device) for k in ("boxes", "labels", "attributes")}
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
    proposals = model.proposals(prep, logits.sigmoid(), deltas, anchors)
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
    pooled = model.roi_heads.pooled_features(feats, rois_s)
    cls_logits, box_deltas, attr_logits = model.roi_heads.box_predictor(pooled, classes=labels_s)
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
