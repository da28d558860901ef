"""Referring expressions (RefCOCO / RefCOCO+ / RefCOCOg style): pick the image region an expression
refers to. Region families only: the candidates are the image's detected regions (the feature
store's boxes).

The family's head (a `vlkit.models.heads.RegionScorer`) scores every candidate region; padded
regions get -10000. Its loss, by name:

- ``bce`` (ViLBERT ``task_utils.py`` V-logit): BCE with logits against each region's IoU with the
  referred box where IoU >= 0.5, else 0 (the official soft targets; ``labels="binary"`` gives the
  paper's 0/1 labels), summed over regions, averaged over the batch (``loss.mean() * num_regions``).
- ``ce`` (UNITER ``model/re.py``, ``train_re.py``): cross-entropy toward the region with the highest
  IoU >= 0.5 with the referred box (expressions with no such region are skipped), summed over the batch.

The official ViLBERT dataset also adds the ground-truth boxes to the training candidates and keeps its
[IMG] token (the whole image) as a candidate; here the candidates are the detected regions only.

Accuracy: IoU >= 0.5 between the chosen region's box (normalised box x the annotation's image size)
and the referred box. ``evaluate`` also reports the random-region baseline (expected accuracy of a
uniform pick among the candidates) and the upper bound (share of expressions with any candidate at
IoU >= 0.5).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from vlkit.data import formats
from vlkit.data.pairs import ImageTextPairs
from vlkit.models.base import VLModel
from vlkit.models.layers import MASK_VALUE
from vlkit.models.recipe import recipe_of
from vlkit.registry import register_task
from vlkit.tasks.base import IncompatibleTask, Task, TaskData, eval_batches, gather, task_source, world_needed
from vlkit.tasks.metrics import IOU_BOXES, IOU_COMPARISONS, REFEXP_DEFAULT, refexp_accuracy, refexp_hits, refexp_iou
from vlkit.types import LossOutput, VLBatch
from vlkit.validate import DataError, box_problems

__all__ = ["IncompatibleTask", "LOSSES", "RefExp", "region_ious"]

IOU_THRESHOLD = 0.5
LOSSES = ("bce", "ce")


def region_ious(batch: VLBatch, boxes: str = "continuous") -> Tensor:
    """IoU [B, K] of every candidate region with the referred box (0 at padded regions), under the box
    convention ``boxes`` (`vlkit.tasks.metrics.refexp_iou`).

    Region boxes are normalised xyxy; they are scaled by ``targets["image_hw"]`` (h, w), the size
    the referred box ``targets["ref_box"]`` (xyxy pixels) is given in.
    """
    if not batch.has_regions:
        raise ValueError("refexp: the batch has no regions (RefExp scores the detected regions of region models)")
    for key in ("ref_box", "image_hw"):
        if key not in batch.targets:
            raise KeyError(f"refexp: batch.targets lacks {key!r} (build the data with RefExp.build_data)")
    b, k = batch.region_boxes.shape[:2]
    h, w = batch.targets["image_hw"].to(batch.region_boxes).unbind(-1)
    scale = torch.stack([w, h, w, h], -1)[:, None, :]
    regions = (batch.region_boxes * scale).reshape(-1, 4)
    ref = batch.targets["ref_box"].to(regions)[:, None, :].expand(b, k, 4).reshape(-1, 4)
    return refexp_iou(regions, ref, boxes).view(b, k).to(regions) * batch.region_mask.to(regions)


def check_ref_boxes(refs: list[Mapping[str, Any]], where: Any) -> None:
    """`DataError` listing every referred box (xyxy px) that is not finite, not ordered or outside its image
    (``image_size``: h, w): such a box would be scored (IoU 0) instead of refused."""
    bad = [f"ref {r['id']!r} (image {r['image_id']!r}): {'; '.join(problems)}" for r in refs
           if (problems := box_problems([r["bbox"]], *r["image_size"]))]
    if bad:
        more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise DataError(f"refexp data {where}: {len(bad)} referred box(es) do not fit their image: "
                        f"{'; '.join(bad[:5])}{more}")


def _refexp_targets(row: Mapping[str, Any]) -> dict[str, Tensor]:
    return {"ref_box": torch.tensor(row["ref_box"], dtype=torch.float32),
            "image_hw": torch.tensor(row["image_hw"], dtype=torch.float32)}


@register_task("refexp")
class RefExp(Task):
    """Per-region scoring with the family's region head and its loss (``loss``: ``bce`` | ``ce``).

    ``labels``: the BCE targets, ``iou`` (ViLBERT's official soft IoU) or ``binary`` (paper); ``mlp``:
    the depth of a head that offers one (UNITER ``re_output``: 2 in the official RefCOCO+ config, 1 is
    the code default); ``head``: one of the family's RefExp heads; ``task_id``: the model's task input
    (ViLBERT's task token, default its RefCOCO+ id). ``iou_boxes`` / ``iou_comparison``: the hit rule
    `evaluate` scores with (`vlkit.tasks.metrics.IOU_BOXES`, ``>=`` | ``>``); by default the family's
    official evaluation (its recipe's ``refexp``, `vlkit.models.recipe.Recipe`: ViLBERT ``plus_one`` and ``>``,
    UNITER ``uniter`` and ``>``), else ``continuous`` and ``>=``. Training targets keep plain IoU >= 0.5.
    """

    name = "refexp"

    def __init__(self, model: VLModel, labels: str = "iou", mlp: int = 2, loss: str | None = None,
                 head: str | None = None, task_id: int | None = None, iou_boxes: str | None = None,
                 iou_comparison: str | None = None):
        self.check(model)
        super().__init__(model)
        official = recipe_of(model).refexp or REFEXP_DEFAULT
        self.iou_boxes, self.iou_comparison = iou_boxes or official[0], iou_comparison or official[1]
        if self.iou_boxes not in IOU_BOXES or self.iou_comparison not in IOU_COMPARISONS:
            raise ValueError(f"refexp: iou_boxes must be one of {', '.join(IOU_BOXES)} and iou_comparison one of "
                             f"{', '.join(IOU_COMPARISONS)}; got {self.iou_boxes!r}, {self.iou_comparison!r}")
        if labels not in ("iou", "binary") or mlp not in (1, 2):
            raise ValueError(f"refexp: labels must be 'iou' or 'binary' and mlp 1 or 2; got {labels!r}, {mlp!r}")
        cls = self.head_class(head)
        self.labels, self.loss_kind = labels, loss or cls.loss
        self.task_id = None if task_id is None else int(task_id)
        if self.loss_kind not in LOSSES:
            raise ValueError(f"refexp: unknown loss {self.loss_kind!r}; choose one of {', '.join(LOSSES)}")
        self.install_head(cls(model, mlp))

    @classmethod
    def check(cls, model: VLModel | type[VLModel]) -> None:
        if model.image_input != "regions":
            raise IncompatibleTask(
                f"refexp: {model.family} takes {model.image_input}, not region proposals, so there are no candidate "
                "boxes to score; RefExp needs a region family")

    def region_scores(self, batch: VLBatch) -> Tensor:
        """Scores [B, K] of the candidate regions (padded regions at -10000)."""
        out = self.model(batch, **self.model.task_inputs(self.name, batch, self.task_id))
        return self.task_head(out).masked_fill(~out.region_mask.bool(), MASK_VALUE)

    def forward(self, batch: VLBatch, step: int = 0, micro_step: int | None = None) -> LossOutput:
        scores = self.region_scores(batch)
        ious = region_ious(batch)
        mask = batch.region_mask.bool()
        chosen_iou = ious.gather(1, scores.argmax(1, keepdim=True)).squeeze(1)
        metrics: dict[str, Any] = {"acc": (chosen_iou >= IOU_THRESHOLD).float().mean()}
        if self.loss_kind == "bce":
            hit = ious >= IOU_THRESHOLD
            target = torch.where(hit, ious if self.labels == "iou" else torch.ones_like(ious), torch.zeros_like(ious))
            bce = F.binary_cross_entropy_with_logits(scores, target, reduction="none").masked_fill(~mask, 0.0)
            loss = bce.sum() / len(scores)
        else:
            best_iou, best = ious.max(1)
            target = best.masked_fill(best_iou < IOU_THRESHOLD, -100)
            loss = F.cross_entropy(scores, target, ignore_index=-100, reduction="none").sum()
            metrics["with_target"] = (target >= 0).float().mean()
        return LossOutput(loss, metrics)

    def predict(self, batch: VLBatch) -> dict[str, Any]:
        """``region`` [B] (index of the chosen candidate), ``box`` [B, 4] (its xyxy box in pixels of
        the annotation's image size) and ``scores`` [B, K]."""
        with torch.no_grad():
            scores = self.region_scores(batch)
        region = scores.argmax(1)
        h, w = batch.targets["image_hw"].to(batch.region_boxes).unbind(-1)
        box = batch.region_boxes[torch.arange(len(region)), region] * torch.stack([w, h, w, h], -1)
        return {"region": region, "box": box, "scores": scores}

    def evaluate(self, data: Any, batch_size: int = 64) -> dict[str, float]:
        """``refexp`` (accuracy: the chosen box hits the target under the task's IoU rule), ``random_box``
        (expected accuracy of a uniform pick among the candidates), ``upper_bound`` (share with any
        candidate that hits), ``n``; the same rule throughout."""
        loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False, collate_fn=data.collator())
        boxes, refs, random_box, reachable = [], [], [], []
        for batch in eval_batches(self, loader, "refexp"):
            boxes.append(self.predict(batch)["box"].float().cpu())
            refs.append(batch.targets["ref_box"].float().cpu())
            hit = self.candidate_hits(batch).float().cpu()
            random_box.append(hit.sum(1) / batch.region_mask.sum(1).clamp(min=1).float().cpu())
            reachable.append(hit.amax(1))
        return {"refexp": refexp_accuracy(gather(boxes), gather(refs), IOU_THRESHOLD, self.iou_boxes,
                                          self.iou_comparison),
                "random_box": gather(random_box).mean().item(), "upper_bound": gather(reachable).mean().item(),
                "n": float(len(gather(refs)))}

    def candidate_hits(self, batch: VLBatch) -> Tensor:
        """Bool [B, K]: each candidate region hits the referred box under the task's IoU rule (False at padding)."""
        hits = refexp_hits(region_ious(batch, self.iou_boxes), IOU_THRESHOLD, self.iou_comparison)
        return hits & batch.region_mask.bool()

    def example_batch(self, batch_size: int, text_len: int, num_regions: int, values: bool = True) -> VLBatch:
        batch = super().example_batch(batch_size, text_len, num_regions, values)
        hw = torch.full((batch_size, 2), 100.0)
        return batch.replace(targets={"image_hw": hw, "ref_box": torch.tensor([10.0, 10.0, 60.0, 60.0]).repeat(batch_size, 1)})

    @classmethod
    def build_data(cls, cfg: Mapping[str, Any], tokenizer: Any, image_source: Any, world: Any = None) -> TaskData:
        """One example per expression: ``{id, image_id, sentence, ref_box (xyxy px), image_hw}``.

        ``cfg.source``: ``shapes`` (``world.refexps``) or ``files`` (``cfg.refs``: ``refs(unc).p`` or its
        JSON, ``cfg.instances``: COCO ``instances.json``, read by `vlkit.data.formats.read_refs`).
        ``cfg.train_split`` / ``cfg.eval_splits`` name the refs' splits (RefCOCO+: train; val, testA, testB).
        """
        source = task_source(cfg)
        if source == "shapes":
            if world is None:
                raise world_needed("refexp", "task.refs (refs(unc).p) and task.instances (instances.json)")
            refs = []
            for i in range(len(world)):
                for ref in world.refexps(i):
                    x, y, w, h = ref["bbox"]
                    refs.append({"id": str(ref["ref_id"]), "image_id": world.image_id(i), "split": ref["split"],
                                 "sentences": [s["sent"] for s in ref["sentences"]],
                                 "sent_ids": [s["sent_id"] for s in ref["sentences"]], "bbox": [x, y, x + w, y + h],
                                 "image_size": [world.image_size, world.image_size]})
        elif source == "files":
            missing = [k for k in ("refs", "instances") if not cfg.get(k)]
            if missing:
                raise ValueError(f"refexp: source=files needs {' and '.join(k + '=' for k in missing)} "
                                 "(refs(unc).p or its JSON, and COCO instances.json)")
            refs = formats.read_refs(cfg["refs"], cfg["instances"], image_id_format=cfg.get("image_id_format", "{}"))
        else:
            raise ValueError(f"refexp: unknown source {source!r}; use shapes or files")
        check_ref_boxes(refs, cfg.get("refs") or "the shapes world")

        def dataset(splits: Any) -> Any:
            wanted = {splits} if isinstance(splits, str) else set(splits)
            records = [{"id": str(sid), "image_id": r["image_id"], "sentence": s, "ref_box": r["bbox"],
                        "image_hw": r["image_size"]}
                       for r in refs if r["split"] in wanted for s, sid in zip(r["sentences"], r["sent_ids"])]
            if not records:
                raise ValueError(f"refexp: no referring expressions in split(s) {', '.join(sorted(wanted))}")
            return ImageTextPairs(records, tokenizer, image_source, max_len=int(cfg.get("max_len", 40)),
                                  text_key="sentence", targets=_refexp_targets)

        train = dataset(cfg.get("train_split", "train"))
        eval_splits = cfg.get("eval_splits", ["val", "test"])
        eval_splits = [eval_splits] if isinstance(eval_splits, str) else list(eval_splits)
        if source == "shapes":  # a shapes world sized without a split has no images there
            eval_splits = [s for s in eval_splits if len(world.indices(s))]
        return TaskData(train=train, eval={s: dataset(s) for s in eval_splits}, collate=train.collator())
