"""Masked language modelling conditioned on the image (all three papers)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlkit.models.base import VLModel
from vlkit.objectives.base import (IncompatibleObjective, Objective, PassContext, PredictionHeadTransform, accuracy,
                                   at_mask, check_score, masked_rows)
from vlkit.objectives.masking import IGNORE_INDEX
from vlkit.registry import register_objective
from vlkit.types import LossOutput, VLBatch, VLOutput


class LMPredictionHead(nn.Module):
    """BERT's ``cls.predictions``: transform, ``decoder`` (tied to the word embeddings or its own), ``bias``."""

    def __init__(self, hidden_size: int, vocab_size: int, tied_weight: nn.Parameter | None = None):
        super().__init__()
        self.transform = PredictionHeadTransform(hidden_size, hidden_size)
        self.decoder = nn.Linear(hidden_size, vocab_size, bias=False)
        if tied_weight is not None:
            self.decoder.weight = tied_weight
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, states: Tensor) -> Tensor:
        return self.decoder(self.transform(states)) + self.bias


@register_objective("mlm")
class MaskedLanguageModeling(Objective):
    """Predict masked tokens from the fused text states; CE averaged over the masked tokens.

    The decoder is tied to the input word embeddings where the official code ties it (ViLBERT,
    UNITER) and untied for METER (``tied`` overrides). Masking itself (15%, 80/10/10, whole word)
    is the mixture's ``text_masking``. ``score``: ``masked`` decodes the masked tokens only (UNITER's
    official code); ``all`` decodes every text position and takes the loss at the masked ones, as
    ViLBERT's and METER's official heads compute it: the same loss, more arithmetic (a paper's run as it
    ran, `vlkit.compare.costs`).
    """

    name = "mlm"
    view = "text"

    def __init__(self, model: VLModel, tied: bool | None = None, score: str = "masked"):
        super().__init__(model)
        self.score = check_score(self.name, score)
        tied = model.mlm_tied if tied is None else tied
        embeddings = model.get_input_embeddings()
        if tied and embeddings.embedding_dim != model.text_hidden_size:
            raise IncompatibleObjective(f"mlm: cannot tie a {model.text_hidden_size}-d decoder to "
                                        f"{embeddings.embedding_dim}-d word embeddings; use tied=false")
        self.predictions = LMPredictionHead(model.text_hidden_size, embeddings.num_embeddings,
                                            embeddings.weight if tied else None)

    def rows(self, ctx: PassContext) -> tuple[Tensor | None, Tensor | None] | None:
        if ctx.mlm_labels is None or self.score == "all":
            return None
        return masked_rows(ctx.mlm_labels != IGNORE_INDEX, ctx.score_rows), None

    def forward(self, out: VLOutput, batch: VLBatch, ctx: PassContext) -> LossOutput:
        if ctx.mlm_labels is None:
            raise ValueError("mlm: the pass has no masked tokens (its view must include 'text')")
        labels = ctx.mlm_labels
        targets = masked_rows(labels != IGNORE_INDEX, ctx.score_rows)
        logits = at_mask(self.predictions(out.text_states), targets) if self.score == "all" else \
            self.predictions(out.text_states[targets])
        gold = labels[targets]
        loss = F.cross_entropy(logits, gold) if gold.numel() else out.text_states.sum() * 0.0
        return LossOutput(loss, {"acc": accuracy(logits, gold, empty=0.0), "n_masked": float(gold.numel())})
