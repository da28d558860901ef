"""Issue 5, retrieval: Karpathy-format loading, the families' recipes, zero-shot ITM scoring, and the
three evaluation modes checked against full forwards and a brute-force recall."""
import functools
import json
import math

import pytest
import torch
from omegaconf import OmegaConf

import vlkit
from vlkit.data.images import PixelSource, build_transform
from vlkit.cli import CONF_DIR
from vlkit.data.shapes import COLORS, KINDS, SIZES, ShapesWorld, write_shapes
from vlkit.objectives import build_objective, build_pretraining
from vlkit.tasks.retrieval import Retrieval, RetrievalSet, image_similarity

from shapes_helpers import FAMILIES

NO_DROPOUT = {"vilbert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, v_hidden_dropout_prob=0.0,
                              v_attention_probs_dropout_prob=0.0),
              "uniter": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
              "meter": dict(drop_rate=0.0)}


@pytest.fixture(scope="module")
def world():
    return ShapesWorld(seed=0, num_images=200)


class SceneRegions:
    """Region image source with oracle regions: one per object, its class / colour / size one-hot."""

    def __init__(self, world):
        self.world = world

    def __call__(self, image_id):
        scene = self.world.scene(self.world.index_of(image_id))
        feats = torch.zeros(len(scene.objects), 256)
        for k, o in enumerate(scene.objects):
            feats[k, [KINDS.index(o.kind), 8 + COLORS.index(o.color), 20 + SIZES.index(o.size)]] = 1.0
        boxes = torch.tensor([o.box for o in scene.objects]) / self.world.image_size
        return {"region_feats": feats, "region_boxes": boxes, "image_size": torch.tensor([128, 128])}

    def units(self, image_id):
        return len(self.world.scene(self.world.index_of(image_id)).objects)


def image_source(family, world):
    if family == "meter":
        return PixelSource(world.load_image, build_transform(64, [0.5] * 3, [0.5] * 3), patch_size=8)
    return SceneRegions(world)


def small_set(family, world, tok, images=(0, 1, 2), captions=2):
    recs = [{"image_id": world.image_id(i), "captions": world.captions(i)[:captions]} for i in images]
    return RetrievalSet.from_records(recs, tok, image_source(family, world))


@functools.lru_cache(maxsize=None)
def _shapes_data(family, world, tok):
    return Retrieval.build_data({"source": "shapes"}, tok, image_source(family, world), world)


def train_batch(family, world, tok, n=8):
    data = _shapes_data(family, world, tok)
    return data.collate([data.train[5 * i] for i in range(n)])  # n different images


# -- data ----------------------------------------------------------------------------------------
def _karpathy(tmp_path):
    images = [("1000092795.jpg", "train", ["Two young guys.", "Two men outside."]),
              ("10002456.jpg", "restval", ["Workers look down."]),
              ("1000268201.jpg", "val", ["A child in pink.", "A little girl.", "A girl climbs."]),
              ("1000344755.jpg", "val", ["Someone in a blue shirt."]),
              ("1000366164.jpg", "test", ["Two men sit."])]
    entries, sentid = [], 0
    for imgid, (name, split, caps) in enumerate(images):
        sents = [{"raw": c, "tokens": c.lower().split(), "imgid": imgid, "sentid": sentid + k}
                 for k, c in enumerate(caps)]
        entries.append({"filename": name, "imgid": imgid, "split": split, "sentids": [s["sentid"] for s in sents],
                        "sentences": sents})
        sentid += len(caps)
    path = tmp_path / "dataset_flickr30k.json"
    path.write_text(json.dumps({"images": entries, "dataset": "flickr30k"}))
    return path


