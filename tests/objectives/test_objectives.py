"""Issue 3: every objective on every compatible family, the mixture's sampling and masking policies,
YAML presets, and a tiny model overfitting 16 pairs with each family's own recipe."""
import collections
import contextlib

import pytest
import torch
from scipy.stats import chisquare

import vlkit
from vlkit.objectives import IncompatibleObjective, build_objective, build_pretraining, load_mix
from vlkit.models.meter import MeterConfig
from vlkit.objectives.mix import PRESET_DIR, Pretraining

COMPATIBLE = {
    "mlm": ("vilbert", "uniter", "meter"), "itm": ("vilbert", "uniter", "meter"),
    "mrfr": ("uniter",), "mrc": ("vilbert", "uniter"), "mrc_kl": ("vilbert", "uniter"),
    "wra": ("vilbert", "uniter", "meter"), "mim": ("meter",),
}
VIEW_OF = {"mlm": "text", "mrfr": "regions", "mrc": "regions", "mrc_kl": "regions", "mim": "patches"}


def _assert_same_loss_and_gradients(first, second):
    """Two (loss, gradients) results of the same step: equal loss, gradients within 1e-5 of their scale."""
    torch.testing.assert_close(first[0], second[0], rtol=0, atol=1e-6)
    assert len(first[1]) == len(second[1])
    for a, b in zip(first[1], second[1]):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max().clamp(min=1.0)


def test_objectives_are_registered():
    assert set(COMPATIBLE) <= set(vlkit.list_objectives())


@pytest.mark.parametrize("name,family", [(n, f) for n, fams in COMPATIBLE.items() for f in fams])
def test_objective_loss_is_finite_and_backpropagates(name, family, build_tiny):
    model = build_tiny(family).train()
    if name == "wra":
        mix = {"sampling": "sum", "objectives": {"itm": {"wra": {"weight": 0.1}}}}
    else:
        mix = {"sampling": "sum", "objectives": {name: {}}}  # a summed mix takes no ratio
    pre = Pretraining(model, mix)
    out = pre(model.example_batch(batch_size=4), step=0)
    assert torch.isfinite(out.loss) and out.metrics[f"objective/{name}"] == 1.0
    out.loss.backward()
    head_grads = [p.grad for p in pre.objectives[name].parameters() if p.requires_grad]
    assert all(g is not None for g in head_grads)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("name,family,match", [
    ("mrc", "meter", "needs region features"), ("mrfr", "meter", "needs region features"),
    ("mim", "uniter", "masks image patches"), ("mim", "vilbert", "masks image patches"),
])
def test_impossible_pairings_are_refused_at_build(name, family, match, build_tiny):
    with pytest.raises(IncompatibleObjective, match=match):
        build_objective(name, build_tiny(family))
    with pytest.raises(IncompatibleObjective, match="objective mix"):
        Pretraining(build_tiny(family), {"objectives": {name: {}}})


def test_wra_refused_when_streams_differ_in_width():
    with torch.device("meta"):
        model = vlkit.build_model("vilbert", preset="base")
    with pytest.raises(IncompatibleObjective, match="different spaces"):
        build_objective("wra", model)


def test_unknown_option_and_key_errors_name_them(build_tiny):
    with pytest.raises(TypeError, match="no option.*colour"):
        build_objective("itm", build_tiny("uniter"), colour=1)
    with pytest.raises(KeyError, match="unknown key.*sample"):
        load_mix({"sample": "sum", "objectives": {"mlm": {}}})
    with pytest.raises(FileNotFoundError, match="presets: .*uniter"):
        load_mix("no-such-mix")


def test_family_defaults_and_label_conventions(build_tiny):
    itm_v = build_objective("itm", build_tiny("vilbert"))
    itm_u = build_objective("itm", build_tiny("uniter"))
    itm_m = build_objective("itm", build_tiny("meter"))
    assert (itm_v.match_index, itm_v.negatives) == (0, "text")
    assert (itm_u.match_index, itm_u.split) == (1, "bernoulli") and itm_m.split == "half"
    assert build_objective("mrc_kl", build_tiny("vilbert")).reduction == "per_region"
    assert build_objective("mrc_kl", build_tiny("uniter")).reduction == "mean"


def test_mlm_decoder_tied_for_vilbert_uniter_untied_for_meter(build_tiny):
    for family, tied in (("vilbert", True), ("uniter", True), ("meter", False)):
        model = build_tiny(family)
        mlm = build_objective("mlm", model)
        assert (mlm.predictions.decoder.weight is model.get_input_embeddings().weight) == tied


