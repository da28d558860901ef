"""Collation: a list of examples (`vlkit.data.pairs`) -> a padded `VLBatch` (`VLCollator`)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from vlkit.types import VLBatch
from vlkit.validate import DataError


def pad_stack(tensors: Sequence[Tensor], value: float = 0) -> Tensor:
    """Stack tensors of equal rank, padding every dimension up to the largest with ``value``."""
    if tensors[0].dim() and all(t.shape[1:] == tensors[0].shape[1:] for t in tensors):  # only the length differs
        return torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=value)
    shape = [max(t.shape[d] for t in tensors) for d in range(tensors[0].dim())]
    out = tensors[0].new_full((len(tensors), *shape), value)
    for k, t in enumerate(tensors):
        out[(k, *(slice(0, n) for n in t.shape))] = t
    return out


def _lengths_mask(lengths: Sequence[int]) -> Tensor:
    return torch.arange(max(lengths, default=0))[None, :] < torch.tensor(lengths)[:, None]


class VLCollator:
    """List of examples -> `VLBatch`: pads text (``pad_token_id``) and regions (zeros, mask 0),
    stacks pixels, ``image_size``. ``targets`` dicts are merged key by key: tensors are stacked
    (padded with ``target_pad_values[key]``, default 0, when their shapes differ), numbers become
    a tensor, anything else is kept as a list."""

    def __init__(self, pad_token_id: int = 0, target_pad_values: Mapping[str, float] | None = None):
        self.pad_token_id = pad_token_id
        self.target_pad_values = dict(target_pad_values or {})

    def __call__(self, examples: Sequence[Mapping[str, Any] | None]) -> VLBatch:
        if not examples:
            raise ValueError("VLCollator: empty list of examples")
        kept = [e for e in examples if e is not None]  # None: an example data.on_error=skip left out
        if not kept:
            raise DataError(f"VLCollator: all {len(examples)} examples of a batch were skipped (data.on_error=skip); "
                            "the data is mostly bad: see the run's skipped.jsonl")
        examples = kept
        ids = [str(e.get("id", k)) for k, e in enumerate(examples)]
        self._check_same_fields(examples, ids)
        text = [torch.as_tensor(e["input_ids"], dtype=torch.long) for e in examples]
        fields: dict[str, Any] = {
            "input_ids": pad_stack(text, self.pad_token_id),
            "attention_mask": pad_stack([torch.as_tensor(e["attention_mask"], dtype=torch.long)
                                         if "attention_mask" in e else torch.ones(len(t), dtype=torch.long)
                                         for e, t in zip(examples, text)]),
            "ids": ids, "image_ids": [str(e["image_id"]) if "image_id" in e else None for e in examples],
        }
        if fields["image_ids"][0] is None:
            fields["image_ids"] = None
        first = examples[0]
        if "region_feats" in first:
            fields["region_feats"] = pad_stack([e["region_feats"] for e in examples])
            fields["region_boxes"] = pad_stack([e["region_boxes"] for e in examples])
            fields["region_mask"] = _lengths_mask([len(e["region_feats"]) for e in examples]).long()
            for name in ("region_soft_labels", "region_wh"):
                if name in first:
                    fields[name] = pad_stack([e[name] for e in examples])
            if "region_global" in first:
                fields["region_global"] = torch.stack([e["region_global"] for e in examples])
        if "image_size" in first:
            fields["image_size"] = torch.stack([torch.as_tensor(e["image_size"]) for e in examples])
        if "pixel_values" in first:
            shapes = {tuple(e["pixel_values"].shape) for e in examples}
            if len(shapes) > 1:
                raise ValueError("VLCollator: pixel_values of different sizes in one batch: "
                                 + ", ".join(f"{i}: {tuple(e['pixel_values'].shape)}" for i, e in zip(ids, examples)))
            fields["pixel_values"] = torch.stack([e["pixel_values"] for e in examples])
        if "targets" in first:
            fields["targets"] = self._targets([e["targets"] for e in examples], ids)
        return VLBatch(**fields)

    @staticmethod
    def _check_same_fields(examples: Sequence[Mapping[str, Any]], ids: list[str]) -> None:
        keys = set(examples[0])
        for i, e in zip(ids, examples):
            if "input_ids" not in e:
                raise KeyError(f"VLCollator: example {i!r} has no input_ids")
            if set(e) != keys:
                raise KeyError(f"VLCollator: example {i!r} has fields {sorted(e)}, example {ids[0]!r} has {sorted(keys)}")

    def _targets(self, targets: Sequence[Mapping[str, Any]], ids: list[str]) -> dict[str, Any]:
        keys = list(targets[0])
        out = {}
        for i, t in zip(ids, targets):
            if set(t) != set(keys):
                raise KeyError(f"VLCollator: example {i!r} has targets {sorted(t)}, example {ids[0]!r} has {sorted(keys)}")
        for key in keys:
            values = [t[key] for t in targets]
            if all(isinstance(v, Tensor) for v in values):
                ranks = {v.dim() for v in values}
                if len(ranks) > 1:
                    raise ValueError(f"VLCollator: target {key!r} has tensors of ranks {sorted(ranks)} in one batch")
                out[key] = pad_stack(values, self.target_pad_values.get(key, 0))
            elif all(isinstance(v, (bool, int, float)) for v in values):
                out[key] = torch.tensor(values)
            else:
                out[key] = list(values)
        return out