def test_build_data_reads_karpathy_json(tmp_path, tok):
    path = _karpathy(tmp_path)
    source = lambda image_id: {"region_feats": torch.zeros(2, 8), "region_boxes": torch.zeros(2, 4)}  # noqa: E731
    cfg = {"source": "files", "path": str(path), "train_split": ["train", "restval"], "eval_splits": ["val", "test"]}
    data = Retrieval.build_data(cfg, tok, source)
    assert len(data.train) == 3 and data.train[0]["id"] == "0" and data.train[2]["image_id"] == "10002456"
    val = data.eval["val"]
    assert val.image_ids == ["1000268201", "1000344755"] and val.num_texts == 4
    assert val.txt2img.tolist() == [0, 0, 0, 1] and val.caption_ids == ["3", "4", "5", "6"]
    assert data.eval["test"].captions == ["Two men sit."]
    assert data.options["prerank_data"].image_ids == ["1000092795", "10002456"]
    batch = val.pair_batch([1, 0], [3, 0])
    assert batch.image_ids == ["1000344755", "1000268201"] and batch.ids == ["6", "3"]
    with pytest.raises(ValueError, match="path="):
        Retrieval.build_data({"source": "files"}, tok, source)
    with pytest.raises(ValueError, match="dataset_flickr30k.json has no images in split.s. nope"):
        Retrieval.build_data({**cfg, "eval_splits": ["restval", "nope"]}, tok, source)


def test_shapes_source_matches_the_written_files(tmp_path, tok):
    world = ShapesWorld(seed=1, num_images=20)
    write_shapes(world, tmp_path)
    a = Retrieval.build_data({"source": "shapes"}, tok, SceneRegions(world), world)
    b = Retrieval.build_data({"source": "files", "path": str(tmp_path / "dataset_shapes.json")}, tok,
                             SceneRegions(world))
    for split in ("val", "test"):
        assert a.eval[split].image_ids == b.eval[split].image_ids == [world.image_id(i) for i in world.indices(split)]
        assert a.eval[split].captions == b.eval[split].captions
        assert a.eval[split].txt2img.tolist() == b.eval[split].txt2img.tolist() == [k // 5 for k in range(10)]
    assert len(a.train) == len(b.train) == 5 * len(world.indices("train"))


def test_retrieval_set_errors(tok):
    with pytest.raises(ValueError, match="image 'b' has no caption"):
        RetrievalSet(["a", "b"], ["x"], [0], tok, None)
    with pytest.raises(ValueError, match="points to image index 3"):
        RetrievalSet(["a"], ["x", "y"], [0, 3], tok, None)
    with pytest.raises(ValueError, match="listed twice"):
        RetrievalSet(["a", "a"], ["x", "y"], [0, 1], tok, None)


# -- evaluation modes ---------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_cached_scores_equal_full_forward(family, world, tok, build_tiny):
    data = small_set(family, world, tok)
    task = Retrieval(build_tiny(family))
    full, same = task.score_matrices(data, "full", batch_size=4)
    cached, _ = task.score_matrices(data, "cached", batch_size=5)
    assert full is same and full.shape == (3, 6)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)
    assert full.std() > 1e-4  # not a constant score
    batch = data.pair_batch([0, 2, 1], [0, 3, 5])
    torch.testing.assert_close(task.predict(batch)["score"], full[[0, 2, 1], [0, 3, 5]], atol=1e-5, rtol=0)


def _brute_force_recall(i2t, t2i, txt2img, ks=(1, 5, 10)):
    """Ranks by sorting, ties against the ground truth; -inf entries are never retrieved."""
    n_img, n_txt = len(i2t), len(i2t[0])
    out = {}
    for k in ks:
        hits = 0
        for t in range(n_txt):
            ranked = sorted((i for i in range(n_img) if t2i[i][t] > -math.inf),
                            key=lambda i: (-t2i[i][t], i == txt2img[t]))
            hits += txt2img[t] in ranked[:k]
        out[f"ir_r{k}"] = hits / n_txt
        hits = 0
        for i in range(n_img):
            ranked = sorted((t for t in range(n_txt) if i2t[i][t] > -math.inf),
                            key=lambda t: (-i2t[i][t], txt2img[t] == i))
            hits += any(txt2img[t] == i for t in ranked[:k])
        out[f"tr_r{k}"] = hits / n_img
    return out


