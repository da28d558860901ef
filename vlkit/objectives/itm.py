"""Image-text matching: mismatched pairs mixed into the batch, a 2-way head on the joint vector.

Negatives follow each official code: UNITER replaces the image of each example with probability
0.5, METER mismatches an exact half of the batch (random permutation), ViLBERT replaces the caption
of half the examples. The label index meaning "matched" is the family's own (ViLBERT 0, UNITER and
METER 1), so converted heads keep their meaning.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlkit.models.base import VLModel
from vlkit.objectives.base import Objective, PassContext, accuracy
from vlkit.registry import register_objective
from vlkit.types import LossOutput, VLBatch, VLOutput

IMAGE_FIELDS = ("region_feats", "region_boxes", "region_mask", "region_soft_labels", "region_masked", "image_size",
                "region_wh", "region_global", "pixel_values")


def choose_negatives(batch: VLBatch, is_negative: Tensor, generator: torch.Generator,
                     similarity: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """For each row to make negative, another row with a different image: ``(source [B], negative [B])``.

    Without ``similarity`` the partner is drawn uniformly; with ``similarity`` [B, B] (hard negatives
    for fine-tuning) it is the most similar row with a different image. A row whose batch holds no
    other image stays a positive (``negative`` False).
    """
    b = batch.batch_size
    keys = batch.image_ids or [str(i) for i in range(b)]
    ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    image = torch.tensor([ids[k] for k in keys])
    allowed = image.view(-1, 1) != image.view(1, -1)  # [B, B] rows with another image
    if similarity is not None:
        score = similarity.detach().float().cpu().masked_fill(~allowed, float("-inf"))
    else:
        score = torch.rand(b, b, generator=generator).masked_fill(~allowed, -1.0)
    partner = score.argmax(1)
    negative = is_negative.cpu() & allowed.any(1)
    source = torch.where(negative, partner, torch.arange(b))
    return source.to(batch.device), negative.to(batch.device)


def swap_images(batch: VLBatch, source: Tensor) -> VLBatch:
    """Row i takes the image of row ``source[i]`` (text, ids and targets stay)."""
    changes = {f: getattr(batch, f)[source] for f in IMAGE_FIELDS if getattr(batch, f) is not None}
    if batch.image_ids is not None:
        changes["image_ids"] = [batch.image_ids[i] for i in source.tolist()]
    return batch.replace(**changes)


def swap_texts(batch: VLBatch, source: Tensor) -> VLBatch:
    """Row i takes the caption of row ``source[i]`` (ViLBERT's random caption)."""
    return batch.replace(input_ids=batch.input_ids[source], attention_mask=batch.attention_mask[source])


class ItmHead(nn.Module):
    """``fc(dropout(joint))`` -> 2 logits (ViLBERT ``bi_seq_relationship``, UNITER ``itm_output``,
    METER ``itm_score.fc``)."""

    def __init__(self, joint_size: int, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(joint_size, 2)

    def forward(self, joint: Tensor) -> Tensor:
        return self.fc(self.dropout(joint))


@register_objective("itm")
class ImageTextMatching(Objective):
    """ITM. ``negatives``: ``image`` (replace the image) or ``text`` (replace the caption);
    ``split``: ``bernoulli`` (each row negative with ``neg_prob``) or ``half`` (exactly half, METER);
    ``match_index``: the logit index of "matched"; ``dropout`` on the joint vector (ViLBERT 0.1)."""

    name = "itm"
    view = "pairs"
    joint_only = True
    offers_scorer = True
    makes_pairs = True

    def __init__(self, model: VLModel, negatives: str = "image", split: str = "bernoulli", neg_prob: float = 0.5,
                 match_index: int = 1, dropout: float = 0.0):
        super().__init__(model)
        if negatives not in ("image", "text") or split not in ("bernoulli", "half") or match_index not in (0, 1):
            raise ValueError(f"itm: negatives must be image|text, split bernoulli|half, match_index 0|1; got "
                             f"{negatives!r}, {split!r}, {match_index!r}")
        self.negatives, self.split, self.neg_prob, self.match_index = negatives, split, neg_prob, match_index
        self.itm_head = ItmHead(model.joint_size, dropout)

    def pair_sources(self, batch: VLBatch, generator: torch.Generator,
                     similarity: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Which row lends each row its image (``negatives="image"``) or caption (``"text"``):
        ``(source [B], matched [B] bool)``."""
        b = batch.batch_size
        if self.split == "half":
            is_negative = torch.zeros(b, dtype=torch.bool)
            is_negative[torch.randperm(b, generator=generator)[: b - b // 2]] = True
        else:
            is_negative = torch.rand(b, generator=generator) < self.neg_prob
        source, negative = choose_negatives(batch, is_negative, generator, similarity)
        return source, ~negative

    def swap(self, batch: VLBatch, source: Tensor) -> VLBatch:
        return swap_images(batch, source) if self.negatives == "image" else swap_texts(batch, source)

    def logits(self, out: VLOutput) -> Tensor:
        return self.itm_head(out.joint)

    def match_score(self, out: VLOutput) -> Tensor:
        """Probability of "matched" (zero-shot retrieval scores with it)."""
        return self.logits(out).softmax(-1)[:, self.match_index]

    def forward(self, out: VLOutput, batch: VLBatch, ctx: PassContext) -> LossOutput:
        if ctx.itm_match is None:
            raise ValueError("itm: the pass has no matched / mismatched labels (its view must include 'pairs')")
        logits = self.logits(out)
        target = torch.where(ctx.itm_match, self.match_index, 1 - self.match_index).long()
        return LossOutput(F.cross_entropy(logits, target),
                          {"acc": accuracy(logits, target, empty=0.0), "pos_frac": ctx.itm_match.float().mean()})
