"""METER: the official Lightning checkpoints (CLIP-ViT/16 and Swin towers, pre-training and VQA) converted; the
fixtures' raw images read from PNG files through vlkit's pixel pipeline; outputs equal the official ones."""
from __future__ import annotations

import pytest
import torch

from official_fixtures import close, fixture_path, meta
from vlkit.convert import from_official
from vlkit.data.collate import VLCollator
from vlkit.data.images import FolderImages, PixelSource
from vlkit.features.patches import pixel_transform
from vlkit.objectives.base import PassContext
from vlkit.objectives.itm import swap_images

# the text tower's heads are not in the shapes (roberta-base has 12); the tiny fixture's has 2
TEXT = {"text_config": {"num_attention_heads": 2}}
ROBERTA_PAD = 1


def _convert(name, **config):
    return from_official("meter", fixture_path(f"{name}.ckpt"), config={**TEXT, **config})


def _batch(t, images, transform, size, prefix="in", targets=None):
    """The captions' official ids with each caption's own image through the pixel pipeline."""
    source = PixelSource(FolderImages(images), pixel_transform(transform, size))
    mask = t[f"{prefix}.text_masks"].bool()
    examples = []
    for i in range(4):
        example = dict(id=str(i), image_id=f"image{i}", input_ids=t[f"{prefix}.text_ids"][i][mask[i]],
                       **source(f"image{i}"))
        if targets is not None:
            example["targets"] = {"soft_targets": targets[i]}
        examples.append(example)
    return VLCollator(pad_token_id=ROBERTA_PAD)(examples)


def _pretraining_parity(pre, t, batch, name):
    """METER's two passes: masked text with its own image (MLM), clean text with an exact half of
    mismatched images (ITM)."""
    length = batch.input_ids.shape[1]
    objectives = pre.objectives
    with torch.no_grad():
        labels = t["mlm.in.text_labels_mlm"][:, :length]
        masked = batch.replace(input_ids=t["mlm.in.text_ids_mlm"][:, :length])
        out = pre.model(masked)
        close(out.text_states, t["mlm.infer0.text_feats"][:, :length], f"{name} mlm text_feats")
        close(out.image_states, t["mlm.infer0.image_feats"], f"{name} mlm image_feats")
        close(out.text_pooled, t["mlm.infer0.cls_feats_text"], f"{name} cls_feats_text")
        close(out.image_pooled, t["mlm.infer0.cls_feats_image"], f"{name} cls_feats_image")
        close(out.joint, t["mlm.infer0.cls_feats"], f"{name} mlm cls_feats")
        close(objectives["mlm"].predictions(out.text_states), t["mlm.out.mlm_logits"][:, :length], f"{name} mlm_logits")
        close(objectives["mlm"](out, masked, PassContext(original=batch, mlm_labels=labels)).loss, t["mlm.out.mlm_loss"],
              f"{name} mlm_loss")
        matched = t["itm.in.itm_labels"].bool()
        pairs = swap_images(batch, torch.where(matched, torch.arange(4), t["choice.false_image_index"]))
        out = pre.model(pairs)
        close(out.text_states, t["itm.infer0.text_feats"][:, :length], f"{name} itm text_feats")
        close(out.image_states, t["itm.infer0.image_feats"], f"{name} itm image_feats")
        close(out.joint, t["itm.infer0.cls_feats"], f"{name} itm cls_feats")
        close(objectives["itm"].logits(out), t["itm.out.itm_logits"], f"{name} itm_logits (index 1 = match)")
        close(objectives["itm"](out, pairs, PassContext(original=pairs, itm_match=matched)).loss, t["itm.out.itm_loss"],
              f"{name} itm_loss")


def test_clip16_pretraining_parity(tensors, meter_images):
    t = tensors("meter_clip16_pretrain")
    _pretraining_parity(_convert("meter_clip16_pretrain"), t, _batch(t, meter_images, "clip", 32), "clip16")


def test_clip16_retrieval_head_from_itm(tensors, meter_images):
    """``rank_output`` = ``itm_score.fc.weight[1:]`` [1, 2H] (the official irtr set-up) scores image 0 with
    captions 0-3 as the official compute_irtr does."""
    from vlkit.tasks import build_task

    t = tensors("meter_clip16_pretrain")
    task = build_task("retrieval", _convert("meter_clip16_pretrain"))
    close(task.rank_output.weight, t["irtr.rank_output.weight"], "rank_output.weight", atol=0.0)
    source = PixelSource(FolderImages(meter_images), pixel_transform("clip", 32))
    mask = t["in.text_masks"].bool()
    batch = VLCollator(pad_token_id=ROBERTA_PAD)(
        [dict(id=str(k), image_id="image0", input_ids=t["in.text_ids"][k][mask[k]], **source("image0")) for k in range(4)])
    close(task.predict(batch)["score"], t["irtr.out.rank_scores"], "rank scores")


def test_swin_pretraining_parity(tensors, meter_images):
    t = tensors("meter_swin_pretrain")
    pre = _convert("meter_swin_pretrain")
    assert pre.model.config.vision_encoder == "swin" and pre.model.config.vision_kwargs["window_size"] == 2
    _pretraining_parity(pre, t, _batch(t, meter_images, "imagenet", 64), "swin")