def test_recall_of_each_mode_against_brute_force(world, tok, build_tiny):
    data = small_set("uniter", world, tok, images=range(12), captions=2)
    task = Retrieval(build_tiny("uniter"))
    full, _ = task.score_matrices(data, "full", batch_size=32)
    txt2img = data.txt2img.tolist()
    expected = _brute_force_recall(full.tolist(), full.tolist(), txt2img)
    chance = {"ir_r1_chance": 1 / 12, "tr_r1_chance": 2 / 24}  # 12 images, 2 of the 24 captions each
    for mode in ("full", "cached"):
        got = task.evaluate(data, mode=mode, batch_size=16)
        assert got == pytest.approx({**expected, "r_mean": sum(expected.values()) / 6, **chance})
    # rerank: only the top-k of the pre-ranking are re-scored, each with its full score
    task.fit_prerank(small_set("uniter", world, tok, images=range(20, 60), captions=5))
    text, image = task.encode_texts(data), task.encode_images(data)
    pre = task.prerank_scores(text, image)
    k = 3
    per_image = round(data.num_texts / data.num_images)  # each image re-scores k x its captions
    assert per_image > 1
    i2t = torch.full_like(full, -math.inf)
    t2i = torch.full_like(full, -math.inf)
    for i in range(data.num_images):
        top = pre[i].topk(k * per_image).indices
        i2t[i, top] = full[i, top]
    for t in range(data.num_texts):
        top = pre[:, t].topk(k).indices
        t2i[top, t] = full[top, t]
    expected = _brute_force_recall(i2t.tolist(), t2i.tolist(), txt2img)
    got_i2t, got_t2i = task.score_matrices(data, "rerank", k=k)
    torch.testing.assert_close(got_i2t, i2t, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_t2i, t2i, atol=1e-5, rtol=0)
    assert task.evaluate(data, mode="rerank", k=k) == pytest.approx({**expected, "r_mean": sum(expected.values()) / 6,
                                                                      **chance})
    assert ((got_i2t > -math.inf).sum(1) == k * per_image).all() and ((got_t2i > -math.inf).sum(0) == k).all()


