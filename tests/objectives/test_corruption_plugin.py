"""Issue 45: corruption views are registry entries. A pair maker is declared (`Objective.makes_pairs`), not
guessed; an objective needs a registered view; registration refuses an options key that is taken. (A view and
the objective that scores it from an outside package: tests/plugins/test_corruption_plugin_package.py.)"""
import pytest
import torch

import vlkit
from vlkit import registry


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
    """The objectives above, registered as a plugin does (this module is no vlkit module), then removed."""
    for cls in (NextImage, Unviewed):
        vlkit.register_objective(cls.name)(cls)
    yield
    for cls in (NextImage, Unviewed):
        registry.OBJECTIVES._entries.pop(cls.name)


def test_an_objective_needs_a_registered_view(build_tiny):
    with pytest.raises(vlkit.UnknownNameError, match="'unviewed' scores the view 'no_such_view'.*views: .*pairs.*text"):
        vlkit.build_pretraining(build_tiny("uniter"), {"unviewed": 1})


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
        clash = type("Clash", (vlkit.Corruption,), {"name": "clash", "options_key": key})
        with pytest.raises(vlkit.registry.RegistrationError, match=f"options_key '{key}' is taken by {owner}"):
            vlkit.register_corruption()(clash)
        assert "clash" not in registry.CORRUPTIONS._entries
