"""UNITER: the official pre-training and VQA checkpoints converted; the fixtures' npz files imported into a
vlkit store and fed through the region source and collator; outputs equal the official ones."""
from __future__ import annotations

import pytest
import torch

from official_fixtures import close, fixture_path, meta
from vlkit.convert import from_official
from vlkit.data.collate import VLCollator
from vlkit.data.images import RegionSource
from vlkit.objectives.base import PassContext
from vlkit.objectives.itm import swap_images


@pytest.fixture(scope="module")
def config():
    return meta("uniter_pretrain")["config_json"]  # uniter-base.json keys, tiny values


@pytest.fixture(scope="module")
def pretraining(config):
    return from_official("uniter", fixture_path("uniter_pretrain.pt"), config=config)


@pytest.fixture(scope="module")
def batch(tensors, uniter_store):
    """``[CLS] ids [SEP]`` with each text's image, boxes chosen by UNITER's confidence rule at load time."""
    t = tensors("uniter_pretrain")
    source = RegionSource(uniter_store)  # conf_th 0.2, max_bb 100, min_bb 10
    examples = [dict(id=str(i), image_id=f"img{i}", input_ids=torch.tensor([101, *t[f"raw.txt{i}.input_ids"], 102]),
                     **source(f"img{i}")) for i in range(4)]
    return VLCollator()(examples)


def _compare_sequence(out, batch, official, what):
    """UNITER gathers each example's regions right after its own text; vlkit keeps [text | regions]."""
    text_len, regions = batch.attention_mask.sum(1).tolist(), batch.region_mask.sum(1).tolist()
    for b, (tl, nbb) in enumerate(zip(text_len, regions)):
        close(out.text_states[b, :tl], official[b, :tl], f"{what} text states, example {b}")
        close(out.image_states[b, :nbb], official[b, tl:tl + nbb], f"{what} region states, example {b}")


def test_box_counts_follow_the_confidence_rule(batch, tensors):
    t = tensors("uniter_pretrain")
    assert batch.region_mask.sum(1).tolist() == [int(t[f"npz.img{i}.nbb"]) for i in range(4)]


def test_mlm_parity(pretraining, batch, tensors):
    t = tensors("uniter_pretrain")
    labels = t["mlm.in.txt_labels"].masked_fill(t["mlm.in.txt_labels"] == -1, -100)
    masked = batch.replace(input_ids=t["mlm.in.input_ids"])
    with torch.no_grad():
        out = pretraining.model(masked)
        _compare_sequence(out, batch, t["mlm.out.sequence_output"], "mlm")
        close(out.joint, t["mlm.out.pooled_output"], "mlm pooled_output")
        mlm = pretraining.objectives["mlm"]
        close(mlm.predictions(out.text_states[labels != -100]), t["mlm.out.mlm.prediction"], "mlm prediction")
        loss = mlm(out, masked, PassContext(original=batch, mlm_labels=labels)).loss
        close(loss, t["mlm.out.mlm.loss_unreduced"].mean(), "mlm loss")


@pytest.mark.parametrize("tag", ["mrfr", "mrc"])
def test_masked_region_parity(tag, pretraining, batch, tensors):
    """MRM zeroes the chosen features and adds the learned mask embedding; one region_classifier serves
    MRC and MRC-kl; MRFR regresses through img_linear's transposed weight."""
    t = tensors("uniter_pretrain")
    chosen = t[f"{tag}.in.img_masks"].bool()
    masked = batch.replace(region_feats=batch.region_feats.masked_fill(chosen[..., None], 0), region_masked=chosen)
    ctx = PassContext(original=batch, region_masked=chosen)
    objectives = pretraining.objectives
    with torch.no_grad():
        out = pretraining.model(masked)
        _compare_sequence(out, batch, t[f"{tag}.out.sequence_output"], tag)
        close(out.joint, t[f"{tag}.out.pooled_output"], f"{tag} pooled_output")
        states = out.region_states[chosen]
        if tag == "mrfr":
            mrfr = objectives["mrfr"]
            prediction = torch.nn.functional.linear(mrfr.net(states), mrfr.weight.t(), mrfr.bias)
            close(prediction, t["mrfr.out.mrfr.prediction"], "mrfr prediction")
            close(mrfr(out, masked, ctx).loss, t["mrfr.out.mrfr.loss_unreduced"].mean(), "mrfr loss")
        else:
            close(objectives["mrc"].predictions(states), t["mrc.out.mrc.prediction"], "mrc prediction")
            close(objectives["mrc"](out, masked, ctx).loss, t["mrc.out.mrc.loss_unreduced"].mean(), "mrc loss")
            close(objectives["mrc_kl"](out, masked, ctx).loss, t["mrc.out.mrc-kl.loss_unreduced"].mean(), "mrc-kl loss")


