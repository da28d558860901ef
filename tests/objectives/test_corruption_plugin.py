"""Issue 45: corruption views are registry entries. A plugin objective scores a view the plugin registers itself
(touching no vlkit file) and trains; the view's options block joins the mix; a pair maker is declared
(`Objective.makes_pairs`), not guessed; registration refuses an options key that is taken."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vlkit
from vlkit import registry
from vlkit.objectives.mix import load_mix


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


class NextImage(vlkit.Objective):
    """A pair maker of its own: every row takes the next row's image (all mismatched)."""

    name = "next_image"
    view = "pairs"
    joint_only = True
    makes_pairs = True

    def pair_sources(self, batch, generator, similarity=None):
        b = batch.batch_size
        return torch.arange(1, b + 1) % b, torch.zeros(b, dtype=torch.bool)

    def swap(self, batch, source):
        return batch.replace(region_feats=batch.region_feats[source], region_boxes=batch.region_boxes[source])

    def forward(self, out, batch, ctx):
        return vlkit.LossOutput(out.joint.sum() * 0, {})


class Unviewed(vlkit.Objective):
    name = "unviewed"
    view = "no_such_view"

    def forward(self, out, batch, ctx):
        return vlkit.LossOutput(out.joint.sum() * 0, {})


@pytest.fixture(scope="module", autouse=True)
def plugin():
    """The plugin's entries, registered as a plugin does (this module is no vlkit module), then removed."""
    vlkit.register_corruption()(ReversedWords)
    for cls in (WordOrder, NextImage, Unviewed):
        vlkit.register_objective(cls.name)(cls)
    yield
    registry.CORRUPTIONS._entries.pop("reversed_words")
    for cls in (WordOrder, NextImage, Unviewed):
        registry.OBJECTIVES._entries.pop(cls.name)


MIX = {"sampling": "sum", "word_reversal": {"prob": 0.5}, "objectives": {"word_order": {}, "mlm": {}}}


def test_a_plugin_objective_trains_on_a_plugin_view(build_tiny):
    assert "reversed_words" in vlkit.CORRUPTIONS and "word_reversal" in load_mix(MIX)
    torch.manual_seed(0)
    model = build_tiny("uniter", num_hidden_layers=1)
    pre = vlkit.build_pretraining(model, MIX)
    assert pre.corruptions["reversed_words"].options == {"prob": 0.5}
    assert [sorted(views) for views, _ in pre.plan(pre.units)] == [["reversed_words"], ["text"]]
    assert "reversed_words" not in pre.mask_views  # not a masking view: a joint pass would not add it
    batch = model.example_batch(batch_size=8, seed=0)
    batch = batch.replace(attention_mask=torch.ones_like(batch.attention_mask))  # every caption fills its row
    optimizer = torch.optim.Adam(pre.parameters(), lr=1e-3)
    pre.train()
    losses = []
    for step in range(60):
        out = pre(batch, step=step)
        losses.append(out.metrics["word_order/loss"].item())
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    assert pre.objectives["word_order"].head.weight.grad.abs().sum() > 0
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.5 * first, (first, last)


def test_the_view_takes_only_its_options_and_an_objective_needs_a_registered_view(build_tiny):
    model = build_tiny("uniter")
    with pytest.raises(KeyError, match="word_reversal has unknown option.s. rate; it takes prob"):
        vlkit.build_pretraining(model, {**MIX, "word_reversal": {"rate": 0.5}})
    with pytest.raises(vlkit.UnknownNameError, match="'unviewed' scores the view 'no_such_view'.*reversed_words"):
        vlkit.build_pretraining(model, {"unviewed": 1})


def test_pairs_come_from_the_declared_pair_maker(build_tiny):
    model = build_tiny("uniter")
    batch = model.example_batch(batch_size=4)
    pre = vlkit.build_pretraining(model, {"next_image": 1})
    corrupted, ctx = pre.corrupt(batch, frozenset(["pairs"]), torch.Generator().manual_seed(0))
    assert ctx.itm_match.tolist() == [False] * 4 and ctx.image_from.tolist() == [1, 2, 3, 0]
    assert torch.equal(corrupted.region_feats, batch.region_feats[[1, 2, 3, 0]])
    assert not vlkit.OBJECTIVES.get("mlm").makes_pairs and vlkit.OBJECTIVES.get("itm").makes_pairs
    with pytest.raises(TypeError, match="objective 'mlm' makes no pairs"):
        vlkit.build_objective("mlm", model).pair_sources(batch, torch.Generator())
    wra_alone = vlkit.build_pretraining(model, {"wra": 1})
    with pytest.raises(ValueError, match="needs 'itm' in the mix to make pairs"):
        wra_alone.corrupt(batch, frozenset(["pairs"]), torch.Generator())


def test_a_view_cannot_take_a_mix_key_or_another_views_options_key():
    for key, owner in (("text_masking", "view 'text'"), ("sampling", "the mix")):
        clash = type("Clash", (ReversedWords,), {"name": "clash", "options_key": key})
        with pytest.raises(vlkit.registry.RegistrationError, match=f"options_key '{key}' is taken by {owner}"):
            vlkit.register_corruption()(clash)
        assert "clash" not in registry.CORRUPTIONS._entries
