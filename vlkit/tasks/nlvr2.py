"""NLVR2: is a statement true of a pair of images? Label "True" = 1; accuracy.

Batch layout: rows 2i / 2i+1 of a batch are the left / right image of example i (same text, id and
label). `ImagePairTexts` yields one item per example and its collator flattens the pairs, so a
sampler over items never splits a pair; `split_pairs` checks the layout on every batch.

The head is the family's `vlkit.models.heads.PairClassifier`-style head over the two passes
(``head=`` picks one of the family's NLVR2 heads, e.g. UNITER ``pair`` / ``pair_biattn``). With
``use_img_type`` a family with image token types (`VLModel.image_types`) gives the right image type
id 2: its table grows to 3 rows, row 2 a copy of row 1 (`extend_image_token_types`). Loss: the head's
official one unless ``loss=`` says otherwise.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch import Tensor, nn

from vlkit.data.formats import read_nlvr2
from vlkit.data.pairs import ImageTextPairs
from vlkit.registry import register_task
from vlkit.tasks.base import HeadTask, TaskData, classification_loss, label_target, most_common, split_records
from vlkit.tasks.metrics import accuracy, nlvr2_consistency
from vlkit.types import LossOutput, VLBatch, VLOutput
from vlkit.validate import DataError


# --------------------------------------------------------------------------------------------
# Data: one statement, two images
# --------------------------------------------------------------------------------------------
class PairCollator:
    """Items ``[left, right]`` -> one `VLBatch` whose rows 2i / 2i+1 are item i's left / right image."""

    def __init__(self, collate: Callable[[list], VLBatch]):
        self.collate = collate

    def __call__(self, items: Sequence[Sequence[Mapping[str, Any]] | None]) -> VLBatch:
        kept = [item for item in items if item is not None]  # None: skipped (data.on_error=skip)
        if not kept:
            raise DataError(f"PairCollator: all {len(items)} items of a batch were skipped (data.on_error=skip)")
        items = kept
        bad = next((k for k, item in enumerate(items) if len(item) != 2), None)
        if bad is not None:
            raise ValueError(f"PairCollator: item {bad} holds {len(items[bad])} examples, not a [left, right] pair")
        return self.collate([example for item in items for example in item])


