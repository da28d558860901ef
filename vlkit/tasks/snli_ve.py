"""SNLI-VE: is the hypothesis entailed by, neutral to or contradicted by the image? A 3-way classifier
on the family's joint vector (its `vlkit.models.heads.JointClassifier` head) trained with the head's
loss (``loss=`` picks another); accuracy.

Label order of the head (``labels``): entailment = 0, neutral = 1, contradiction = 2 by default
(`vlkit.data.formats.VE_LABELS`). The official codes order them differently (UNITER contradiction /
entailment / neutral; ViLBERT and METER contradiction / neutral / entailment): pass that order as
``labels`` to use a converted official head. The text is the hypothesis alone (the image is the premise).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from vlkit.data.formats import VE_LABELS, read_snli_ve
from vlkit.data.pairs import ImageTextPairs
from vlkit.registry import register_task
from vlkit.tasks.base import HeadTask, TaskData, classification_loss, label_target, most_common, split_records
from vlkit.tasks.metrics import accuracy
from vlkit.types import LossOutput, VLBatch


def shapes_snli_ve_records(world: Any, i: int) -> list[dict]:
    """The three hypotheses of shapes image ``i`` as `vlkit.data.formats.read_snli_ve` records."""
    return [{"id": r["pairID"], "image_id": r["Flickr30K_ID"], "premise": r["sentence1"],
             "hypothesis": r["sentence2"], "label": r["gold_label"]} for r in world.snli_ve(i)]


def _snli_ve_files(path: Any) -> list[dict]:
    return read_snli_ve(path)


@register_task("snli_ve")
class SNLIVETask(HeadTask):
    """SNLI-VE with the family's head; targets are label names mapped through ``labels``."""

    name = "snli_ve"

    def __init__(self, model: nn.Module, labels: Sequence[str] = VE_LABELS, majority_label: str | None = None,
                 loss: str | None = None, task_id: int | None = None, head: str | None = None):
        super().__init__(model, loss, task_id, head)
        self.label_names = [str(x) for x in labels]
        if sorted(self.label_names) != sorted(VE_LABELS):
            raise ValueError(f"task snli_ve: labels must order {', '.join(VE_LABELS)}, got {self.label_names}")
        self.label_index = {x: k for k, x in enumerate(self.label_names)}
        self.majority_label = majority_label
        self.install_head(self.head_class(head)(model, len(VE_LABELS)))

    def label_ids(self, batch: VLBatch) -> Tensor:
        names = self.target(batch)
        unknown = [(i, x) for i, x in zip(batch.ids or range(len(names)), names) if x not in self.label_index]
        if unknown:
            raise ValueError(f"task snli_ve: example {unknown[0][0]!r} has label {unknown[0][1]!r}, "
                             f"not one of {', '.join(self.label_names)}")
        return torch.tensor([self.label_index[x] for x in names], device=batch.device)

    def forward(self, batch: VLBatch, step: int = 0, micro_step: int | None = None) -> LossOutput:
        labels = self.label_ids(batch)
        logits = self.logits(batch)
        return LossOutput(classification_loss(logits, labels, self.loss_kind),
                          {"snli_ve_acc": accuracy(logits.detach(), labels)})

    def predict(self, batch: VLBatch) -> dict[str, Any]:
        """``ids``, ``pred`` [B] (arg-max index into ``labels``), ``labels`` (names), ``logits``."""
        with torch.no_grad():
            logits = self.logits(batch)
        pred = logits.argmax(-1)
        return {"ids": batch.ids, "pred": pred, "labels": [self.label_names[k] for k in pred.tolist()],
                "logits": logits}

    def evaluate(self, data: Any, batch_size: int = 64) -> dict[str, float]:
        """Accuracy (``snli_ve``) and that of always predicting the train majority label
        (``snli_ve_majority_baseline``), fractions."""
        predicted, gold = [], []
        for batch in self.batches(data, batch_size, "snli_ve eval"):
            gold += self.target(batch)
            predicted += self.predict(batch)["labels"]
        out = {"snli_ve": sum(p == g for p, g in zip(predicted, gold)) / len(gold)}
        if self.majority_label is not None:
            out["snli_ve_majority_baseline"] = sum(g == self.majority_label for g in gold) / len(gold)
        return out

    def example_batch(self, batch_size: int, text_len: int, num_regions: int, values: bool = True) -> VLBatch:
        batch = super().example_batch(batch_size, text_len, num_regions, values)
        return batch.replace(targets={"label": [self.label_names[0]] * batch_size})

    @classmethod
    def build_data(cls, cfg: Mapping[str, Any], tokenizer: Any, image_source: Any, world: Any = None) -> TaskData:
        """Hypotheses of the shapes world or of SNLI-VE jsonl files (``files.<split>``: a path or a list)."""
        splits = split_records(cfg, world, shapes_snli_ve_records, _snli_ve_files)
        data = {s: ImageTextPairs(recs, tokenizer, image_source, max_len=cfg.get("max_len", 40),
                                  filter_long=cfg.get("filter_long", False) and s == "train",
                                  text_key="hypothesis", targets=label_target) for s, recs in splits.items()}
        train = data.pop("train")
        return TaskData(train=train, eval=data, options={
            "labels": list(VE_LABELS), "majority_label": most_common(r["label"] for r in splits["train"])})
