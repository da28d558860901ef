"""Issue 5, refexp: RefCOCO-format loading (refs pickle through the restricted unpickler), the ViLBERT
and UNITER region heads and losses, exact accuracy / baselines, METER's refusal, learning on shapes."""
import json
import pickle

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import vlkit
from vlkit.cli import CONF_DIR
from vlkit.data.images import RegionSource
from vlkit.data.pairs import ImageTextPairs
from vlkit.data.shapes import COLORS, KINDS, SIZES, ShapesWorld, shapes_tokenizer, write_shapes
from vlkit.features.store import FeatureStoreWriter
from vlkit.tasks.refexp import IncompatibleTask, RefExp, region_ious

SMALL = {  # two text layers, no dropout: quick to train
    "vilbert": dict(num_hidden_layers=2, t_biattention_id=[0, 1], hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0, v_hidden_dropout_prob=0.0, v_attention_probs_dropout_prob=0.0),
    "uniter": dict(num_hidden_layers=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)}


@pytest.fixture(scope="module")
def world():
    return ShapesWorld(seed=0, num_images=150)


@pytest.fixture(scope="module")
def regions(world, tmp_path_factory):
    """A feature store of oracle detections: every object (class / colour / size one-hot, box jittered
    by ~1.5 px) plus four random distractor boxes with noise features."""
    path = tmp_path_factory.mktemp("refexp") / "regions.h5"
    rng = np.random.default_rng(0)
    with FeatureStoreWriter(path, dtype="float32") as writer:
        for i in range(len(world)):
            feats, boxes = [], []
            for o in world.scene(i).objects:
                f = rng.normal(0, 0.1, 256)
                f[[KINDS.index(o.kind), 8 + COLORS.index(o.color), 20 + SIZES.index(o.size)]] += 1.0
                feats.append(f)
                boxes.append(np.asarray(o.box) + rng.normal(0, 1.5, 4))
            for _ in range(4):
                x, y, s = *rng.uniform(0, 90, 2), rng.uniform(10, 40)
                feats.append(rng.normal(0, 0.1, 256))
                boxes.append([x, y, x + s, y + s])
            boxes = np.clip(np.asarray(boxes), 0, world.image_size)
            boxes[:, 2:] = np.maximum(boxes[:, 2:], boxes[:, :2] + 1)
            writer.add(world.image_id(i), features=np.asarray(feats), boxes=boxes, image_h=128, image_w=128)
    return RegionSource(path, num_bb=100)


@pytest.fixture(scope="module")
def shapes_data(world, tok, regions):
    return RefExp.build_data({"source": "shapes", "max_len": 20}, tok, regions, world)


# -- data ----------------------------------------------------------------------------------------
def _refcoco_files(tmp_path):
    refs = [
        {"ref_id": 7, "ann_id": 70, "image_id": 5, "split": "train", "category_id": 1, "sent_ids": [71, 72],
         "sentences": [{"sent_id": 71, "sent": "man on left", "raw": "Man on left", "tokens": ["man"]},
                       {"sent_id": 72, "sent": "guy in red", "raw": "guy in red", "tokens": ["guy"]}]},
        {"ref_id": 8, "ann_id": 80, "image_id": 6, "split": "testA", "category_id": 1, "sent_ids": [81],
         "sentences": [{"sent_id": 81, "sent": "woman", "raw": "woman", "tokens": ["woman"]}]},
    ]
    instances = {"images": [{"id": 5, "height": 480, "width": 640}, {"id": 6, "height": 300, "width": 400}],
                 "annotations": [{"id": 70, "image_id": 5, "bbox": [10.0, 20.0, 100.0, 50.0], "category_id": 1},
                                 {"id": 80, "image_id": 6, "bbox": [0.0, 0.0, 30.0, 40.0], "category_id": 1}]}
    (tmp_path / "refs(unc).p").write_bytes(pickle.dumps(refs))
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    return tmp_path / "refs(unc).p", tmp_path / "instances.json"


