"""Parts that load fine and break their contracts when used: an executor whose ``wait`` returns None, and a
corruption view that drops the last token of every caption (the batch's shape changes) with the objective that
scores it."""
import torch.nn.functional as F
from torch import nn

import vlkit
from vlkit import Executor, register_executor


@register_executor("none_waiter")
class NoneWaiter(Executor):
    def submit(self, key):
        pass

    def wait(self, timeout):
        return None

    def close(self):
        pass


@vlkit.register_corruption()
class ShrunkWords(vlkit.Corruption):
    name = "shrunk_words"
    options_key = "word_shrinking"

    def apply(self, mix, batch, ctx, generator):
        return batch.replace(input_ids=batch.input_ids[:, :-1], attention_mask=batch.attention_mask[:, :-1])


@vlkit.register_objective("shrunk_order")
class ShrunkOrder(vlkit.Objective):
    name = "shrunk_order"
    view = "shrunk_words"
    joint_only = True

    def __init__(self, model):
        super().__init__(model)
        self.head = nn.Linear(model.joint_size, 2)

    def forward(self, out, batch, ctx):
        logits = self.head(out.joint)
        return vlkit.LossOutput(F.cross_entropy(logits, logits.new_zeros(len(logits), dtype=int)), {})