def test_mrfr_head_is_tied_to_the_region_projection(build_tiny):
    model = build_tiny("uniter")
    mrfr = build_objective("mrfr", model)
    assert mrfr.weight is model.img_embeddings.img_linear.weight


def test_meter_itm_mismatches_exactly_half(build_tiny):
    model = build_tiny("meter")
    itm = build_objective("itm", model)
    batch = model.example_batch(batch_size=7)
    batch = batch.replace(image_ids=[str(i) for i in range(7)])
    mixed, match = itm.make_pairs(batch, torch.Generator().manual_seed(0))
    assert int((~match).sum()) == 7 - 7 // 2
    changed = (mixed.pixel_values - batch.pixel_values).flatten(1).abs().sum(1) > 0
    assert changed.tolist() == (~match).tolist()


def test_vilbert_itm_replaces_captions(build_tiny):
    model = build_tiny("vilbert")
    itm = build_objective("itm", model)
    batch = model.example_batch(batch_size=8)
    mixed, match = itm.make_pairs(batch, torch.Generator().manual_seed(1))
    assert torch.equal(mixed.region_feats, batch.region_feats)
    assert ((mixed.input_ids != batch.input_ids).any(1) == ~match).all()


def _pass_masks(pre, batch, step):
    """(text masked rows, region masked rows) for each pass of a step."""
    g = torch.Generator().manual_seed(step)
    for views, _ in pre.plan(pre.active_units(step)):
        _, ctx = pre.corrupt(batch, views, g)
        text = (ctx.mlm_labels != -100).any(1) if ctx.mlm_labels is not None else torch.zeros(batch.batch_size, dtype=torch.bool)
        regions = ctx.region_masked.any(1) if ctx.region_masked is not None else torch.zeros(batch.batch_size, dtype=torch.bool)
        yield text, regions


@pytest.mark.parametrize("preset", ["uniter", "uniter_mlm_itm_mrfr_mrc_kl"])
def test_conditional_masking_never_masks_both_modalities(preset, build_tiny):
    model = build_tiny("uniter")
    pre = build_pretraining(model, preset)
    batch = model.example_batch(batch_size=6)
    for step in range(40):
        for text, regions in _pass_masks(pre, batch, step):
            assert not (text & regions).any()


def test_joint_masking_masks_both_in_some_samples(build_tiny):
    model = build_tiny("uniter")
    pre = build_pretraining(model, "uniter_joint")
    batch = model.example_batch(batch_size=6)
    both = sum(int((t & r).sum()) for step in range(20) for t, r in _pass_masks(pre, batch, step))
    assert both > 0
    vilbert = build_tiny("vilbert")
    pre = build_pretraining(vilbert, "vilbert")
    both = sum(int((t & r).sum()) for step in range(5) for t, r in _pass_masks(pre, vilbert.example_batch(6), step))
    assert both > 0


def test_masking_never_mutates_the_input_batch(build_tiny):
    model = build_tiny("vilbert")
    pre = build_pretraining(model, "vilbert")
    batch = model.example_batch(batch_size=4)
    before = {k: v.clone() for k, v in vars(batch).items() if isinstance(v, torch.Tensor)}
    pre(batch, step=0).loss.backward()
    for k, v in before.items():
        assert torch.equal(getattr(batch, k), v), k


def test_per_batch_sampling_matches_ratios_and_is_rank_independent(build_tiny):
    model = build_tiny("uniter")
    rank0 = build_pretraining(model, "uniter", seed=3)
    rank1 = build_pretraining(build_tiny("uniter"), "uniter", seed=3)
    n = 4000
    draws0 = [rank0.active_units(s)[0].name for s in range(n)]
    torch.manual_seed(123)  # global RNG state must not matter
    import random
    random.seed(99)
    draws1 = [rank1.active_units(s)[0].name for s in range(n)]
    assert draws0 == draws1
    counts = collections.Counter(draws0)
    ratios = {"itm": 30, "mlm": 40, "mrfr": 20, "mrc_kl": 20}
    observed = [counts[k] for k in ratios]
    expected = [n * r / 110 for r in ratios.values()]
    assert chisquare(observed, expected).pvalue > 0.001
    # a different seed draws a different sequence
    other = build_pretraining(model, "uniter", seed=4)
    assert [other.active_units(s)[0].name for s in range(50)] != draws0[:50]


