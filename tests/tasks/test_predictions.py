"""Prediction files for the leaderboards (vlkit.tasks.predictions) and `vlkit evaluate split= predictions=`,
on official-format files the tests write (the shapes world's, with the labels taken out of the test split)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from shapes_helpers import tiny_model, world_store
from vlkit.data.images import RegionSource
from vlkit.data.shapes import ShapesWorld, write_shapes
from vlkit.data.shapes.writer import FILES
from vlkit.tasks.nlvr2 import NLVR2Task
from vlkit.tasks.predictions import PREDICTIONS, write_predictions
from vlkit.tasks.refexp import RefExp
from vlkit.tasks.retrieval import Retrieval
from vlkit.tasks.vqa import VQATask

NUM_IMAGES = 30  # the world of `command_args` (data.num_images=30, seed 0)


@pytest.fixture(scope="module")
def world():
    return ShapesWorld(seed=0, num_images=NUM_IMAGES)


@pytest.fixture(scope="module")
def files(world, tmp_path_factory):
    """The shapes world in the publishers' formats, plus test splits without labels: VQA questions
    without annotations, NLVR2 statements without ``label``."""
    root = tmp_path_factory.mktemp("official")
    write_shapes(world, root)
    nlvr2_test = root / "test_unlabelled.json"
    with open(root / FILES["nlvr2"].format(split="test")) as f, open(nlvr2_test, "w") as out:
        for line in f:
            rec = json.loads(line)
            rec.pop("label")
            out.write(json.dumps(rec) + "\n")
    return {"root": root, "nlvr2_test": nlvr2_test, "store": world_store(world, root / "regions.h5")}


def _vqa(root: Path, split: str, annotated: bool = True) -> dict:
    spec = {"questions": str(root / FILES["vqa_questions"].format(split=split))}
    if annotated:
        spec["annotations"] = str(root / FILES["vqa_annotations"].format(split=split))
    return spec


def _vqa_data(files, tok):
    root = files["root"]
    cfg = {"name": "vqa", "source": "files", "max_len": 40,
           "files": {"train": _vqa(root, "train"), "val": _vqa(root, "val"), "test": _vqa(root, "test", False)}}
    return VQATask.build_data(cfg, tok, RegionSource(files["store"], num_bb=100))


def test_every_task_of_the_registry_has_a_format():
    assert set(PREDICTIONS.names()) >= {"vqa", "nlvr2", "refexp", "retrieval"}


def test_vqa_results_cover_every_question_and_refuse_a_partial_file(files, tok, tmp_path):
    data = _vqa_data(files, tok)
    task = VQATask(tiny_model("uniter"), **data.options)
    test = data.eval["test"]
    assert not PREDICTIONS.get("vqa").labelled(test) and PREDICTIONS.get("vqa").labelled(data.eval["val"])
    out = tmp_path / "results.json"
    info = write_predictions(task, test, out, batch_size=3)
    results = json.loads(out.read_text())
    questions = json.loads(Path(_vqa(files["root"], "test", False)["questions"]).read_text())["questions"]
    assert [r["question_id"] for r in results] == [q["question_id"] for q in questions]
    assert info["count"] == len(questions)
    assert all(type(r["question_id"]) is int and r["answer"] in data.options["answers"] for r in results)
    assert set(results[0]) == {"question_id", "answer"}
    test.drop([str(questions[1]["question_id"])])  # as data.on_error=skip leaves an example out
    missing = questions[1]["question_id"]
    with pytest.raises(ValueError, match=rf"1 of {len(questions)} examples have no prediction \({missing}"):
        write_predictions(task, test, out)
    assert json.loads(out.read_text()) == results  # the previous file is untouched


def test_nlvr2_csv_without_labels(files, tok, tmp_path):
    root = files["root"]
    cfg = {"name": "nlvr2", "source": "files", "max_len": 40,
           "files": {"train": str(root / FILES["nlvr2"].format(split="train")), "test": str(files["nlvr2_test"])}}
    data = NLVR2Task.build_data(cfg, tok, RegionSource(files["store"], num_bb=100))
    task = NLVR2Task(tiny_model("uniter"), **data.options)
    assert not PREDICTIONS.get("nlvr2").labelled(data.eval["test"])
    out = tmp_path / "nlvr2.csv"
    write_predictions(task, data.eval["test"], out, batch_size=2)
    rows = list(csv.reader(out.read_text().splitlines()))
    expected = [json.loads(line)["identifier"] for line in files["nlvr2_test"].read_text().splitlines()]
    assert [r[0] for r in rows] == expected and all(r[1] in ("True", "False") for r in rows)
    assert all(len(r) == 2 for r in rows)  # no header: the official metrics.py reads every line


def test_refexp_boxes_are_coco_xywh_of_the_chosen_region(files, tok, tmp_path):
    root = files["root"]
    cfg = {"source": "files", "refs": str(root / FILES["refs"]), "instances": str(root / FILES["instances"]),
           "eval_splits": ["test"]}
    data = RefExp.build_data(cfg, tok, RegionSource(files["store"], num_bb=100))
    task = RefExp(tiny_model("uniter"))
    out = tmp_path / "refexp.json"
    write_predictions(task, data.eval["test"], out, batch_size=4)
    boxes = json.loads(out.read_text())
    assert [str(b["sent_id"]) for b in boxes] == data.eval["test"].example_ids()
    first = data.eval["test"].collator()([data.eval["test"][0]])
    x1, y1, x2, y2 = task.predict(first)["box"][0].tolist()
    assert boxes[0]["bbox"] == pytest.approx([x1, y1, x2 - x1, y2 - y1]) and boxes[0]["image_id"] == first.image_ids[0]


def test_retrieval_rankings_are_the_top_k_of_each_query(files, tok, tmp_path):
    cfg = {"source": "files", "path": str(files["root"] / FILES["karpathy"]), "eval_splits": ["test"]}
    data = Retrieval.build_data(cfg, tok, RegionSource(files["store"], num_bb=100))
    task = Retrieval(tiny_model("uniter"))
    test = data.eval["test"]
    out = tmp_path / "rankings.json"
    write_predictions(task, test, out, batch_size=8)
    rankings = json.loads(out.read_text())
    assert rankings["k"] == 10
    assert list(rankings["image_retrieval"]) == test.caption_ids and list(rankings["text_retrieval"]) == test.image_ids
    i2t, t2i = task.ranking_scores(test, batch_size=8)
    t = 0
    best = t2i[:, t].argsort(descending=True, stable=True)[: min(10, test.num_images)]
    assert rankings["image_retrieval"][test.caption_ids[t]] == [test.image_ids[i] for i in best.tolist()]
    assert all(len(v) == min(10, test.num_texts) for v in rankings["text_retrieval"].values())


# -- the command --------------------------------------------------------------------------------------
def test_vlkit_evaluate_writes_the_vqa_results_of_an_unlabelled_split(files, command_args, cache, tmp_path):
    from vlkit.cli import main

    root, ft = files["root"], tmp_path / "ft"
    train, val = _vqa(root, "train"), _vqa(root, "val")
    task_args = ["task=vqa", "task.source=files", f"task.files.train={{questions:{train['questions']},"
                 f"annotations:{train['annotations']}}}", f"task.files.val={{questions:{val['questions']},"
                 f"annotations:{val['annotations']}}}"]
    assert main(["finetune", "model=uniter", *task_args, *command_args(cache, ft, steps=2)]) == 0
    test_questions = _vqa(root, "test", False)["questions"]
    results = tmp_path / "test-dev.json"
    assert main(["evaluate", f"checkpoint={ft}", f"cache_dir={cache}", "task=vqa", "split=test",
                 f"task.files.test={{questions:{test_questions}}}", f"predictions={results}"]) == 0
    ids = [q["question_id"] for q in json.loads(Path(test_questions).read_text())["questions"]]
    assert [r["question_id"] for r in json.loads(results.read_text())] == ids
    assert not (ft / "eval.json").exists()  # no labels, no metrics
    # a labelled split: the file and the metrics, under the 2016 rules on request
    assert main(["evaluate", f"checkpoint={ft}", f"cache_dir={cache}", "split=val", "eval_options.rules=2016",
                 f"predictions={tmp_path / 'val.json'}"]) == 0
    metrics = json.loads((ft / "eval.json").read_text())
    assert 0.0 <= metrics["val/vqa"] <= 1.0 and any(k.startswith("val/vqa_qtype_") for k in metrics)
    assert len(json.loads((tmp_path / "val.json").read_text())) == len(
        json.loads(Path(val["questions"]).read_text())["questions"])
    with pytest.raises(ValueError, match="split="):
        main(["evaluate", f"checkpoint={ft}", f"cache_dir={cache}", "eval_splits=[val,test]",
              f"predictions={tmp_path / 'x.json'}"])
