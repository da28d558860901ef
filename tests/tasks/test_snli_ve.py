"""SNLI-VE task: official jsonl files, each family's 3-way head and loss, label order, exact accuracy,
and learning on the shapes world."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shapes_helpers import (FAMILIES, first_batch, region_store, shapes_cfg, shapes_data_getter, tiny_model,
                            train_steps, world_store)
from vlkit.data.formats import VE_LABELS, FormatError
from vlkit.data.images import RegionSource
from vlkit.data.shapes import ShapesWorld, write_shapes
from vlkit.tasks.snli_ve import SNLIVETask


@pytest.fixture(scope="module")
def world() -> ShapesWorld:
    return ShapesWorld(seed=1, num_images=200)


@pytest.fixture(scope="module")
def store(world, tmp_path_factory) -> Path:
    return world_store(world, tmp_path_factory.mktemp("snli_ve") / "regions.h5")


@pytest.fixture(scope="module")
def shapes_data(world, store, tok):
    return shapes_data_getter(SNLIVETask, "snli_ve", world, store, tok)


def _write_jsonl(path: Path, rows: list[tuple[str, str, str]]) -> str:
    """SNLI-VE jsonl lines for (Flickr30K_ID, hypothesis, gold label)."""
    with open(path, "w") as f:
        for k, (image, hyp, label) in enumerate(rows):
            f.write(json.dumps({"Flickr30K_ID": image, "captionID": f"{image}.jpg#0", "pairID": f"{image}.jpg#0r{k}",
                                "sentence1": "Two shapes on a dark background.", "sentence2": hyp, "gold_label": label,
                                "annotator_labels": [label]}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def ve_files(world, tmp_path_factory):
    folder = tmp_path_factory.mktemp("snli_ve_files")
    train = [("101", "there is a circle.", "entailment"), ("101", "the circle is made of wood.", "neutral"),
             ("102", "there is no square.", "contradiction"), ("102", "there is a square.", "entailment")]
    extra = [("103", "all the shapes are red.", "entailment")]
    dev = [("104", "there is a circle.", "entailment"), ("104", "the picture was made yesterday.", "neutral"),
           ("105", "there is no cross.", "contradiction"), ("105", "there are exactly two crosses.", "contradiction"),
           ("105", "someone is looking at the cross.", "neutral")]
    train_files = [_write_jsonl(folder / "snli_ve_train.jsonl", train), _write_jsonl(folder / "extra.jsonl", extra)]
    files = {"train": train_files, "val": _write_jsonl(folder / "snli_ve_dev.jsonl", dev)}
    store = region_store(folder / "regions.h5", {str(i): world.scene(i - 100) for i in range(101, 106)})
    return {"files": files, "store": store}


def test_snli_ve_jsonl_files(ve_files, tok):
    cfg = {"name": "snli_ve", "source": "files", "files": ve_files["files"], "max_len": 16}
    data = SNLIVETask.build_data(cfg, tok, RegionSource(ve_files["store"], num_bb=100))
    assert len(data.train) == 5 and list(data.eval) == ["val"] and len(data.eval["val"]) == 5  # two train files
    assert data.options == {"labels": list(VE_LABELS), "majority_label": "entailment"}
    example = data.train[2]
    assert example["image_id"] == "102" and example["targets"] == {"label": "contradiction"}
    assert tok.decode(example["input_ids"], skip_special_tokens=True) == "there is no square."  # the hypothesis only
    batch = first_batch(data.eval["val"], 5)
    assert batch.targets["label"][:2] == ["entailment", "neutral"]


def test_bad_files_name_the_line(tmp_path, tok):
    path = tmp_path / "ve.jsonl"
    path.write_text(json.dumps({"Flickr30K_ID": "1", "pairID": "p", "sentence2": "x.", "gold_label": "-"}) + "\n")
    with pytest.raises(FormatError, match="ve.jsonl:1.*gold_label"):
        SNLIVETask.build_data({"name": "snli_ve", "source": "files", "files": {"train": str(path)}}, tok, None)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    good = _write_jsonl(tmp_path / "good.jsonl", [("1", "there is a circle.", "entailment")])
    with pytest.raises(ValueError, match="files.val.*empty.jsonl.*no records"):
        SNLIVETask.build_data({"name": "snli_ve", "source": "files", "files": {"train": good, "val": str(empty)}},
                              tok, None)


def test_shapes_source_matches_the_written_files(tok, tmp_path):
    world = ShapesWorld(seed=4, num_images=20)
    write_shapes(world, tmp_path)
    src = RegionSource(world_store(world, tmp_path / "regions.h5"), num_bb=100)
    files = {s: str(tmp_path / f"snli_ve_{s}.jsonl") for s in ("train", "val", "test")}
    from_files = SNLIVETask.build_data({"name": "snli_ve", "source": "files", "files": files}, tok, src)
    from_world = SNLIVETask.build_data(shapes_cfg("snli_ve"), tok, src, world)
    assert from_files.options == from_world.options
    assert from_files.train.data.to_list() == from_world.train.data.to_list()
    assert from_files.eval["val"].data.to_list() == from_world.eval["val"].data.to_list()


@pytest.mark.parametrize("family", FAMILIES)
def test_loss_is_the_official_one_and_backpropagates(family, shapes_data):
    data = shapes_data(family)
    task = SNLIVETask(tiny_model(family), **data.options)
    batch = first_batch(data.train, 6)
    out = task(batch)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in task.head.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in task.model.parameters())
    task.eval()
    logits, labels = task.logits(batch), task.label_ids(batch)
    expected = {"vilbert": F.binary_cross_entropy_with_logits(logits, F.one_hot(labels, 3).float()),
                "uniter": 3 * F.binary_cross_entropy_with_logits(logits, F.one_hot(labels, 3).float()),
                "meter": F.cross_entropy(logits, labels)}[family]
    assert torch.allclose(task(batch).loss, expected)
    assert torch.isfinite(SNLIVETask(task.model, loss="ce")(batch).loss)


def test_heads_and_label_order():
    heads = {f: SNLIVETask(tiny_model(f)) for f in FAMILIES}
    vil = heads["vilbert"]
    assert vil.head_name == "vil_tri_prediction" and isinstance(vil.head, nn.Linear)
    assert vil.head.weight.shape == (3, vil.model.joint_size) and vil.joint_dropout.p == 0.1
    assert heads["uniter"].head_name == "vqa_output" and heads["uniter"].head[-1].out_features == 3
    meter = heads["meter"]
    assert meter.head_name == "snli_classifier" and isinstance(meter.head[1], nn.LayerNorm)
    batch = tiny_model("uniter").example_batch(3)
    batch.targets["label"] = ["contradiction", "entailment", "neutral"]
    assert heads["uniter"].label_ids(batch).tolist() == [2, 0, 1]  # entailment / neutral / contradiction
    official = SNLIVETask(tiny_model("uniter"), labels=["contradiction", "entailment", "neutral"])  # UNITER's order
    assert official.label_ids(batch).tolist() == [0, 1, 2]
    batch.targets["label"][1] = "maybe"
    with pytest.raises(ValueError, match="'maybe'"):
        official.label_ids(batch)
    with pytest.raises(ValueError, match="labels must"):
        SNLIVETask(tiny_model("uniter"), labels=["yes", "no", "maybe"])


def test_evaluate_gives_exact_accuracy(ve_files, tok):
    cfg = {"name": "snli_ve", "source": "files", "files": ve_files["files"], "max_len": 16}
    data = SNLIVETask.build_data(cfg, tok, RegionSource(ve_files["store"], num_bb=100))
    task = SNLIVETask(tiny_model("vilbert"), **data.options)
    with torch.no_grad():  # always "neutral"
        task.head.weight.zero_()
        task.head.bias.copy_(torch.tensor([-5.0, 5.0, -5.0]))
    metrics = task.evaluate(data.eval["val"], batch_size=2)
    assert metrics == {"snli_ve": pytest.approx(2 / 5), "snli_ve_majority_baseline": pytest.approx(1 / 5)}
    assert task.predict(first_batch(data.eval["val"], 2))["labels"] == ["neutral", "neutral"]


def test_uniter_learns_snli_ve_on_shapes(shapes_data):
    data = shapes_data("uniter")
    torch.manual_seed(0)
    task = SNLIVETask(tiny_model("uniter"), **data.options)
    train_steps(task, data.train, steps=80, lr=1e-3)
    metrics = task.evaluate(data.eval["val"])
    assert metrics["snli_ve_majority_baseline"] == pytest.approx(1 / 3)  # one hypothesis of each label per image
    assert metrics["snli_ve"] > metrics["snli_ve_majority_baseline"] + 0.2, metrics