def test_wra_rides_on_the_itm_unit(build_tiny):
    pre = build_pretraining(build_tiny("uniter"), "uniter")
    step = next(s for s in range(100) if pre.active_units(s)[0].name == "itm")
    out = pre(pre.model.example_batch(batch_size=4), step=step)
    assert out.metrics["objective/itm"] == 1.0 and out.metrics["objective/wra"] == 1.0
    assert "wra/ot_pos" in out.metrics


def _count_calls(model, name):
    calls = []
    original = getattr(model, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    setattr(model, name, counted)
    return calls


def test_meter_sum_runs_two_passes_and_encodes_the_images_once(build_tiny):
    model = build_tiny("meter")  # tiny presets have no dropout: unimodal encodings are shared by the passes
    pre = build_pretraining(model, "meter")
    passes = pre.plan(pre.active_units(0))
    assert [sorted(v) for v, _ in passes] == [["text"], ["pairs"]]
    fused, images, texts = (_count_calls(model, n) for n in ("fuse", "encode_image", "encode_text"))
    pre(model.example_batch(batch_size=4), step=0)
    assert (len(fused), len(images), len(texts)) == (2, 1, 2)  # masked text, clean text; images permuted


@pytest.mark.parametrize("family", ["vilbert", "uniter", "meter"])
def test_shared_encodings_give_the_same_loss_and_gradients(build_tiny, family):
    from unittest import mock

    from vlkit.objectives import mix

    model = build_tiny(family)
    cfg = load_mix(family)
    cfg["objectives"]["itc"] = {"weight": 1.0, "every_step": True}
    pre = build_pretraining(model, cfg).train()
    batch = model.example_batch(batch_size=6, seed=1).replace(image_ids=[str(i) for i in range(6)])
    results = []
    for reuse in (True, False):
        pre.zero_grad()
        torch.manual_seed(5)  # the same dropout masks in the heads
        with mock.patch.object(mix, "stochastic", return_value=not reuse):
            out = pre(batch, step=3)
        out.loss.backward()
        results.append((out.loss.detach(), [p.grad.clone() for p in pre.parameters() if p.grad is not None]))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(results[0][1], results[1][1]))


def test_meter_shares_its_deterministic_image_tower_when_the_text_tower_has_dropout(build_tiny):
    """CLIP has no dropout: its encoding is shared by the MLM and ITM passes while the text (dropout 0.1) is
    encoded per pass; loss and gradients equal encoding everything per pass (same dropout draws)."""
    from unittest import mock

    text_config = {**MeterConfig.presets["tiny"]["text_config"], "hidden_dropout_prob": 0.1}
    model = build_tiny("meter", text_config=text_config, drop_rate=0.1)
    pre = build_pretraining(model, "meter").train()
    batch = model.example_batch(batch_size=4, seed=2).replace(image_ids=[str(i) for i in range(4)])
    results = []
    for shared in (True, False):
        pre.zero_grad()
        images = _count_calls(model, "encode_image")
        torch.manual_seed(3)
        with mock.patch.object(type(model), "encoding_modules", lambda self, side: (self,)) if not shared else \
                contextlib.nullcontext():
            out = pre.train()(batch, step=0)  # train(): which encodings draw random numbers is read again
        out.loss.backward()
        assert len(images) == (1 if shared else 2)
        results.append((out.loss.detach(), [p.grad.clone() for p in pre.parameters() if p.grad is not None]))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-6)
    assert len(results[0][1]) == len(results[1][1])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(results[0][1], results[1][1]))


@pytest.mark.parametrize("family,mix", [("meter", "meter"), ("uniter", "uniter_itm"), ("vilbert", "vilbert")])
def test_joint_only_passes_fuse_pooled_positions_only(build_tiny, family, mix):
    """An ITM-only pass runs the last fusion layers at the pooled positions: the same loss and gradients."""
    from unittest import mock

    from vlkit.objectives.itm import ImageTextMatching

    model = build_tiny(family)
    pre = build_pretraining(model, mix).train()
    batch = model.example_batch(batch_size=4, seed=3).replace(image_ids=[str(i) for i in range(4)])
    results = []
    for joint_only in (True, False):
        pre.zero_grad()
        torch.manual_seed(5)  # ViLBERT's ITM head has dropout
        with mock.patch.object(ImageTextMatching, "joint_only", joint_only):
            out = pre(batch, step=0)
        out.loss.backward()
        results.append((out.loss.detach(), [p.grad.clone() for p in pre.parameters() if p.grad is not None]))
    _assert_same_loss_and_gradients(*results)