def test_itm_and_wra_parity(pretraining, batch, tensors):
    t = tensors("uniter_pretrain")
    matched = t["itm.choice.labels"].bool()
    pairs = swap_images(batch, t["itm.choice.train_imgs"])  # the official negative image of each example
    ctx = PassContext(original=pairs, itm_match=matched)
    objectives = pretraining.objectives
    with torch.no_grad():
        out = pretraining.model(pairs)
        _compare_sequence(out, pairs, t["itm.out.sequence_output"], "itm")
        close(objectives["itm"].logits(out), t["itm.out.itm_scores"], "itm scores (index 1 = match)")
        close(objectives["itm"](out, pairs, ctx).loss, t["itm.out.itm_loss_per_example"].mean(), "itm loss")
        close(objectives["wra"].distance(out), t["itm.out.ot_dist"], "OT distance")
        losses = meta("uniter_pretrain")["losses"]["itm"]
        close(objectives["wra"](out, pairs, ctx).loss, torch.tensor(losses["ot_loss"]), "OT loss")


def test_stored_box_size_is_used(pretraining, batch, tensors):
    """The 7-d position multiplies the stored fp16 w/W, h/H; recomputing them from the corners moves the outputs."""
    t = tensors("uniter_pretrain")
    close(batch.region_wh[0, :13], t["npz.img0.norm_bb"][:13, 4:6].float(), "stored w, h", atol=0.0)
    with torch.no_grad():
        stored, recomputed = pretraining.model(batch), pretraining.model(batch.replace(region_wh=None))
    assert (stored.joint - recomputed.joint).abs().max() > 1e-5


def test_vqa_parity(config, batch, tensors):
    t = tensors("uniter_vqa")
    task = from_official("uniter", fixture_path("uniter_vqa.pt"), config=config)
    assert task.name == "vqa" and task.num_answers == 23
    targets = t["vqa.in.targets"]
    with torch.no_grad():
        out = task.model(batch)
        _compare_sequence(out, batch, t["vqa.out.sequence_output"], "vqa")
        close(out.joint, t["vqa.out.pooled_output"], "vqa pooled_output")
        close(task.logits(batch), t["vqa.out.answer_scores"], "answer_scores")
        loss = task(batch.replace(targets={"soft_targets": targets})).loss
        close(loss, torch.tensor(meta("uniter_vqa")["vqa_loss_train_reduction"]), "VQA loss (mean x answers)")


def test_checkpoint_quirks(pretraining, tensors):
    state = torch.load(fixture_path("uniter_pretrain.pt"), weights_only=True)
    model, objectives = pretraining.model, pretraining.objectives
    assert state["uniter.img_embeddings.mask_embedding.weight"][0].abs().sum() > 0
    assert model.img_embeddings.mask_embedding.weight[0].eq(0).all()  # zeroed as the official forward does
    assert objectives["mrfr"].weight is model.img_embeddings.img_linear.weight  # feat_regress tied to img_linear
    assert objectives["mlm"].predictions.decoder.weight is model.embeddings.word_embeddings.weight
    assert objectives["mrc"].predictions is objectives["mrc_kl"].predictions  # one region_classifier


def test_fp16_checkpoint_is_cast(config, tmp_path):
    """Released UNITER files were trained with apex O2: fp16 tensors load as fp32."""
    state = {k: v.half() for k, v in torch.load(fixture_path("uniter_vqa.pt"), weights_only=True).items()}
    torch.save(state, tmp_path / "vqa_fp16.pt")
    task, report = from_official("uniter", tmp_path / "vqa_fp16.pt", config=config, return_report=True)
    assert len(report.cast) == len(state) and all(p.dtype == torch.float32 for p in task.parameters())
    assert torch.equal(task.vqa_output[0].weight, state["vqa_output.0.weight"].float())