def test_build_data_reads_the_refs_pickle_and_instances(tmp_path, tok):
    refs, instances = _refcoco_files(tmp_path)
    source = lambda image_id: {"region_feats": torch.zeros(3, 8), "region_boxes": torch.zeros(3, 4)}  # noqa: E731
    cfg = {"source": "files", "refs": str(refs), "instances": str(instances), "image_id_format": "COCO_{:012d}",
           "eval_splits": ["testA"]}
    data = RefExp.build_data(cfg, tok, source)
    assert len(data.train) == 2 and list(data.eval) == ["testA"]
    first = data.train[0]
    assert first["id"] == "71" and first["image_id"] == "COCO_000000000005"
    assert first["targets"]["ref_box"].tolist() == [10.0, 20.0, 110.0, 70.0]  # xywh -> xyxy pixels
    assert first["targets"]["image_hw"].tolist() == [480.0, 640.0]
    assert data.collate([data.train[0], data.train[1]]).targets["ref_box"].shape == (2, 4)
    assert data.eval["testA"][0]["targets"]["image_hw"].tolist() == [300.0, 400.0]
    with pytest.raises(ValueError, match="refs= and instances="):
        RefExp.build_data({"source": "files"}, tok, source)
    with pytest.raises(ValueError, match="no referring expressions in split.s. testB"):
        RefExp.build_data({**cfg, "eval_splits": ["testB"]}, tok, source)


def test_shapes_source_matches_the_written_files(tmp_path, tok, world, regions):
    write_shapes(world, tmp_path)
    a = RefExp.build_data({"source": "shapes"}, tok, regions, world)
    b = RefExp.build_data({"source": "files", "refs": str(tmp_path / "refs(unc).json"),
                           "instances": str(tmp_path / "instances.json")}, tok, regions)
    for x, y in ((a.train, b.train), (a.eval["test"], b.eval["test"])):
        assert len(x) == len(y) > 0
        assert x.data["id"] == y.data["id"] and x.data["sentence"] == y.data["sentence"]
        assert np.allclose(x.data["ref_box"], y.data["ref_box"]) and x.data["image_hw"] == y.data["image_hw"]


# -- heads and losses ----------------------------------------------------------------------------
def _batch(regions_px, ref_px, image_hw, scores=None):
    """A batch of expressions over hand-placed regions (pixels), with region_feats[..., 0] = score."""
    records, images = [], {}
    for k, (boxes, ref, hw) in enumerate(zip(regions_px, ref_px, image_hw)):
        h, w = hw
        feats = torch.zeros(len(boxes), 8)
        feats[:, 0] = torch.tensor(scores[k]) if scores else 0.0
        images[str(k)] = {"region_feats": feats, "region_boxes": torch.tensor(boxes) / torch.tensor([w, h, w, h])}
        records.append({"id": str(k), "image_id": str(k), "sentence": "the shape", "ref_box": ref, "image_hw": hw})
    from vlkit.tasks.refexp import _refexp_targets

    return ImageTextPairs(records, shapes_tokenizer(), images.__getitem__, text_key="sentence", targets=_refexp_targets)


CASES = dict(  # image 1 is 100 x 200 (h, w): the normalised boxes are scaled per axis
    regions_px=[[[20, 10, 100, 50], [20, 10, 100, 31], [60, 30, 140, 70]],  # IoU 1, 0.525, 1/7 (+ a pad)
                [[0, 0, 20, 20], [10, 10, 30, 30], [100, 10, 140, 50], [150, 0, 200, 40]],  # IoU 1/4, 0, 0, 0
                [[0, 0, 10, 10], [0, 0, 12, 10]]],  # IoU 5/6, 5/7 with [0, 0, 10, 12]
    ref_px=[[20, 10, 100, 50], [0, 0, 10, 10], [0, 0, 10, 12]],
    image_hw=[[100, 200], [50, 200], [20, 20]],
)


def test_region_ious_scale_normalised_boxes_by_the_annotation_size():
    data = _batch(**CASES)
    batch = data.collator()([data[k] for k in range(3)])
    ious = region_ious(batch)
    expected = torch.tensor([[1.0, 1680 / 3200, 800 / 5600, 0.0], [100 / 400, 0.0, 0.0, 0.0],
                             [100 / 120, 100 / 140, 0.0, 0.0]])
    torch.testing.assert_close(ious, expected)


@pytest.mark.parametrize("labels", ["iou", "binary"])
def test_vilbert_bce_over_regions(labels, build_tiny, monkeypatch):
    data = _batch(**CASES, scores=[[0.3, -1.0, 2.0], [0.5, 0.1, -0.2, 0.0], [1.0, -1.0]])
    batch = data.collator()([data[k] for k in range(3)])
    task = RefExp(build_tiny("vilbert"), labels=labels)
    scores = batch.region_feats[..., 0].masked_fill(~batch.region_mask.bool(), -10000.0)
    monkeypatch.setattr(task, "region_scores", lambda b: scores)
    ious = region_ious(batch)
    target = torch.where(ious >= 0.5, ious if labels == "iou" else torch.ones_like(ious), torch.zeros_like(ious))
    bce = sum(torch.nn.functional.binary_cross_entropy_with_logits(scores[b, k], target[b, k])
              for b in range(3) for k in range(int(batch.region_mask[b].sum())))
    out = task(batch)
    assert out.loss.item() == pytest.approx(bce.item() / 3, rel=1e-5)
    assert out.metrics["acc"].item() == pytest.approx(1 / 3)  # picks IoU 1/7, 1/4 and 5/6


