"""ViLBERT: the official pre-training and multi-task checkpoints converted, fed the fixtures' raw inputs
through vlkit's store, image source, collator and task modules; outputs equal the official ones."""
from __future__ import annotations

import pytest
import torch

from official_fixtures import IdTokenizer, close, fixture_path, ids_text, meta
from vlkit.convert import from_official
from vlkit.data.collate import VLCollator
from vlkit.data.images import RegionSource
from vlkit.data.pairs import ImageTextPairs
from vlkit.objectives.base import PassContext

MAX_REGION_NUM = 8  # the fixture's max_region_num: [IMG] + 7 regions


@pytest.fixture(scope="module")
def config():
    return meta("vilbert_pretrain")["config_json"]  # bert_base_6layer_6conect.json keys, tiny values


@pytest.fixture(scope="module")
def pretraining(config):
    return from_official("vilbert", fixture_path("vilbert_pretrain.bin"), config=config)


def _pretraining_pass(t, store):
    """The clean batch through vlkit's input path and the official random choices applied to it."""
    source = RegionSource(store, num_bb=8)
    mask = t["in.input_mask"].bool()
    examples = [dict(id=str(b), image_id=f"cc{b}", input_ids=t["choice.caption_ids_unmasked"][b][mask[b]],
                     **source(f"cc{b}")) for b in range(4)]
    batch = VLCollator()(examples)
    length = batch.input_ids.shape[1]
    zeroed = t["choice.region_zeroed"].bool()
    corrupted = batch.replace(input_ids=t["in.input_ids"][:, :length],
                              region_feats=batch.region_feats.masked_fill(zeroed[..., None], 0),
                              region_masked=t["choice.region_chosen"].bool())
    labels = t["choice.lm_label_ids"][:, :length]
    return batch, corrupted, labels.masked_fill(labels == -1, -100)


def test_pretraining_parity(pretraining, tensors, vilbert_stores):
    t = tensors("vilbert_pretrain")
    batch, corrupted, labels = _pretraining_pass(t, vilbert_stores["pretrain"])
    length = batch.input_ids.shape[1]
    objectives = pretraining.objectives
    with torch.no_grad():
        out = pretraining.model(corrupted)
        close(out.text_states, t["out.seq_t"][:, :length], "sequence_output_t")
        close(out.image_states, t["out.seq_v"], "sequence_output_v")
        close(out.text_pooled, t["out.pooled_t"], "pooled_output_t")
        close(out.image_pooled, t["out.pooled_v"], "pooled_output_v")
        close(out.joint, t["out.joint"], "pooled_t * pooled_v")
        close(objectives["mlm"].predictions(out.text_states), t["out.mlm_logits"][:, :length], "MLM logits")
        close(objectives["mrc_kl"].predictions(out.image_states), t["out.region_logits"], "region logits")
        close(objectives["itm"].logits(out), t["out.itm_logits"], "alignment logits (index 0 = match)")
        match = t["choice.is_next"] == 0
        for tag, rows in (("obj0", None), ("obj1", match)):  # --objective 1: no MLM / MRC loss on mismatched pairs
            ctx = PassContext(original=batch.replace(input_ids=corrupted.input_ids), mlm_labels=labels,
                              region_masked=corrupted.region_masked, itm_match=match, score_rows=rows)
            for name, official in (("mlm", "masked_lm"), ("mrc_kl", "masked_img"), ("itm", "next_sentence")):
                close(objectives[name](out, corrupted, ctx).loss, t[f"out.loss_{tag}.{official}"][0],
                      f"{tag} {official} loss")


