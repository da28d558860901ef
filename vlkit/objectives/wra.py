"""UNITER word-region alignment: OT distance between fused word and region states (IPOT), pulled
down for matched pairs and pushed up for mismatched ones. Rides on the ITM pass."""
from __future__ import annotations

from torch import Tensor

from vlkit.models.base import VLModel
from vlkit.objectives.base import IncompatibleObjective, Objective, PassContext
from vlkit.objectives.ot import cosine_cost, ipot, wra_distance, wra_loss
from vlkit.registry import register_objective
from vlkit.types import LossOutput, VLBatch, VLOutput


@register_objective("wra")
class WordRegionAlignment(Objective):
    """``ot_loss = (sum d_matched - sum d_mismatched) / n``; the mixture weights it (UNITER lambda 0.1)."""

    name = "wra"
    view = "pairs"
    has_head = False
    alignment_title = "WRA transport plan"
    alignment_unit = "transported mass"

    def __init__(self, model: VLModel, beta: float = 0.5, iterations: int = 50, k: int = 1):
        super().__init__(model)
        self.beta, self.iterations, self.k = beta, iterations, k

    @classmethod
    def check(cls, model: VLModel) -> None:
        if model.text_hidden_size != model.image_hidden_size:
            raise IncompatibleObjective(f"wra: {model.family} text states ({model.text_hidden_size}-d) and image states "
                                        f"({model.image_hidden_size}-d) live in different spaces")

    def distance(self, out: VLOutput):
        return wra_distance(out.text_states, out.text_mask, out.region_states, out.region_mask,
                            self.beta, self.iterations, self.k)

    def alignment(self, out: VLOutput) -> Tensor:
        """The IPOT transport plan [B, T, K] between the words and the regions of ``out`` (cosine cost)."""
        cost = cosine_cost(out.text_states.float(), out.region_states.float())
        _, plan = ipot(cost, out.text_mask.bool(), out.region_mask.bool())
        return plan

    def forward(self, out: VLOutput, batch: VLBatch, ctx: PassContext) -> LossOutput:
        if ctx.itm_match is None:
            raise ValueError("wra: the pass has no matched / mismatched labels (its view must include 'pairs')")
        distance = self.distance(out)
        match = ctx.itm_match
        metrics = {"ot_pos": distance[match].mean() if match.any() else 0.0,
                   "ot_neg": distance[~match].mean() if (~match).any() else 0.0}
        return LossOutput(wra_loss(distance, match).to(out.joint.dtype), metrics)