def test_uniter_cross_entropy_toward_the_best_region(build_tiny, monkeypatch):
    data = _batch(**CASES, scores=[[0.3, -1.0, 2.0], [0.5, 0.1, -0.2, 0.0], [1.0, -1.0]])
    batch = data.collator()([data[k] for k in range(3)])
    task = RefExp(build_tiny("uniter"))
    scores = batch.region_feats[..., 0].masked_fill(~batch.region_mask.bool(), -1e4)
    monkeypatch.setattr(task, "region_scores", lambda b: scores)
    out = task(batch)
    ce = torch.nn.functional.cross_entropy
    expected = ce(scores[0:1], torch.tensor([0])) + ce(scores[2:3], torch.tensor([0]))  # row 1: no IoU >= 0.5
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert out.metrics["with_target"].item() == pytest.approx(2 / 3)


@pytest.mark.parametrize("family", ["vilbert", "uniter"])
def test_heads_backpropagate(family, build_tiny, shapes_data):
    model = build_tiny(family).train()
    task = RefExp(model)
    assert task.head_name == ("vision_logit" if family == "vilbert" else "re_output")
    batch = shapes_data.collate([shapes_data.train[k] for k in range(6)])
    out = task(batch)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in task.head.parameters())
    scores = task.region_scores(batch)
    assert (scores[~batch.region_mask.bool()] <= -1e4).all()
    pred = task.predict(batch)
    chosen = batch.region_boxes[torch.arange(6), pred["region"]] * 128
    torch.testing.assert_close(pred["box"], chosen)


def test_uniter_head_layouts(build_tiny):
    mlp2 = RefExp(build_tiny("uniter")).re_output
    assert [type(m).__name__ for m in mlp2] == ["Linear", "GELU", "LayerNorm", "Linear"] and mlp2[2].eps == 1e-12
    assert isinstance(RefExp(build_tiny("uniter"), mlp=1).re_output, torch.nn.Linear)
    vision_logit = RefExp(build_tiny("vilbert")).vision_logit
    assert vision_logit.in_features == build_tiny("vilbert").config.v_hidden_size


def test_evaluate_accuracy_and_baselines(build_tiny, monkeypatch):
    data = _batch(**CASES, scores=[[0.3, -1.0, 2.0], [0.5, 0.1, -0.2, 0.0], [1.0, -1.0]])
    task = RefExp(build_tiny("uniter"))
    monkeypatch.setattr(task, "region_scores",
                        lambda b: b.region_feats[..., 0].masked_fill(~b.region_mask.bool(), -1e4))
    got = task.evaluate(data, batch_size=2)
    # chosen: IoU 1/7 (miss), 1/4 (miss), 5/6 (hit); uniform pick: 2/3, 0/4, 2/2; reachable: 1, 0, 1
    assert got == pytest.approx({"refexp": 1 / 3, "random_box": (2 / 3 + 0 + 1) / 3, "upper_bound": 2 / 3, "n": 3.0})


def test_meter_has_no_region_head(build_tiny):
    with pytest.raises(IncompatibleTask, match="region proposals"):
        RefExp(build_tiny("meter"))
    with pytest.raises(ValueError, match="labels"):
        RefExp(build_tiny("vilbert"), labels="soft")


def test_config_keys_are_read(tok, world, regions):
    cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "task" / "refexp.yaml"))
    task = RefExp(vlkit.build_model("uniter", preset="tiny"), **cfg["options"])
    assert task.labels == "iou" and len(task.re_output) == 4
    assert set(RefExp.build_data(cfg, tok, regions, world).eval) == {"val", "test"}


# -- learning ------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["uniter", "vilbert"])
def test_a_tiny_model_beats_the_random_box_baseline(family, shapes_data):
    torch.manual_seed(0)
    model = vlkit.build_model(family, preset="tiny", **SMALL[family])
    task = RefExp(model)
    optimizer = torch.optim.AdamW(task.parameters(), lr=2e-3)
    loader = torch.utils.data.DataLoader(shapes_data.train, batch_size=32, shuffle=True,
                                         collate_fn=shapes_data.collate)
    task.train()
    for step, batch in zip(range(150), (b for _ in range(20) for b in loader)):
        loss = task(batch, step).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for split in ("val", "test"):
        got = task.evaluate(shapes_data.eval[split])
        assert got["upper_bound"] > 0.95
        assert got["refexp"] > got["random_box"] + 0.25