class ImagePairTexts(torch.utils.data.Dataset):
    """Records ``{id, left_image, right_image, <text_key>, ...}``: item i is ``[left, right]``, two
    `vlkit.data.pairs.ImageTextPairs` examples with the same id, tokens and targets."""

    def __init__(self, records: Sequence[Mapping[str, Any]], tokenizer: Any, image_source: Any, max_len: int = 40,
                 filter_long: bool = False, text_key: str = "sentence",
                 targets: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
        rows = []
        for k, r in enumerate(records):
            missing = {"left_image", "right_image"} - set(r)
            if missing:
                raise KeyError(f"ImagePairTexts: record {r.get('id', k)!r} lacks {', '.join(sorted(missing))}")
            rows.append({**r, "image_id": str(r["left_image"])})
        self.pairs = ImageTextPairs(rows, tokenizer, image_source, max_len=max_len, filter_long=filter_long,
                                    text_key=text_key, targets=targets)
        self.right_images = [str(x) for x in self.pairs.data["right_image"]]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> list[dict[str, Any]] | None:
        left = self.pairs[i]
        if left is None:  # skipped (data.on_error=skip)
            return None
        right = {k: v for k, v in left.items() if k in ("id", "input_ids", "targets")}
        right["image_id"] = self.right_images[int(i)]
        fields = self.pairs.load_image(left["id"], right["image_id"])
        if fields is None:
            return None
        right.update(fields)
        return [left, right]

    def image_ids(self) -> list[str]:
        """Every left and right image id (the preflight checks them against the image source)."""
        return self.pairs.image_ids() + self.right_images

    def example_ids(self) -> list[str]:
        return self.pairs.example_ids() * 2

    def drop(self, example_ids: Any) -> int:
        """Leave the items ``example_ids`` out (the preflight's ``skip``)."""
        dropped = self.pairs.drop(example_ids)
        self.right_images = [str(x) for x in self.pairs.data["right_image"]]
        return dropped

    def lengths(self) -> list[tuple[int, int]]:
        """(tokens, image units) of each item's two padded rows, for `vlkit.data.batching`."""
        units = self.pairs.image_source.units
        return [(2 * t, 2 * max(k, units(r))) for (t, k), r in zip(self.pairs.lengths(), self.right_images)]

    def collator(self, **kwargs: Any) -> PairCollator:
        return PairCollator(self.pairs.collator(**kwargs))


def split_pairs(batch: VLBatch) -> tuple[VLBatch, VLBatch]:
    """(left rows 0, 2, 4 ..., right rows 1, 3, 5 ...) of a paired batch, after checking the layout."""
    b = batch.batch_size
    if b % 2:
        raise ValueError(f"nlvr2: a batch of {b} rows cannot hold image pairs (rows 2i / 2i+1 are the left / right "
                         "image of example i)")
    if batch.ids is not None:
        bad = next((k for k in range(0, b, 2) if batch.ids[k] != batch.ids[k + 1]), None)
        if bad is not None:
            raise ValueError(f"nlvr2: rows {bad} and {bad + 1} hold examples {batch.ids[bad]!r} and "
                             f"{batch.ids[bad + 1]!r}; a pair was split (sample items of ImagePairTexts, and shard "
                             "batches into even parts)")
    rows = torch.arange(b)
    return batch.index(rows[0::2]), batch.index(rows[1::2])


def extend_image_token_types(model: nn.Module) -> None:
    """Give ``model`` a third image token type (row 2 a copy of row 1, UNITER ``init_type_embedding`` and
    METER's NLVR2 set-up) and record it in its config."""
    if not model.image_types:
        raise ValueError(f"{model.family} has no image token types")
    model.extend_image_types(3)


# --------------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------------
def shapes_nlvr2_records(world: Any, i: int) -> list[dict]:
    """The statements about shapes images (i, partner) as `vlkit.data.formats.read_nlvr2` records."""
    return [{"id": r["identifier"], "left_image": r["left_image"], "right_image": r["right_image"],
             "sentence": r["sentence"], "label": r["label"] == "True"} for r in world.nlvr2(i)]


def _nlvr2_files(path: Any) -> list[dict]:
    return read_nlvr2(path)


@register_task("nlvr2")
class NLVR2Task(HeadTask):
    """NLVR2 with the family's head over both images (``head``: one of the family's NLVR2 heads)."""

    name = "nlvr2"

    def __init__(self, model: nn.Module, head: str | None = None, use_img_type: bool = True,
                 majority_label: bool | None = None, loss: str | None = None, task_id: int | None = None):
        super().__init__(model, loss, task_id, head)
        self.use_img_type = use_img_type and model.image_types
        if self.use_img_type:
            extend_image_token_types(model)
        self.majority_label = majority_label
        self.install_head(self.head_class(head)(model, 2))

    def _encode_side(self, batch: VLBatch, image_type: int) -> VLOutput:
        kwargs = {"image_type_id": image_type} if self.use_img_type else {}
        return self.encode(batch, pooled_only=self.task_head.pooled_only, **kwargs)

    def logits(self, batch: VLBatch) -> Tensor:
        """[B / 2, 2] logits of the pairs of ``batch``."""
        left, right = split_pairs(batch)
        return self.task_head(self._encode_side(left, 1), self._encode_side(right, 2))

    def label_ids(self, batch: VLBatch) -> Tensor:
        labels = self.target(batch)
        if not isinstance(labels, Tensor):
            first = next((i for i, x in zip(batch.ids or range(len(labels)), labels) if x is None), None)
            raise ValueError(f"task nlvr2: example {first!r} has no label (an unlabeled split can only be predicted)")
        labels = labels.long()
        if not torch.equal(labels[0::2], labels[1::2]):
            raise ValueError("task nlvr2: the two rows of a pair carry different labels")
        return labels[0::2]

    def forward(self, batch: VLBatch, step: int = 0, micro_step: int | None = None) -> LossOutput:
        labels = self.label_ids(batch)
        logits = self.logits(batch)
        return LossOutput(classification_loss(logits, labels, self.loss_kind),
                          {"nlvr2_acc": accuracy(logits.detach(), labels)})

    def predict(self, batch: VLBatch) -> dict[str, Any]:
        """Per pair: ``ids``, ``pred`` [B / 2] (1 = True), ``labels`` (bools), ``logits``."""
        with torch.no_grad():
            logits = self.logits(batch)
        pred = logits.argmax(-1)
        return {"ids": batch.ids[0::2] if batch.ids is not None else None, "pred": pred,
                "labels": [bool(x) for x in pred.tolist()], "logits": logits}

    def evaluate(self, data: Any, batch_size: int = 64) -> dict[str, float]:
        """Accuracy over the pairs (``nlvr2``), the official consistency (``nlvr2_consistency``: the share
        of sentences all of whose pairs are right) and the accuracy of always predicting the train
        majority label (``nlvr2_majority_baseline``), fractions. ``batch_size`` counts pairs."""
        correct, gold, ids = [], [], []
        for batch in self.batches(data, batch_size, "nlvr2 eval"):
            labels = self.label_ids(batch)
            correct.append(self.predict(batch)["pred"] == labels)
            gold.append(labels)
            ids += batch.ids[0::2]
        correct_all, gold_all = torch.cat(correct), torch.cat(gold)
        out = {"nlvr2": float(correct_all.double().mean()),
               "nlvr2_consistency": nlvr2_consistency(ids, correct_all.tolist())}
        if self.majority_label is not None:
            out["nlvr2_majority_baseline"] = float((gold_all == int(self.majority_label)).double().mean())
        return out

    def example_batch(self, batch_size: int, text_len: int, num_regions: int, values: bool = True) -> VLBatch:
        """``batch_size`` statements, each two rows (its left and right image)."""
        batch = super().example_batch(2 * batch_size, text_len, num_regions, values)
        ids = [str(k // 2) for k in range(2 * batch_size)]
        return batch.replace(ids=ids, targets={"label": torch.zeros(2 * batch_size, dtype=torch.long)})

    @classmethod
    def build_data(cls, cfg: Mapping[str, Any], tokenizer: Any, image_source: Any, world: Any = None) -> TaskData:
        """Statements of the shapes world or of NLVR2 jsonl files (``files.<split>``: a path or a list)."""
        splits = split_records(cfg, world, shapes_nlvr2_records, _nlvr2_files)
        data = {s: ImagePairTexts(recs, tokenizer, image_source, max_len=cfg.get("max_len", 40),
                                  filter_long=cfg.get("filter_long", False) and s == "train",
                                  targets=label_target) for s, recs in splits.items()}
        train = data.pop("train")
        labels = [r["label"] for r in splits["train"] if r["label"] is not None]
        return TaskData(train=train, eval=data, options={"majority_label": most_common(labels)})