def test_clip16_vqa_parity(tensors, meter_images):
    t = tensors("meter_clip16_vqa")
    task = _convert("meter_clip16_vqa")
    assert task.name == "vqa" and task.model.config.image_size == 48  # the checkpoint's hyper_parameters
    batch = _batch(t, meter_images, "clip", 48, prefix="vqa.in", targets=t["vqa.in.vqa_targets"])
    with torch.no_grad():
        out = task.model(batch)
        length = out.text_states.shape[1]
        close(out.text_states, t["vqa.infer0.text_feats"][:, :length], "vqa text_feats")
        close(out.image_states, t["vqa.infer0.image_feats"], "vqa image_feats")
        close(out.joint, t["vqa.infer0.cls_feats"], "vqa cls_feats")
        close(task.logits(batch), t["vqa.out.vqa_logits"], "vqa_logits")
        close(task(batch).loss, t["vqa.out.vqa_loss"], "vqa_loss (BCE mean x answers)")


def test_pretraining_checkpoint_at_another_image_size(tensors, meter_images):
    """The VQA model is the pre-training checkpoint loaded at 48 px (bicubic position table 2x2 -> 3x3): so is
    vlkit's conversion of that checkpoint with image_size=48."""
    t = tensors("meter_clip16_vqa")
    pre, report = from_official("meter", fixture_path("meter_clip16_pretrain.ckpt"), config={**TEXT, "image_size": 48},
                                return_report=True)
    assert any("2^2 -> 3^2" in note for note in report.transformed)
    batch = _batch(t, meter_images, "clip", 48, prefix="vqa.in")
    with torch.no_grad():
        out = pre.model(batch)
    close(out.image_states, t["vqa.infer0.image_feats"], "image_feats at 48 px")
    close(out.joint, t["vqa.infer0.cls_feats"], "cls_feats at 48 px")


def test_known_unused_keys(tmp_path):
    _, report = from_official("meter", fixture_path("meter_clip16_pretrain.ckpt"), config=TEXT, return_report=True)
    assert set(report.unused) == {"vit_model.positional_embedding", "vit_model.ln_final.weight", "vit_model.ln_final.bias",
                                  "text_transformer.embeddings.position_ids", "text_transformer.pooler.dense.weight",
                                  "text_transformer.pooler.dense.bias"}
    _, report = from_official("meter", fixture_path("meter_swin_pretrain.ckpt"), config=TEXT, return_report=True)
    assert sum("relative_position_index" in k or "attn_mask" in k for k in report.unused) == 9


def _finetuned(head_shapes, types=2, seed=0):
    ckpt = torch.load(fixture_path("meter_clip16_vqa.ckpt"), weights_only=True)
    state = {k: v for k, v in ckpt["state_dict"].items() if not k.startswith("vqa_classifier.")}
    if types == 3:  # the official NLVR2 set-up: row 2 copies row 1
        emb = state["token_type_embeddings.weight"]
        state["token_type_embeddings.weight"] = torch.cat([emb, emb[1:]])
    g = torch.Generator().manual_seed(seed)
    state.update({k: torch.randn(s, generator=g) for k, s in head_shapes.items()})
    return {**ckpt, "state_dict": state}


@pytest.mark.parametrize("layout", ["nlvr2", "snli", "irtr"])
def test_finetuned_layouts(layout, tmp_path):
    """``nlvr2_classifier`` (3 token types), ``snli_classifier`` and ``rank_output`` [1, 2H] with the frozen
    ``itm_score`` (meter_module.py L126-157) land on the vlkit task heads."""
    h = 32
    classifier = lambda name, inp, out: {f"{name}.0.weight": (2 * h, inp), f"{name}.0.bias": (2 * h,),  # noqa: E731
                                         f"{name}.1.weight": (2 * h,), f"{name}.1.bias": (2 * h,),
                                         f"{name}.3.weight": (out, 2 * h), f"{name}.3.bias": (out,)}
    heads = {"nlvr2": classifier("nlvr2_classifier", 4 * h, 2), "snli": classifier("snli_classifier", 2 * h, 3),
             "irtr": {"rank_output.weight": (1, 2 * h), "rank_output.bias": (1,), "itm_score.fc.weight": (2, 2 * h),
                      "itm_score.fc.bias": (2,)}}[layout]
    ckpt = _finetuned(heads, types=3 if layout == "nlvr2" else 2)
    torch.save(ckpt, tmp_path / f"{layout}.ckpt")
    task = from_official("meter", tmp_path / f"{layout}.ckpt", config=TEXT)
    assert task.name == {"nlvr2": "nlvr2", "snli": "snli_ve", "irtr": "retrieval"}[layout]
    params = task.state_dict()
    for official in heads:
        ours = official.replace("itm_score.", "itm.itm_head.")
        assert torch.equal(params[ours], ckpt["state_dict"][official]), official
    if layout == "nlvr2":
        assert task.model.token_type_embeddings.num_embeddings == 3
    if layout == "irtr":
        assert not any(p.requires_grad for p in task.itm.parameters())  # frozen itm_score while fine-tuning IRTR
    if layout == "snli":
        assert task.label_names == ["contradiction", "neutral", "entailment"]


def test_hyper_parameters_supply_the_config():
    pre = _convert("meter_clip16_pretrain")
    c = pre.model.config
    saved = meta("meter_clip16_pretrain")["config"]
    assert (c.image_size, c.patch_size, c.num_top_layer, c.num_heads) == (saved["image_size"], saved["patch_size"],
                                                                          saved["num_top_layer"], saved["num_heads"])
    assert c.text_encoder == "roberta" and c.vision_layers == 2 and c.vision_heads == 2