def test_pretraining_img_token_rule_is_the_official_one(pretraining, tensors, vilbert_stores):
    """The pre-training [IMG] divisor counts slots neither masked nor overlapping a masked region; the
    plain mean (``img_feature="mean"``) is an option and moves the pooled outputs visibly."""
    t = tensors("vilbert_pretrain")
    _, corrupted, _ = _pretraining_pass(t, vilbert_stores["pretrain"])
    masked_label = t["choice.masked_label"].bool()
    divisor = (masked_label.shape[1] - masked_label.sum(1)).clamp(min=1)
    assert divisor.tolist() == [4, 1, 7, 3]
    expected = corrupted.region_feats.sum(1) / divisor[:, None]
    close(pretraining.model.global_feature(corrupted), expected, "[IMG] feature")
    model = pretraining.model
    try:
        model.config.img_feature = "mean"
        with torch.no_grad():
            mean_out = model(corrupted)
    finally:
        model.config.img_feature = "official"
    assert (mean_out.image_pooled - t["out.pooled_v"]).abs().max() > 1e-2


def _task(config, kind):
    return from_official("vilbert", fixture_path("vilbert_multitask.bin"), config=config, task=kind)


def _image_of(t, spatials):
    """The fixture image whose official reader locations the official task input shows (its random choice)."""
    for i in range(1, 9):
        loc = t[f"reader.image{i}.locations"]
        n = min(len(loc), MAX_REGION_NUM)
        if torch.allclose(spatials[:n], loc[:n]):
            return str(i)
    raise KeyError("no fixture image matches the official spatials")


def _texts(t, name):
    q, m = t[f"{name}.in.question"], t[f"{name}.in.input_mask"].bool()
    return [ids_text(q[b][m[b]][1:-1]) for b in range(len(q))]


def _region_source(store):
    # the task loaders cut to max_region_num slots ([IMG] + 7) and keep the mean of every box as [IMG]
    return RegionSource(store, num_bb=MAX_REGION_NUM - 1, global_feature=True)


def _drop_task_token(states):
    return torch.cat([states[:, :1], states[:, 2:]], dim=1)


@pytest.mark.parametrize("name,kind,output", [("vqa", "vqa", "vil_prediction"), ("gqa", "gqa", "vil_prediction_gqa"),
                                              ("snli_ve", "snli_ve", "vil_tri_prediction"),
                                              ("refcoco+", "refexp", "vision_logit")])
def test_multitask_parity(name, kind, output, config, tensors, vilbert_stores):
    t = tensors("vilbert_multitask")
    task = _task(config, kind)
    records = [dict(id=str(b), image_id=_image_of(t, t[f"{name}.in.spatials"][b]), sentence=text)
               for b, text in enumerate(_texts(t, name))]
    data = ImageTextPairs(records, IdTokenizer(), _region_source(vilbert_stores["multitask"]), max_len=12,
                          text_key="sentence")
    batch = data.collator()([data[i] for i in range(len(data))])
    assert task.model.task_inputs(task.name, batch, task.task_id)["task_ids"].eq(t[f"{name}.in.task_tokens"][0]).all()
    with torch.no_grad():
        out = task.model(batch, **task.model.task_inputs(task.name, batch, task.task_id))
        length, regions = out.text_states.shape[1], out.image_states.shape[1]
        close(out.text_states, _drop_task_token(t[f"{name}.out.seq_t"])[:, :length], f"{name} sequence_output_t")
        close(out.image_states, t[f"{name}.out.seq_v"][:, :regions], f"{name} sequence_output_v")
        close(out.joint, t[f"{name}.out.joint"], f"{name} joint")
        if kind == "refexp":
            real = batch.region_mask.bool()
            close(task.region_scores(batch)[real], t[f"{name}.out.{output}"][:, 1:regions, 0][real], "vision_logit")
        else:
            close(task.logits(batch), t[f"{name}.out.{output}"], output)


def test_multitask_vqa_img_token_keeps_the_cut_region(config, tensors, vilbert_stores):
    """Image 4 has 8 boxes and loses one to max_region_num; the official [IMG] is still the mean of all 8."""
    t = tensors("vilbert_multitask")
    source = _region_source(vilbert_stores["multitask"])
    close(source("4")["region_global"], t["reader.image4.global_feat"], "[IMG] feature of image 4")
    assert len(source("4")["region_feats"]) == 7