@pytest.mark.parametrize("family,mix,steps", [
    ("vilbert", "vilbert", [0]), ("meter", "meter", [0]), ("uniter", "uniter", range(8)),
    ("vilbert", {"sampling": "sum", "masking": "conditional", "objectives": {"mlm": {}, "mrc_kl": {}}}, [0])])
def test_last_layers_at_the_read_positions_keep_loss_and_gradients(build_tiny, family, mix, steps):
    """The mixture asks the model for the positions its objectives read (masked tokens, masked regions,
    the pooled ones): the last layers compute only those, with the loss and gradients of the full run."""
    from unittest import mock

    model = build_tiny(family)
    pre = build_pretraining(model, mix).train()
    assert pre._keep_rows
    batch = model.example_batch(batch_size=4, seed=5, text_len=14, num_regions=9)
    batch = batch.replace(image_ids=[str(i) for i in range(4)])
    calls, fuse = [], model.fuse
    model.fuse = lambda *args, **kwargs: calls.append(kwargs) or fuse(*args, **kwargs)
    for step in steps:
        results = []
        for prune in (True, False):
            pre.zero_grad()
            torch.manual_seed(5)
            with mock.patch.object(pre, "_keep_rows", prune):
                out = pre(batch, step=step)
            out.loss.backward()
            results.append((out.loss.detach(), [p.grad.clone() for p in pre.parameters() if p.grad is not None]))
        _assert_same_loss_and_gradients(*results)
    assert any("keep_rows" in c for c in calls)  # the pruned path ran


def test_stochastic_sees_dropout_only_in_training(build_tiny):
    from vlkit.objectives.mix import stochastic

    tiny, base_like = build_tiny("uniter").train(), build_tiny("uniter", hidden_dropout_prob=0.1).train()
    assert not stochastic(tiny) and stochastic(base_like) and not stochastic(base_like.eval())


def test_every_preset_loads_and_builds(build_tiny):
    presets = sorted(p.stem for p in PRESET_DIR.glob("*.yaml") if p.stem != "none")  # none: no mix
    assert {"vilbert", "uniter", "meter", "uniter_mlm_itm", "uniter_joint", "meter_mim_inbatch",
            "meter_mim_discrete"} <= set(presets)
    for preset in presets:
        family = preset.split("_")[0]
        pre = build_pretraining(build_tiny(family), preset)
        assert len(pre.units) >= 1


