"""Evaluating the detector: per-class average precision (PASCAL VOC all-point interpolation)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torchvision.ops import box_iou


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
