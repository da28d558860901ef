"""Masked region modelling: feature regression (MRFR), hard classification (MRC) and KL to the
detector's soft labels (MRC-kl), on the states of masked regions."""
from __future__ import annotations

from typing import Mapping

import torch.nn.functional as F
from torch import Tensor, nn

from vlkit.models.base import VLModel
from vlkit.objectives.base import (IncompatibleObjective, Objective, PassContext, PredictionHeadTransform, accuracy,
                                   at_mask, check_score, masked_rows, require_regions)
from vlkit.registry import register_objective
from vlkit.types import LossOutput, VLBatch, VLOutput


def _masked_region_rows(ctx: PassContext) -> tuple[None, Tensor] | None:
    """`Objective.rows` of the masked-region objectives: the scored masked regions."""
    return None if ctx.region_masked is None else (None, masked_rows(ctx.region_masked, ctx.score_rows))


def _masked_targets(name: str, out: VLOutput, ctx: PassContext) -> tuple[Tensor, Tensor]:
    """(states of the scored masked regions [n, H], their mask [B, K])."""
    if ctx.region_masked is None:
        raise ValueError(f"{name}: the pass has no masked regions (its view must include 'regions')")
    chosen = masked_rows(ctx.region_masked, ctx.score_rows)
    return out.region_states[chosen], chosen


@register_objective("mrfr")
class MaskedRegionFeatureRegression(Objective):
    """UNITER MRFR: MLP + LN, then the transposed image-input projection weight plus its own bias,
    regressing the original feature of each masked region; MSE averaged over all elements."""

    name = "mrfr"
    view = "regions"

    def __init__(self, model: VLModel):
        super().__init__(model)
        projection = model.get_region_projection()
        self.net = PredictionHeadTransform(model.image_hidden_size, projection.out_features)
        self.weight = projection.weight  # tied: used transposed (feature_size <- hidden)
        self.bias = nn.Parameter(projection.weight.new_zeros(projection.in_features))

    @classmethod
    def check(cls, model: VLModel) -> None:
        require_regions(cls.name, model)
        if model.get_region_projection().out_features != model.image_hidden_size:
            raise IncompatibleObjective("mrfr: the region projection does not map into the image stream")

    def rows(self, ctx: PassContext) -> tuple[None, Tensor] | None:
        return _masked_region_rows(ctx)

    def forward(self, out: VLOutput, batch: VLBatch, ctx: PassContext) -> LossOutput:
        states, chosen = _masked_targets(self.name, out, ctx)
        prediction = F.linear(self.net(states), self.weight.t(), self.bias)
        target = ctx.original.region_feats[chosen]
        loss = F.mse_loss(prediction, target) if target.numel() else states.sum() * 0.0
        return LossOutput(loss, {"n_masked": float(states.shape[0])})


class RegionClassifier(nn.Module):
    """``decoder(transform(h))``: ViLBERT ``imagePredictions`` / UNITER ``region_classifier.net``."""

    def __init__(self, hidden_size: int, num_classes: int):
        super().__init__()
        self.transform = PredictionHeadTransform(hidden_size, hidden_size)
        self.decoder = nn.Linear(hidden_size, num_classes)

    def forward(self, states: Tensor) -> Tensor:
        return self.decoder(self.transform(states))


class _RegionClassification(Objective):
    """``share_head`` names the other region-classification objective of the mixture whose head this one
    uses (UNITER's one ``region_classifier`` serves both MRC and MRC-kl). ``score``: ``masked`` classifies the
    masked regions only (UNITER's official code), ``all`` every region with the loss at the masked ones
    (ViLBERT's official ``imagePredictions``): the same loss, more arithmetic."""

    view = "regions"
    needs_soft_labels = True

    def __init__(self, model: VLModel, reduction: str = "mean", share_head: str | None = None, score: str = "masked"):
        super().__init__(model)
        self.score = check_score(self.name, score)
        if reduction not in ("mean", "per_region"):
            raise ValueError(f"{self.name}: reduction must be 'mean' (UNITER) or 'per_region' (ViLBERT), not {reduction!r}")
        self.reduction = reduction
        self.share_head = share_head
        self.num_classes = model.region_classes
        self.predictions = RegionClassifier(model.image_hidden_size, self.num_classes)

    def attach(self, objectives: Mapping[str, Objective]) -> None:
        if self.share_head is None:
            return
        other = objectives[self.share_head] if self.share_head in objectives else None
        if not isinstance(other, _RegionClassification) or other is self or other.share_head is not None:
            raise ValueError(f"{self.name}: share_head={self.share_head!r} must name another region classification "
                             f"objective of the mix that owns its head (the mix has {', '.join(objectives)})")
        self.predictions = other.predictions

    @classmethod
    def check(cls, model: VLModel) -> None:
        require_regions(cls.name, model)
        if model.region_classes is None:
            raise IncompatibleObjective(f"objective {cls.name!r} classifies regions into the detector's classes; "
                                        f"{model.family} declares no config field for them (size_fields "
                                        "'region_classes')")

    def rows(self, ctx: PassContext) -> tuple[None, Tensor] | None:
        return None if self.score == "all" else _masked_region_rows(ctx)

    def _scored(self, out: VLOutput, ctx: PassContext) -> tuple[Tensor, Tensor]:
        states, chosen = _masked_targets(self.name, out, ctx)
        soft = ctx.original.region_soft_labels
        if soft is None:
            raise ValueError(f"{self.name}: the batch has no region_soft_labels (detector class distributions)")
        if soft.shape[-1] != self.num_classes:
            raise ValueError(f"{self.name}: soft labels have {soft.shape[-1]} classes, the model takes "
                             f"{self.num_classes} (region_classes)")
        logits = at_mask(self.predictions(out.region_states), chosen) if self.score == "all" else \
            self.predictions(states)
        return logits, soft[chosen]


@register_objective("mrc")
class MaskedRegionClassification(_RegionClassification):
    """MRC: cross-entropy against the detector's top class (argmax without background, column 0)."""

    name = "mrc"

    def forward(self, out: VLOutput, batch: VLBatch, ctx: PassContext) -> LossOutput:
        logits, soft = self._scored(out, ctx)
        target = soft[:, 1:].argmax(-1) + 1
        if not target.numel():
            return LossOutput(logits.sum() * 0.0, {"acc": 0.0, "n_masked": 0.0})
        loss = F.cross_entropy(logits, target)
        return LossOutput(loss, {"acc": accuracy(logits, target, empty=0.0), "n_masked": float(target.numel())})


@register_objective("mrc_kl")
class MaskedRegionClassificationKL(_RegionClassification):
    """MRC-kl: ``KL(p_detector || p_model)`` over the full soft distribution (background included).

    ``reduction="mean"`` divides by regions x classes (UNITER), ``"per_region"`` by the number of
    masked regions (ViLBERT)."""

    name = "mrc_kl"

    def forward(self, out: VLOutput, batch: VLBatch, ctx: PassContext) -> LossOutput:
        logits, soft = self._scored(out, ctx)
        if not soft.numel():
            return LossOutput(logits.sum() * 0.0, {"acc": 0.0, "n_masked": 0.0})
        kl = F.kl_div(F.log_softmax(logits, dim=-1), soft.to(logits.dtype), reduction="sum")
        loss = kl / (soft.numel() if self.reduction == "mean" else soft.shape[0])
        return LossOutput(loss, {"acc": accuracy(logits, soft.argmax(-1), empty=0.0), "n_masked": float(soft.shape[0])})
