"""The contracts every room of vlkit speaks: `VLBatch` in, `VLOutput` out, `LossOutput` for training.

Masks follow the Hugging Face convention: 1 (or True) marks a real position, 0 a pad.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

_REGION_FIELDS = ("region_feats", "region_boxes", "region_mask")


def _map_tensors(obj: Any, fn) -> Any:
    """Apply `fn` to every tensor inside nested dicts / lists / tuples (other leaves are kept)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and any(isinstance(v, (Tensor, dict, list, tuple)) for v in obj):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj


def _index_rows(obj: Any, idx: Tensor, batch_size: int) -> Any:
    """Select rows `idx` of every batch-leading tensor or per-example list inside `obj`."""
    if isinstance(obj, Tensor):
        return obj[idx.to(obj.device)] if obj.dim() > 0 and obj.shape[0] == batch_size else obj
    if isinstance(obj, dict):
        return {k: _index_rows(v, idx, batch_size) for k, v in obj.items()}
    if isinstance(obj, list) and len(obj) == batch_size:
        return [obj[i] for i in idx.tolist()]
    return obj


@dataclass
class VLBatch:
    """A batch of image-text examples.

    Text: ``input_ids`` / ``attention_mask`` [B, T]. Image: either regions (``region_feats``
    [B, K, D], ``region_boxes`` [B, K, 4] normalised xyxy, ``region_mask`` [B, K], optional
    ``region_soft_labels`` [B, K, C] with background in column 0, optional ``image_size`` [B, 2]
    as (h, w) pixels, optional ``region_wh`` [B, K, 2] (normalised box width and height as the
    feature file stored them: UNITER's fp16 ``norm_bb[:, 4:6]``), optional ``region_global`` [B, D]
    (the mean feature of all the image's stored regions, before box selection: ViLBERT's task-loader
    [IMG] feature)) or pixels (``pixel_values`` [B, 3, H, W]). ``region_masked`` [B, K] marks
    regions hidden by region masking (UNITER adds its learned mask embedding there). Task targets
    ride along in ``targets``; ``ids`` / ``image_ids`` name the examples for auditing.
    """

    input_ids: Tensor
    attention_mask: Tensor
    region_feats: Tensor | None = None
    region_boxes: Tensor | None = None
    region_mask: Tensor | None = None
    region_soft_labels: Tensor | None = None
    region_masked: Tensor | None = None
    image_size: Tensor | None = None
    region_wh: Tensor | None = None
    region_global: Tensor | None = None
    pixel_values: Tensor | None = None
    targets: dict[str, Any] = field(default_factory=dict)
    ids: list[str] | None = None
    image_ids: list[str] | None = None

    def __post_init__(self) -> None:
        b = self.input_ids.shape[0]
        if self.attention_mask.shape != self.input_ids.shape:
            raise ValueError(
                f"VLBatch: attention_mask {tuple(self.attention_mask.shape)} does not match "
                f"input_ids {tuple(self.input_ids.shape)}"
            )
        present = [f for f in _REGION_FIELDS if getattr(self, f) is not None]
        if present and len(present) != len(_REGION_FIELDS):
            missing = sorted(set(_REGION_FIELDS) - set(present))
            raise ValueError(f"VLBatch: region inputs need {', '.join(_REGION_FIELDS)}; missing {', '.join(missing)}")
        for name in (*_REGION_FIELDS, "region_soft_labels", "region_masked", "image_size", "region_wh", "region_global",
                     "pixel_values"):
            value = getattr(self, name)
            if value is not None and value.shape[0] != b:
                raise ValueError(f"VLBatch: {name} has batch size {value.shape[0]}, input_ids has {b}")
        if self.region_feats is not None:
            k = self.region_feats.shape[1]
            for name in ("region_boxes", "region_mask", "region_soft_labels", "region_masked", "region_wh"):
                value = getattr(self, name)
                if value is not None and value.shape[1] != k:
                    raise ValueError(f"VLBatch: {name} has {value.shape[1]} regions, region_feats has {k}")
            if self.region_boxes.shape[-1] != 4:
                raise ValueError(f"VLBatch: region_boxes must be [B, K, 4] xyxy, got {tuple(self.region_boxes.shape)}")
            if self.region_wh is not None and self.region_wh.shape[-1] != 2:
                raise ValueError(f"VLBatch: region_wh must be [B, K, 2], got {tuple(self.region_wh.shape)}")
        for name in ("ids", "image_ids"):
            value = getattr(self, name)
            if value is not None and len(value) != b:
                raise ValueError(f"VLBatch: {name} has {len(value)} entries for a batch of {b}")

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def has_regions(self) -> bool:
        return self.region_feats is not None

    @property
    def has_pixels(self) -> bool:
        return self.pixel_values is not None

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def replace(self, **changes: Any) -> "VLBatch":
        """A new batch with some fields changed; ``targets`` is copied, never shared."""
        changes.setdefault("targets", dict(self.targets))
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "VLBatch":
        fields = {f.name: _map_tensors(getattr(self, f.name), lambda t: t.to(device, non_blocking=non_blocking))
                  for f in dataclasses.fields(self)}
        return VLBatch(**fields)

    def pin_memory(self) -> "VLBatch":
        fields = {f.name: _map_tensors(getattr(self, f.name), lambda t: t.pin_memory()) for f in dataclasses.fields(self)}
        return VLBatch(**fields)

    def index(self, idx: Tensor | Sequence[int]) -> "VLBatch":
        """Rows ``idx`` of every batched field (targets and id lists included), in that order."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        b = self.batch_size
        fields = {f.name: _index_rows(getattr(self, f.name), idx, b) for f in dataclasses.fields(self)}
        return VLBatch(**fields)


@dataclass
class Encoded:
    """One modality encoded up to the point where a family fuses it with the other (for caching).

    ``states`` [B, L, H] and ``mask`` [B, L]; ``extra`` holds any further per-example tensors the
    family's ``fuse`` needs (e.g. ViLBERT's raw region embeddings).
    """

    states: Tensor
    mask: Tensor
    extra: dict[str, Tensor] = field(default_factory=dict)

    def index(self, idx: Tensor | Sequence[int]) -> "Encoded":
        idx = torch.as_tensor(idx, dtype=torch.long)
        b = self.states.shape[0]
        return Encoded(self.states[idx.to(self.states.device)], self.mask[idx.to(self.mask.device)],
                       _index_rows(self.extra, idx, b))

    def to(self, device: torch.device | str) -> "Encoded":
        return Encoded(self.states.to(device), self.mask.to(device), _map_tensors(self.extra, lambda t: t.to(device)))


@dataclass
class VLOutput:
    """What a model returns.

    ``text_states`` [B, T, Ht] are aligned with ``input_ids``. ``image_states`` [B, L, Hv] start
    with ``image_offset`` tokens that are not inputs (ViLBERT's [IMG], a ViT's [CLS]) followed by
    one state per input region / patch. ``joint`` is the family's own joint vector (ViLBERT
    ``pooled_t * pooled_v``, UNITER pooled [CLS], METER ``cat(text_pool, image_pool)``).
    """

    text_states: Tensor
    text_mask: Tensor
    image_states: Tensor
    image_mask: Tensor
    text_pooled: Tensor
    image_pooled: Tensor
    joint: Tensor
    image_offset: int = 0

    @property
    def region_states(self) -> Tensor:
        """Image states aligned with the input regions / patches (special tokens dropped)."""
        return self.image_states[:, self.image_offset:]

    @property
    def region_mask(self) -> Tensor:
        return self.image_mask[:, self.image_offset:]


@dataclass
class LossOutput:
    """A differentiable ``loss`` and detached metrics for logging (accuracy, counts, distances)."""

    loss: Tensor
    metrics: dict[str, Any] = field(default_factory=dict)

    def detached_metrics(self) -> dict[str, float]:
        out = {}
        for k, v in self.metrics.items():
            out[k] = float(v.detach().float().item()) if isinstance(v, Tensor) else float(v)
        return out