def _backbone(types=2):
    state = {k: v for k, v in torch.load(fixture_path("uniter_vqa.pt"), weights_only=True).items()
             if k.startswith("uniter.")}
    if types == 3:  # init_type_embedding: row 2 copies row 1
        emb = state["uniter.embeddings.token_type_embeddings.weight"]
        state["uniter.embeddings.token_type_embeddings.weight"] = torch.cat([emb, emb[1:]])
    return state


def _random(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


@pytest.mark.parametrize("layout,task_name,expect", [
    ("itr", "retrieval", {"rank_output.weight": "rank_output.weight", "itm_output.bias": "itm.itm_head.fc.bias"}),
    ("nlvr2_paired", "nlvr2", {"nlvr2_output.weight": "nlvr2_output.weight"}),
    ("nlvr2_attn", "nlvr2", {"attn1.in_proj_weight": "attn1.in_proj_weight", "attn2.out_proj.bias": "attn2.out_proj.bias",
                             "fc.0.weight": "fc.0.weight", "attn_pool.fc.0.weight": "attn_pool.fc.0.weight"}),
    ("re_mlp1", "refexp", {"re_output.weight": "re_output.weight"}),
    ("re_mlp2", "refexp", {"re_output.3.weight": "re_output.3.weight", "re_output.2.bias": "re_output.2.bias"}),
    ("ve", "snli_ve", {"vqa_output.3.weight": "vqa_output.3.weight"}),
])
def test_finetuned_layouts(layout, task_name, expect, config):
    """The fine-tuned models' head names (model/itm.py, nlvr2.py, re.py, ve.py) land on the vlkit task heads."""
    h = 48
    heads = {
        "itr": {"itm_output.weight": (2, h), "itm_output.bias": (2,), "rank_output.weight": (1, h), "rank_output.bias": (1,)},
        "nlvr2_paired": {"nlvr2_output.weight": (2, 2 * h), "nlvr2_output.bias": (2,)},
        "nlvr2_attn": {**{f"attn{i}.{k}": s for i in (1, 2) for k, s in (
            ("in_proj_weight", (3 * h, h)), ("in_proj_bias", (3 * h,)), ("out_proj.weight", (h, h)), ("out_proj.bias", (h,)))},
            "fc.0.weight": (h, 2 * h), "fc.0.bias": (h,), "attn_pool.fc.0.weight": (1, h), "attn_pool.fc.0.bias": (1,),
            "nlvr2_output.weight": (2, 2 * h), "nlvr2_output.bias": (2,)},
        "re_mlp1": {"re_output.weight": (1, h), "re_output.bias": (1,)},
        "re_mlp2": {"re_output.0.weight": (h, h), "re_output.0.bias": (h,), "re_output.2.weight": (h,),
                    "re_output.2.bias": (h,), "re_output.3.weight": (1, h), "re_output.3.bias": (1,)},
        "ve": {"vqa_output.0.weight": (2 * h, h), "vqa_output.0.bias": (2 * h,), "vqa_output.2.weight": (2 * h,),
               "vqa_output.2.bias": (2 * h,), "vqa_output.3.weight": (3, 2 * h), "vqa_output.3.bias": (3,)},
    }[layout]
    state = {**_backbone(types=3 if task_name == "nlvr2" else 2), **_random(heads)}
    task, report = from_official("uniter", state, config=config, return_report=True)
    assert task.name == task_name and not report.unused
    params = task.state_dict()
    for official, ours in expect.items():
        assert torch.equal(params[ours], state[official]), f"{official} -> {ours}"
    if layout == "ve":
        assert task.label_names == ["contradiction", "entailment", "neutral"]
    if layout.startswith("re"):
        assert isinstance(task.head, torch.nn.Sequential) == (layout == "re_mlp2")


def test_backbone_only_gives_the_model(config):
    """A file without heads converts to the bare model; ``task="model"`` drops the heads of one that has them."""
    from vlkit.models.uniter import Uniter

    assert isinstance(from_official("uniter", _backbone(), config=config), Uniter)
    model, report = from_official("uniter", fixture_path("uniter_pretrain.pt"), config=config, task="model",
                                  return_report=True)
    assert isinstance(model, Uniter) and "task=pretraining" in report.unused["itm_output.weight"]