@pytest.mark.parametrize("family", ["vilbert", "meter"])
def test_rerank_with_every_candidate_equals_full(family, world, tok, build_tiny):
    data = small_set(family, world, tok, images=range(4))
    task = Retrieval(build_tiny(family), prerank_data=small_set(family, world, tok, images=range(4, 10)))
    full, _ = task.score_matrices(data, "full")
    task.fit_prerank(task.prerank_data)
    i2t, t2i = task.score_matrices(data, "rerank", k=100)
    torch.testing.assert_close(i2t, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(t2i, full, atol=1e-5, rtol=0)
    assert task.evaluate(data, mode="rerank", k=100) == pytest.approx(task.evaluate(data, mode="full"))


def test_rerank_needs_a_fitted_prerank_and_training_invalidates_it(world, tok, build_tiny):
    data = small_set("uniter", world, tok)
    task = Retrieval(build_tiny("uniter"))
    with pytest.raises(ValueError, match="fit_prerank"):
        task.evaluate(data, mode="rerank")
    task.prerank_data = small_set("uniter", world, tok, images=range(3, 9))
    task.evaluate(data, mode="rerank", k=2)  # fits on prerank_data
    assert task.prerank_w is not None and task.prerank_w.shape == (128, 128)  # mean and max of 64-d states
    task.train()
    task(train_batch("uniter", world, tok))
    assert task.prerank_w is None


# -- recipes and heads --------------------------------------------------------------------------
@pytest.mark.parametrize("family,recipe", [(f, f) for f in FAMILIES] + [("uniter", "vilbert"), ("vilbert", "meter")])
def test_recipe_losses_backpropagate(family, recipe, world, tok, build_tiny):
    model = build_tiny(family).train()
    task = Retrieval(model, recipe=recipe, negative_size=5, hard_size=2, num_negatives=3)
    out = task(train_batch(family, world, tok), step=3)
    assert torch.isfinite(out.loss) and out.loss > 0
    out.loss.backward()
    assert task.head.weight.grad.abs().sum() > 0
    grads = [p.grad for p in model.parameters()]
    assert sum(g is not None and bool(g.abs().sum() > 0) for g in grads) > 0.5 * len(grads)
    metrics = out.detached_metrics()
    if recipe != "uniter":  # vilbert: 4-way; meter: 1 + num_negatives
        assert metrics["options"] == 4
    assert task.head_name == ("vil_logit" if family == "vilbert" else "rank_output")


def test_uniter_recipe_trains_the_hardest_negatives(world, tok, build_tiny):
    model = build_tiny("uniter", **NO_DROPOUT["uniter"])
    batch = train_batch("uniter", world, tok, n=6)
    data_scores = Retrieval(model)
    with torch.no_grad():
        text, image = model.encode_text(batch), model.encode_image(batch)
        rows = torch.arange(6)
        s = torch.sigmoid(torch.stack([data_scores._rank_scores(text, image, rows.view(-1, 1).expand(6, 6),
                                                                rows.view(1, -1).expand(6, 6))]))[0]
    pos, off = s.diagonal(), ~torch.eye(6, dtype=torch.bool)
    for hard, pick in ((5, lambda m: m[off].view(6, 5)), (1, lambda m: m.masked_fill(~off, -1).amax(1, keepdim=True))):
        task = Retrieval(model, negative_size=5, hard_size=hard)
        task.load_state_dict(data_scores.state_dict())
        out = task(batch)
        loss_t = torch.clamp(0.2 + pick(s) - pos[:, None], min=0).mean()  # s[caption, image]
        loss_i = torch.clamp(0.2 + pick(s.T) - pos[:, None], min=0).mean()
        assert out.metrics["loss_t"].item() == pytest.approx(loss_t.item(), abs=1e-5)
        assert out.metrics["loss_i"].item() == pytest.approx(loss_i.item(), abs=1e-5)


def test_vilbert_recipe_options(world, tok, build_tiny, monkeypatch):
    task = Retrieval(build_tiny("vilbert"))
    batch = train_batch("vilbert", world, tok)
    seen = {}

    def record(text, image, txt_idx, img_idx):
        seen.update(txt=txt_idx, img=img_idx)
        return torch.zeros(txt_idx.shape, requires_grad=True)

    monkeypatch.setattr(task, "_rank_scores", record)
    out = task(batch)
    assert out.loss.item() == pytest.approx(math.log(4))
    rows = torch.arange(batch.batch_size)
    sim = image_similarity(batch).fill_diagonal_(-2)
    assert seen["txt"][:, 0].tolist() == rows.tolist() and seen["img"][:, 0].tolist() == rows.tolist()
    assert (seen["txt"][:, 1] != rows).all() and seen["img"][:, 1].tolist() == rows.tolist()  # random caption
    assert seen["txt"][:, 2].tolist() == rows.tolist() and (seen["img"][:, 2] != rows).all()  # random image
    assert seen["txt"][:, 3].tolist() == sim.argmax(1).tolist()  # caption of the most similar image


def test_zero_shot_scores_with_the_itm_head(world, tok, build_tiny):
    for family in FAMILIES:
        model = build_tiny(family)
        pre = build_pretraining(model, {"objectives": {"itm": {}}}).eval()
        itm = pre.objectives["itm"]
        task = vlkit.build_task("retrieval", pre, scorer="itm")
        assert task.model is model and task.itm is itm
        batch = small_set(family, world, tok).pair_batch([0, 1, 2], [0, 2, 5])
        with torch.no_grad():
            probs = itm.logits(model.eval()(batch)).softmax(-1)
        match = 0 if family == "vilbert" else 1  # ViLBERT: index 0 = matched
        torch.testing.assert_close(task.predict(batch)["score"], probs[:, match])
        fc = itm.itm_head.fc
        copied = torch.equal(task.head.weight[0], fc.weight[1]) and torch.equal(task.head.bias, fc.bias[1:])
        assert copied == (family != "vilbert")  # UNITER init_output / METER itm_score.fc.weight[1:]


def test_meter_recipe_adds_the_frozen_itm_loss(world, tok, build_tiny):
    model = build_tiny("meter").train()
    itm = build_objective("itm", model)
    task = Retrieval(model, itm=itm, num_negatives=3)
    assert task.itm_weight == 1.0 and not any(p.requires_grad for p in itm.parameters())
    out = task(train_batch("meter", world, tok))
    assert {"itm/loss", "itm/acc"} <= set(out.metrics)
    out.loss.backward()
    assert all(p.grad is None for p in itm.parameters())


def test_a_mix_without_itm_fine_tunes_a_fresh_rank_head(world, tok, build_tiny):
    """UNITER Table 2's MLM-only row: retrieval starts from the model with a freshly initialised head."""
    model = build_tiny("uniter")
    fresh = Retrieval(model, num_negatives=3)
    task = Retrieval(build_pretraining(model, {"objectives": {"mlm": {}}}), num_negatives=3)
    assert task.itm is None and task.model is model
    torch.testing.assert_close(task.head.weight.abs().mean(), fresh.head.weight.abs().mean(), rtol=0.5, atol=0)
    out = task(train_batch("uniter", world, tok))
    out.loss.backward()
    assert task.head.weight.grad is not None and torch.isfinite(out.loss)


def test_errors(world, tok, build_tiny):
    model = build_tiny("uniter")
    with pytest.raises(ValueError, match="zero-shot"):
        Retrieval(model, scorer="itm")
    with pytest.raises(ValueError, match="recipe"):
        Retrieval(model, recipe="clip")
    mlm_only = build_pretraining(model, {"objectives": {"mlm": {}}})
    with pytest.raises(ValueError, match="zero-shot"):  # nothing to score with before fine-tuning
        Retrieval(mlm_only, scorer="itm")
    task = Retrieval(model)
    batch = small_set("uniter", world, tok).pair_batch([1, 1, 1], [2, 3, 2])
    with pytest.raises(ValueError, match="two different images"):
        task(batch)
    with pytest.raises(TypeError, match="RetrievalSet"):
        task.evaluate([batch])


def test_config_keys_are_read(tok, world):
    cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "task" / "retrieval.yaml"))
    task = Retrieval(vlkit.build_model("uniter", preset="tiny"), **cfg["options"])
    assert task.recipe == "hard_negatives" and task.eval_mode == "cached"  # the recipe UNITER's head names
    data = Retrieval.build_data(cfg, tok, SceneRegions(world), world)
    assert data.eval["val"].num_images == 20


# -- learning ------------------------------------------------------------------------------------
def _chance_r_mean(n_img, per_image=5, ks=(1, 5, 10)):
    n_txt = n_img * per_image
    ir = [min(k, n_img) / n_img for k in ks]
    tr = [1 - math.comb(n_txt - per_image, k) / math.comb(n_txt, k) for k in ks]
    return sum(ir + tr) / 6


def test_a_tiny_model_learns_retrieval_on_shapes(world, tok):
    torch.manual_seed(0)
    model = vlkit.build_model("uniter", preset="tiny", num_hidden_layers=2, **NO_DROPOUT["uniter"])
    task = Retrieval(model, recipe="meter", num_negatives=7)
    data = Retrieval.build_data({"source": "shapes", "max_len": 24}, tok, SceneRegions(world), world)
    optimizer = torch.optim.AdamW(task.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(data.train, batch_size=16, shuffle=True, collate_fn=data.collate,
                                         drop_last=True)
    task.train()
    for step, batch in zip(range(300), (b for _ in range(10) for b in loader)):
        loss = task(batch, step).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    chance = _chance_r_mean(20)
    for split in ("val", "test"):
        assert task.evaluate(data.eval[split])["r_mean"] > chance + 0.15