def _pairs(model, n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = model.example_batch(batch_size=n, seed=seed, text_len=8, num_regions=6)
    ids = torch.randint(5, 60, (n, 8), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    feats = torch.randn(batch.region_feats.shape, generator=g) if batch.has_regions else None
    pixels = torch.randn(batch.pixel_values.shape, generator=g) if batch.has_pixels else None
    return batch.replace(input_ids=ids, attention_mask=torch.ones_like(ids), region_feats=feats, pixel_values=pixels,
                         region_mask=torch.ones_like(batch.region_mask) if batch.has_regions else None,
                         image_ids=[f"img{i}" for i in range(n)])


@pytest.mark.parametrize("family", ["vilbert", "uniter", "meter"])
def test_tiny_model_overfits_16_pairs_with_its_own_recipe(family, build_tiny):
    torch.manual_seed(0)
    model = build_tiny(family, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0) if family != "meter" \
        else build_tiny(family, drop_rate=0.0)
    pre = build_pretraining(model, family, seed=0).train()
    batch = _pairs(model)
    opt = torch.optim.AdamW(pre.parameters(), lr=1e-3)
    for step in range({"vilbert": 400, "uniter": 500, "meter": 300}[family]):
        opt.zero_grad()
        pre(batch, step=step).loss.backward()
        opt.step()
    pre.eval()
    mlm, itm = [], []
    with torch.no_grad():
        for step in range(1000, 1030):
            m = pre(batch, step=step).metrics
            if "mlm/acc" in m:
                mlm.append(float(m["mlm/acc"]))
            if "itm/acc" in m:
                itm.append(float(m["itm/acc"]))
    assert sum(mlm) / len(mlm) > 0.9, mlm
    assert sum(itm) / len(itm) > 0.9, itm


def test_top_level_api_builds_an_objective_and_a_pretraining(build_tiny):
    import vlkit

    model = build_tiny("uniter")
    assert {"mlm", "mrfr", "mrc", "mrc_kl", "itm", "wra", "mim"} <= set(vlkit.list_objectives())
    itm = vlkit.build_objective("itm", model, negatives="image", split="half")
    assert itm.split == "half"
    with pytest.raises(TypeError, match="no option"):
        vlkit.build_objective("itm", model=model, not_an_option=1)
    pre = vlkit.build_pretraining(model, "uniter")
    out = pre(model.example_batch(batch_size=2), step=0)
    assert torch.isfinite(out.loss) and any(k.startswith("objective/") for k in out.metrics)


def test_itc_runs_every_step_beside_the_drawn_unit(build_tiny):
    cfg = load_mix("uniter")
    cfg["objectives"]["itc"] = {"weight": 0.5, "every_step": True}
    pre = build_pretraining(build_tiny("uniter"), cfg)
    for step in range(20):
        units = [u.name for u in pre.active_units(step)]
        assert units[-1] == "itc" and len(units) == 2 and units[0] != "itc"
    assert [u.name for u in build_pretraining(build_tiny("uniter"), "uniter").active_units(3)] == \
        [u.name for u in pre.active_units(3)][:1]  # the draw of the recipe's own units is unchanged
    passes = pre.plan(pre.active_units(0))
    assert passes[-1] == (frozenset(["unimodal"]), [("itc", 0.5)])


def test_itc_counts_captions_of_one_image_as_positives(build_tiny):
    from vlkit.objectives.base import PassContext

    model = build_tiny("meter")
    itc = build_objective("itc", model, dim=16)
    batch = model.example_batch(batch_size=4, seed=2)
    batch = batch.replace(image_ids=["a", "a", "b", "c"], pixel_values=batch.pixel_values[[0, 0, 2, 3]])
    text, image = model.encode_text(batch), model.encode_image(batch)
    out = itc((text, image), batch, PassContext(original=batch))
    assert out.loss.item() > 0 and 0 <= out.metrics["acc"] <= 1
    # a perfect aligner: caption embedding = image embedding -> the loss only holds the temperature's floor
    same = (text, type(text)(text.states, text.mask))
    with torch.no_grad():
        itc.vision_proj.weight.copy_(itc.text_proj.weight)
        itc.vision_proj.bias.copy_(itc.text_proj.bias)
    aligned = itc(same, batch.replace(image_ids=["a", "b", "c", "d"]), PassContext(original=batch))
    assert aligned.metrics["acc"] == 1.0


def test_itc_learns_to_align_on_shapes_sized_inputs(build_tiny):
    torch.manual_seed(0)
    model = build_tiny("uniter").train()
    pre = build_pretraining(model, {"sampling": "sum", "objectives": {"itc": {"weight": 1.0, "dim": 32}}})
    batch = model.example_batch(batch_size=8, seed=3).replace(image_ids=[str(i) for i in range(8)])
    opt = torch.optim.AdamW(pre.parameters(), lr=3e-3)
    first = pre(batch, step=0)
    for step in range(60):
        out = pre(batch, step=step)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert out.loss.item() < 0.5 * first.loss.item() and out.metrics["itc/acc"] == 1.0


def test_kmeans_codebook_seeds_one_centre_per_cluster_and_is_seeded():
    """MIM's k-means codebook: k-means++ seeding (incremental distances) puts one centre in each of three
    well-separated clusters; the fit is a function of its seed."""
    import numpy as np

    from vlkit.objectives.mim import KMeansPatchTokenizer, _kmeans_plusplus

    rng = np.random.default_rng(0)
    means = np.array([[0.0, 0.0], [20.0, 20.0], [-20.0, 20.0]])
    x = np.repeat(means, 500, 0) + rng.normal(size=(1500, 2))
    for seed in range(5):
        centres = _kmeans_plusplus(x, 3, np.random.default_rng(seed))
        nearest = np.linalg.norm(centres[:, None] - means[None], axis=-1).argmin(1)
        assert sorted(nearest.tolist()) == [0, 1, 2], (seed, centres)
    pixels = torch.rand(24, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    a, b, c = (KMeansPatchTokenizer(8, 16).fit(pixels, seed=s) for s in (0, 0, 1))
    assert torch.equal(a.centroids, b.centroids) and not torch.equal(a.centroids, c.centroids)
    assert a.encode(pixels, 16).shape == (24, 4)
