"""``word_order``: a pre-training objective that tells captions whose words were reversed from the others, on the
``reversed_words`` view (its mix block: ``word_reversal``). A corruption view and its objective from outside
vlkit, found through the ``vlkit.plugins`` entry point."""
import torch
import torch.nn.functional as F
from torch import nn

import vlkit


@vlkit.register_corruption()
class ReversedWords(vlkit.Corruption):
    """Reverses the words of each caption (between [CLS] and [SEP]) with probability ``prob``."""

    name = "reversed_words"
    options_key = "word_reversal"
    defaults = {"prob": 0.5}

    def apply(self, mix, batch, ctx, generator):
        chosen = torch.rand(batch.batch_size, generator=generator) < self.options["prob"]
        ids = batch.input_ids.clone()
        for row in chosen.nonzero().flatten().tolist():
            n = int(batch.attention_mask[row].sum())
            ids[row, 1:n - 1] = ids[row, 1:n - 1].flip(0)
        ctx.extra["reversed"] = chosen.to(batch.device)
        ctx.text_from = None
        return batch.replace(input_ids=ids)


@vlkit.register_objective("word_order")
class WordOrder(vlkit.Objective):
    """Tells reversed captions from the others on the joint vector."""

    name = "word_order"
    view = "reversed_words"
    joint_only = True

    def __init__(self, model):
        super().__init__(model)
        self.head = nn.Linear(model.joint_size, 2)

    def forward(self, out, batch, ctx):
        logits, target = self.head(out.joint), ctx.extra["reversed"].long()
        return vlkit.LossOutput(F.cross_entropy(logits, target), {"acc": (logits.argmax(-1) == target).float().mean()})