def test_multitask_nlvr2_parity(config, tensors, vilbert_stores):
    from vlkit.tasks.nlvr2 import ImagePairTexts

    t = tensors("vilbert_multitask")
    task = _task(config, "nlvr2")
    spatials, texts = t["nlvr2.in.spatials"], _texts(t, "nlvr2")
    records = [dict(id=str(b), left_image=_image_of(t, spatials[2 * b]), right_image=_image_of(t, spatials[2 * b + 1]),
                    sentence=texts[2 * b]) for b in range(len(texts) // 2)]
    data = ImagePairTexts(records, IdTokenizer(), _region_source(vilbert_stores["multitask"]), max_len=12)
    batch = data.collator()([data[i] for i in range(len(data))])
    with torch.no_grad():
        close(task.logits(batch), t["nlvr2.out.vil_binary_prediction"], "vil_binary_prediction")


@pytest.mark.parametrize("mode", ["full", "cached"])
def test_multitask_retrieval_parity(mode, config, tensors, vilbert_stores):
    """The 4 official options (target 0), scored one forward per pair or from cached encodings; both pass
    the task token (the official model needs it)."""
    from vlkit.tasks.retrieval import RetrievalSet

    t = tensors("vilbert_multitask")
    task = _task(config, "retrieval")
    images = [_image_of(t, s) for s in t["retrieval.in.spatials"]]
    ids = sorted(set(images))
    data = RetrievalSet(ids, _texts(t, "retrieval"), [ids.index(i) for i in images], IdTokenizer(),
                        _region_source(vilbert_stores["multitask"]), max_len=12)
    scores = task.score_pairs(data, torch.tensor([ids.index(i) for i in images]), torch.arange(4), mode=mode)
    close(scores, t["retrieval.out.vil_logit"][:, 0], f"vil_logit ({mode})")


def test_multitask_heads_without_a_vlkit_task_are_reported(config):
    task, report = from_official("vilbert", fixture_path("vilbert_multitask.bin"), config=config, task="vqa",
                                 return_report=True)
    assert "VILBertForVLTasks.forward computes linguisic_logit" in report.unused["linguisic_logit.weight"]
    assert "task=gqa" in report.unused["vil_prediction_gqa.logit_fc.0.weight"]
    assert "BertBiOutput" in report.unused["bert.encoder.c_layer.0.biOutput.q_dense1.weight"]
    assert task.task_id == 1 and task.head_name == "vil_prediction"


@pytest.mark.filterwarnings("ignore:.*weight_norm.*is deprecated")
def test_beta_weight_norm_classifier(config):
    """A vilbert_beta VQA head (``SimpleClassifier``: weight-normalised Linear, ReLU, Dropout, Linear) is folded
    into plain weights that give the same logits as the weight-normalised layers."""
    from torch.nn.utils import weight_norm

    state = {k: v for k, v in torch.load(fixture_path("vilbert_multitask.bin"), weights_only=True).items()
             if k.startswith(("bert.", "cls.")) and not k.startswith("bert.embeddings.task_embeddings")}
    g = torch.Generator().manual_seed(0)
    official = torch.nn.Sequential(weight_norm(torch.nn.Linear(20, 40), dim=None), torch.nn.ReLU(),
                                   torch.nn.Dropout(0.5), weight_norm(torch.nn.Linear(40, 7), dim=None)).eval()
    with torch.no_grad():
        for p in official.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    state.update({f"vil_prediction.main.{k}": v for k, v in official.state_dict().items()})
    task = from_official("vilbert", state, config=config, task="vqa")
    assert task.head_kind == "beta" and not task.model.config.task_specific_tokens
    joint = torch.randn(3, 20, generator=g)
    with torch.no_grad():
        close(task.head(joint), official(joint), "beta vil_prediction")
