"""Image-text contrastive learning (ALBEF, Li et al. 2021 §3.2) over the unimodal encodings.

Not part of any of the three papers' recipes: a named option that lets image-text alignment emerge
in small models (it is what `vlkit compare` adds, identically, to every contestant's mix). Each
caption and each image is pooled from the family's ``encode_text`` / ``encode_image`` output,
projected (``text_proj`` / ``vision_proj``), L2-normalised and scored against every other one of the
batch; the loss is the symmetric InfoNCE with a learned temperature (``temp``, ALBEF's init 0.07,
clamped to [0.001, 0.5]). Captions of the same image are all positives of that image.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlkit.models.base import VLModel
from vlkit.models.layers import masked_mean
from vlkit.objectives.base import Objective, PassContext
from vlkit.registry import register_objective
from vlkit.types import Encoded, LossOutput, VLBatch

POOLING = ("mean", "first")


def pool(encoded: Encoded, how: str) -> Tensor:
    """[B, H]: the masked mean of the states, or the first position ([CLS], [IMG])."""
    return encoded.states[:, 0] if how == "first" else masked_mean(encoded.states, encoded.mask)


def same_image(batch: VLBatch) -> Tensor:
    """[B, B] bool: rows i and j show the same image (ids, else only i == j)."""
    b = batch.batch_size
    if batch.image_ids is None:
        return torch.eye(b, dtype=torch.bool, device=batch.device)
    index = {k: n for n, k in enumerate(dict.fromkeys(batch.image_ids))}
    image = torch.tensor([index[k] for k in batch.image_ids], device=batch.device)
    return image.view(-1, 1) == image.view(1, -1)


@register_objective("itc")
class ImageTextContrastive(Objective):
    """ITC. ``dim``: projection size (ALBEF 256); ``pool``: ``mean`` over real positions (works for every
    family, UNITER's encodings are embeddings only) or ``first``; ``temperature``: the initial value."""

    name = "itc"
    view = "unimodal"

    def __init__(self, model: VLModel, dim: int = 256, pool: str = "mean", temperature: float = 0.07):
        super().__init__(model)
        if pool not in POOLING:
            raise ValueError(f"itc: pool must be one of {', '.join(POOLING)}, not {pool!r}")
        self.pooling = pool
        self.text_proj = nn.Linear(model.text_hidden_size, dim)
        self.vision_proj = nn.Linear(model.image_hidden_size, dim)
        self.temp = nn.Parameter(torch.tensor(float(temperature)))

    def embed(self, text: Encoded, image: Encoded) -> tuple[Tensor, Tensor]:
        """Normalised caption and image embeddings [B, dim] (retrieval can pre-rank with them)."""
        return (F.normalize(self.text_proj(pool(text, self.pooling)), dim=-1),
                F.normalize(self.vision_proj(pool(image, self.pooling)), dim=-1))

    def forward(self, out: tuple[Encoded, Encoded], batch: VLBatch, ctx: PassContext) -> LossOutput:
        text, image = self.embed(*out)
        with torch.no_grad():
            self.temp.clamp_(0.001, 0.5)
        sim = text @ image.T / self.temp  # [captions, images]
        positive = same_image(batch).to(sim.dtype)
        target = positive / positive.sum(1, keepdim=True)
        loss_t2i = -(target * sim.log_softmax(1)).sum(1).mean()
        loss_i2t = -(target * sim.T.log_softmax(1)).sum(1).mean()
        hit = positive.gather(1, sim.argmax(1, keepdim=True)).mean()
        return LossOutput((loss_t2i + loss_i2t) / 2, {"acc": hit.detach(), "temp": self.temp.detach()})
