"""Task heads: the `Head` bases a family's heads derive from, shared layouts, and the generic heads a
task uses for a family that registers none of its own.

A head is an ``nn.Module`` registered per ``(task, family)`` with `vlkit.register_head`. The task
installs the head's child modules on itself under the names the head gives them, so those names are
the task's state-dict keys: a family names them as its official code does and released checkpoints
line up. What a head's ``forward`` takes depends on the task:

==============  ====================  ===============================================  ====================
task            base                  forward                                          built as
==============  ====================  ===============================================  ====================
vqa, snli_ve    `JointClassifier`     ``(out) -> logits [B, C]``                       ``(model, num_outputs)``
nlvr2           `PairClassifier`      ``(left_out, right_out) -> logits [B, C]``       ``(model, num_outputs)``
refexp          `RegionScorer`        ``(out) -> scores [B, K]`` of the regions        ``(model, mlp=2)``
retrieval       `RankHead`            ``(out) -> matching scores [B]``                 ``(model)``
==============  ====================  ===============================================  ====================

Class attributes declare how the family trains the head: ``loss`` (the task's loss by name: ``ce``,
``bce``, ``bce_instance`` for the classifiers, ``bce`` / ``ce`` for refexp), ``pooled_only`` (the head
reads only the poolers / joint vector, so the model's last layers run at those positions only) and,
for retrieval, ``recipe`` (``multiple_choice``, ``hard_negatives`` or ``softmax``), ``init_from_itm``
and ``frozen_itm_weight``.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from vlkit.registry import register_head
from vlkit.types import VLOutput


def initializer_range(model: Any) -> float:
    return getattr(model.config, "initializer_range", 0.02)


def init_linear(module: nn.Module, std: float) -> nn.Module:
    """normal(0, std) weights and zero biases for every Linear layer of ``module``."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=std)
            nn.init.zeros_(layer.bias)
    return module


def mlp_classifier(in_size: int, hidden: int, num_outputs: int, std: float) -> nn.Sequential:
    """Linear, GELU, LayerNorm(1e-12), Linear: ViLBERT's ``SimpleClassifier`` and UNITER's ``vqa_output``
    (indices ``.0`` / ``.2`` / ``.3`` as in their state dicts)."""
    return init_linear(nn.Sequential(nn.Linear(in_size, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=1e-12),
                                     nn.Linear(hidden, num_outputs)), std)


class Head(nn.Module):
    """Base of the task heads (see the module docstring). ``output`` names the child that produces the
    head's output (a task's ``head`` property returns it)."""

    output: ClassVar[str] = ""
    loss: ClassVar[str | None] = None
    pooled_only: ClassVar[bool] = True

    @property
    def output_layer(self) -> nn.Module:
        return getattr(self, self.output)


class JointClassifier(Head):
    """``output(dropout(joint))`` -> [B, num_outputs]; `layers` builds ``output`` (by default
    `mlp_classifier` with a hidden layer ``hidden_mult`` times the input)."""

    dropout_prob: ClassVar[float] = 0.0
    hidden_mult: ClassVar[float] = 2.0

    def __init__(self, model: Any, num_outputs: int):
        super().__init__()
        self.joint_dropout = nn.Dropout(self.dropout_prob)
        self.add_module(self.output, self.layers(model, self.input_size(model), num_outputs))

    def input_size(self, model: Any) -> int:
        return model.joint_size

    def layers(self, model: Any, in_size: int, num_outputs: int) -> nn.Module:
        return mlp_classifier(in_size, int(self.hidden_mult * in_size), num_outputs, initializer_range(model))

    def forward(self, out: VLOutput) -> Tensor:
        return self.output_layer(self.joint_dropout(out.joint))


class PairClassifier(JointClassifier):
    """NLVR2: ``output(cat(dropout(joint_left), dropout(joint_right)))`` -> [B, num_outputs]."""

    hidden_mult = 1.0

    def input_size(self, model: Any) -> int:
        return 2 * model.joint_size

    def forward(self, left: VLOutput, right: VLOutput) -> Tensor:  # type: ignore[override]
        return self.output_layer(torch.cat([self.joint_dropout(left.joint), self.joint_dropout(right.joint)], dim=-1))


class RegionScorer(Head):
    """RefExp: one score per image region, ``output(dropout(region_states))`` -> [B, K]; ``mlp`` 1 is a
    Linear layer, 2 adds a hidden layer (Linear, GELU, LayerNorm(1e-12), Linear)."""

    dropout_prob: ClassVar[float] = 0.0

    def __init__(self, model: Any, mlp: int = 2):
        super().__init__()
        self.dropout = nn.Dropout(self.dropout_prob) if self.dropout_prob else nn.Identity()
        self.add_module(self.output, init_linear(self.layers(model, model.image_hidden_size, mlp),
                                                 initializer_range(model)))

    def layers(self, model: Any, size: int, mlp: int) -> nn.Module:
        if mlp == 1:
            return nn.Linear(size, 1)
        return nn.Sequential(nn.Linear(size, size), nn.GELU(), nn.LayerNorm(size, eps=1e-12), nn.Linear(size, 1))

    def forward(self, out: VLOutput) -> Tensor:
        return self.output_layer(self.dropout(out.region_states)).squeeze(-1)


class RankHead(Head):
    """Retrieval: a matching score ``output(dropout(joint))`` -> [B] (a Linear layer to one logit).

    ``recipe`` names the fine-tuning recipe of the retrieval task; ``init_from_itm`` copies the ITM
    head's "matched" row into ``output`` when an ITM head is given; ``frozen_itm_weight`` adds the ITM
    loss with that weight (the ITM head frozen) when one is given."""

    dropout_prob: ClassVar[float] = 0.0
    recipe: ClassVar[str] = "softmax"
    init_from_itm: ClassVar[bool] = True
    frozen_itm_weight: ClassVar[float] = 0.0

    def __init__(self, model: Any):
        super().__init__()
        self.dropout = nn.Dropout(self.dropout_prob)
        self.add_module(self.output, init_linear(nn.Linear(model.joint_size, 1), initializer_range(model)))

    def forward(self, out: VLOutput) -> Tensor:
        return self.output_layer(self.dropout(out.joint)).squeeze(-1)


# -- the generic heads: every family without heads of its own for a task gets these ---------------------
@register_head("vqa")
class VQAHead(JointClassifier):
    output, loss = "vqa_head", "bce_instance"


@register_head("snli_ve")
class SNLIVEHead(JointClassifier):
    output, loss = "snli_ve_head", "ce"


@register_head("nlvr2", name="pair")
class NLVR2Head(PairClassifier):
    output, loss = "nlvr2_head", "ce"


@register_head("refexp")
class RefExpHead(RegionScorer):
    output, loss = "refexp_head", "ce"


@register_head("retrieval")
class RetrievalHead(RankHead):
    output = "rank_head"


__all__ = ["Head", "JointClassifier", "PairClassifier", "RegionScorer", "RankHead", "init_linear", "mlp_classifier",
           "initializer_range", "VQAHead", "SNLIVEHead", "NLVR2Head", "RefExpHead", "RetrievalHead"]
