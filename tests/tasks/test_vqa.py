"""VQA task: vocabulary, soft scores, official-format files, each family's head and loss, the exact
metric on hand-checked cases, and learning on the shapes world.

Shared helpers: shapes_helpers.py."""
from __future__ import annotations

import json
import math
from pathlib import Path
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vlkit
from shapes_helpers import (FAMILIES, first_batch, region_store, shapes_cfg, shapes_data_getter, tiny_model,
                            train_steps, world_store)
from vlkit.data.images import RegionSource
from vlkit.data.shapes import ShapesWorld, write_shapes
from vlkit.tasks.vqa import (HeadTask, VQATask, answer_vocabulary, baseline_accuracies, classification_loss,
                             question_only_answers, question_type_prior, shapes_vqa_records, soft_scores)

# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world() -> ShapesWorld:
    return ShapesWorld(seed=0, num_images=200)


@pytest.fixture(scope="module")
def store(world, tmp_path_factory) -> Path:
    return world_store(world, tmp_path_factory.mktemp("vqa") / "regions.h5")


@pytest.fixture(scope="module")
def shapes_data(world, store, tok):
    """``shapes_data(family)``: the shapes VQA data with that family's image source."""
    return shapes_data_getter(VQATask, "vqa", world, store, tok)


# --------------------------------------------------------------------------------------------
# Vocabulary and soft scores
# --------------------------------------------------------------------------------------------
def _q(mc: str | None, answers: list[str] | None = None) -> dict:
    return {"multiple_choice_answer": mc, "answers": answers or ([mc] * 10 if mc else [])}


def test_answer_vocabulary_by_frequency_of_normalised_answers():
    records = [_q("yes"), _q("Yes."), _q("yes"), _q("Two"), _q("2"), _q("no"), _q("blue"), _q("blue"),
               _q(None, ["red"] * 6 + ["blue"] * 4)]  # no multiple-choice answer: the most common human one
    assert answer_vocabulary(records) == ["yes", "2", "blue", "no", "red"]  # ties alphabetical
    assert answer_vocabulary(records, num_answers=2) == ["yes", "2"]
    with pytest.raises(ValueError, match="num_answers"):
        answer_vocabulary(records, num_answers=0)


def test_soft_scores_are_min_1_n_over_3_of_normalised_human_answers():
    vocab = {"yes": 0, "no": 1, "2": 2, "red": 3}
    answers = ["Two", "2", "two.", "yes", "Yes", "no", "maybe", "maybe", "maybe", "maybe"]
    labels, scores = soft_scores(answers, vocab)
    assert labels == [0, 1, 2]  # "maybe" is not in the vocabulary, "red" nobody said
    assert scores == pytest.approx([2 / 3, 1 / 3, 1.0])


def test_classification_losses():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 1.0, -2.0]])
    labels = torch.tensor([0, 2])
    onehot = F.one_hot(labels, 3).float()
    assert torch.allclose(classification_loss(logits, labels, "ce"), F.cross_entropy(logits, labels))
    bce = F.binary_cross_entropy_with_logits(logits, onehot)
    assert torch.allclose(classification_loss(logits, labels, "bce"), bce)
    assert torch.allclose(classification_loss(logits, onehot, "bce_instance"), 3 * bce)
    with pytest.raises(ValueError, match="unknown loss"):
        classification_loss(logits, labels, "hinge")


# --------------------------------------------------------------------------------------------
# Official files
# --------------------------------------------------------------------------------------------
def _write_vqa(folder: Path, split: str, questions: list[tuple[int, int, str, list[str], str]],
               annotate: bool = True) -> dict:
    """VQAv2 json files for (question_id, image_id, question, human answers, answer type)."""
    q_path = folder / f"v2_OpenEnded_mscoco_{split}2014_questions.json"
    q_path.write_text(json.dumps({"task_type": "Open-Ended", "data_subtype": f"{split}2014", "questions": [
        {"image_id": img, "question": text, "question_id": qid} for qid, img, text, _, _ in questions]}))
    spec = {"questions": str(q_path), "image_id_format": f"COCO_{split}2014_{{:012d}}"}
    if annotate:
        a_path = folder / f"v2_mscoco_{split}2014_annotations.json"
        a_path.write_text(json.dumps({"annotations": [
            {"question_id": qid, "image_id": img, "answer_type": kind, "question_type": "what",
             "multiple_choice_answer": max(set(ans), key=ans.count),
             "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": k + 1} for k, a in enumerate(ans)]}
            for qid, img, _, ans, kind in questions]}))
        spec["annotations"] = str(a_path)
    return spec


@pytest.fixture(scope="module")
def vqa_files(world, tmp_path_factory):
    """Hand-written VQAv2 train / val / test (no annotations) files over COCO-style image ids and
    an oracle region store for those ids."""
    folder = tmp_path_factory.mktemp("vqav2")
    train = [(10, 1, "is there a cat?", ["yes"] * 10, "yes/no"), (11, 1, "is it red?", ["yes"] * 9 + ["no"], "yes/no"),
             (12, 2, "is it big?", ["yes"] * 10, "yes/no"), (13, 2, "how many?", ["2"] * 10, "number"),
             (14, 3, "how many dogs?", ["two"] * 8 + ["3"] * 2, "number"),
             (15, 3, "how many cats?", ["3"] * 10, "number")]
    val = [(20, 4, "how many circles?", ["2"] * 10, "number"),
           (21, 4, "how many squares?", ["2"] * 2 + ["3"] * 8, "number"),
           (22, 5, "how many crosses?", ["two"] + ["3"] * 9, "number"),
           (23, 5, "is there a square?", ["yes"] * 10, "yes/no")]
    test = [(30, 6, "what is it?", [], "other")]
    files = {"train": _write_vqa(folder, "train", train), "val": _write_vqa(folder, "val", val),
             "test": _write_vqa(folder, "test", test, annotate=False)}
    ids = {f"COCO_{s}2014_{img:012d}": world.scene(img) for s, qs in (("train", train), ("val", val), ("test", test))
           for _, img, *_ in qs}
    return {"files": files, "store": region_store(folder / "regions.h5", ids)}


def test_vqav2_files_give_vocabulary_soft_targets_and_unannotated_test(vqa_files, tok):
    cfg = {"name": "vqa", "source": "files", "files": vqa_files["files"], "max_len": 12}
    data = VQATask.build_data(cfg, tok, RegionSource(vqa_files["store"], num_bb=100))
    assert data.options == {"answers": ["yes", "2", "3"], "majority_answer": "yes"}
    assert len(data.train) == 6 and set(data.eval) == {"val", "test"}
    example = data.train[4]  # eight "two" (-> "2"), two "3"
    assert example["image_id"] == "COCO_train2014_000000000003"
    assert example["targets"]["soft_targets"].tolist() == pytest.approx([0.0, 1.0, 2 / 3])
    assert example["targets"]["answer_type"] == "number" and len(example["targets"]["answers"]) == 10
    assert data.eval["test"][0]["targets"]["answers"] == []

    task = VQATask(tiny_model("uniter"), **data.options).eval()
    out = task.predict(first_batch(data.eval["test"], 1))
    assert out["ids"] == ["30"] and out["answers"][0] in data.options["answers"]
    with pytest.raises(ValueError, match="question '30'.*no human answers"):
        task.evaluate(data.eval["test"])


def test_files_source_needs_train_and_names_the_bad_file(tok, tmp_path, store):
    with pytest.raises(ValueError, match="files.train"):
        VQATask.build_data({"name": "vqa", "source": "files", "files": {"train": None}}, tok, None)
    bad = tmp_path / "questions.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="questions.json"):
        VQATask.build_data({"name": "vqa", "source": "files", "files": {"train": {"questions": str(bad)}}}, tok, None)
    with pytest.raises(ValueError, match="unknown source"):
        VQATask.build_data({"name": "vqa", "source": "web"}, tok, None)


def test_shapes_source_matches_the_written_official_files(tok, tmp_path):
    world = ShapesWorld(seed=3, num_images=30)
    write_shapes(world, tmp_path)
    src = RegionSource(world_store(world, tmp_path / "regions.h5"), num_bb=100)
    name = "v2_OpenEnded_mscoco_{s}_questions.json", "v2_mscoco_{s}_annotations.json"
    files = {s: {"questions": str(tmp_path / name[0].format(s=s)), "annotations": str(tmp_path / name[1].format(s=s))}
             for s in ("train", "val", "test")}
    from_files = VQATask.build_data({"name": "vqa", "source": "files", "files": files}, tok, src)
    from_world = VQATask.build_data(shapes_cfg("vqa"), tok, src, world)
    assert from_files.options == from_world.options
    assert set(from_files.eval) == set(from_world.eval) == {"val", "test"}
    pairs = [(from_files.train, from_world.train)] + [(from_files.eval[s], from_world.eval[s]) for s in ("val", "test")]
    for a, b in pairs:
        assert a.data.to_list() == b.data.to_list()
    records = shapes_vqa_records(world, 0)
    assert len(records) == 5 and all(len(r["answers"]) == 10 for r in records)


# --------------------------------------------------------------------------------------------
# Heads and losses
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_loss_is_bce_times_num_answers_and_backpropagates(family, shapes_data):
    data = shapes_data(family)
    task = VQATask(tiny_model(family), **data.options)
    batch = first_batch(data.train, 6)
    out = task(batch)
    assert torch.isfinite(out.loss) and 0.0 <= out.detached_metrics()["vqa_score"] <= 1.0
    out.loss.backward()
    head = dict(task.named_parameters())[f"{task.head_name}.3.weight"]
    assert head.grad is not None and head.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in task.model.parameters())
    task.eval()
    soft = batch.targets["soft_targets"]
    expected = F.binary_cross_entropy_with_logits(task.logits(batch), soft) * len(data.options["answers"])
    assert torch.allclose(task(batch).loss, expected)


def test_heads_have_the_official_names_and_layouts():
    std = {}
    for family in FAMILIES:
        model = tiny_model(family)
        task = VQATask(model, num_answers=7)
        std[family] = task
        j = model.joint_size
        head = task.head
        official = {"vilbert": "vil_prediction", "uniter": "vqa_output", "meter": "vqa_classifier"}[family]
        assert task.head_name == official and f"{task.head_name}.0.weight" in task.state_dict()
        assert head[-1].weight.shape == (7, head[0].out_features)
        if family == "meter":  # Linear(J, J), LayerNorm(1e-5), GELU, Linear
            assert head[0].weight.shape == (j, j) and isinstance(head[1], nn.LayerNorm) and head[1].eps == 1e-5
            assert isinstance(head[2], nn.GELU)
        else:  # Linear(J, 2J), GELU, LayerNorm(1e-12), Linear
            assert head[0].weight.shape == (2 * j, j) and isinstance(head[1], nn.GELU) and head[2].eps == 1e-12
    assert std["vilbert"].joint_dropout.p == 0.1 and std["uniter"].joint_dropout.p == 0.0
    assert std["meter"].joint_dropout.p == 0.0 and all(t.loss_kind == "bce_instance" for t in std.values())
    with pytest.raises(ValueError, match="answers"):
        VQATask(tiny_model("uniter"))
    with pytest.raises(ValueError, match="num_answers=3 but 2"):
        VQATask(tiny_model("uniter"), answers=["a", "b"], num_answers=3)


def test_vilbert_task_tokens_get_the_official_task_id(shapes_data):
    data = shapes_data("vilbert")
    model = tiny_model("vilbert", task_specific_tokens=True)
    task = VQATask(model, **data.options).eval()
    batch = first_batch(data.train)
    with pytest.raises(ValueError, match="task_ids"):
        model(batch)
    assert model.task_inputs("vqa", batch)["task_ids"].tolist() == [1] * batch.batch_size  # vilbert_tasks.yml TASK1
    logits = task.logits(batch)
    other = VQATask(model, **data.options, task_id=5).eval()
    other.load_state_dict(task.state_dict())
    assert not torch.allclose(logits, other.logits(batch))  # the task token is really read


def test_build_task_by_name():
    task = vlkit.build_task("vqa", tiny_model("uniter"), num_answers=4)
    assert isinstance(task, VQATask) and isinstance(task, HeadTask) and task.answers is None
    assert task.predict(tiny_model("uniter").example_batch(2))["answers"] is None


# --------------------------------------------------------------------------------------------
# The metric
# --------------------------------------------------------------------------------------------
def test_evaluate_gives_the_official_accuracy_on_hand_checked_questions(vqa_files, tok):
    cfg = {"name": "vqa", "source": "files", "files": vqa_files["files"], "max_len": 12}
    data = VQATask.build_data(cfg, tok, RegionSource(vqa_files["store"], num_bb=100))
    task = VQATask(tiny_model("uniter"), **data.options)
    last = task.head[-1]
    with torch.no_grad():  # always answer "2"
        last.weight.zero_()
        last.bias.fill_(-10.0)
        last.bias[data.options["answers"].index("2")] = 10.0
    metrics = task.evaluate(data.eval["val"], batch_size=3)
    # humans: ten "2" -> 1; two "2" / eight "3" -> (2 * 1/3 + 8 * 2/3) / 10 = 0.6;
    # one "two" (normalised to "2": the humans disagree) / nine "3" -> 9 * 1/3 / 10 = 0.3; ten "yes" -> 0
    assert metrics["vqa"] == pytest.approx((1 + 0.6 + 0.3 + 0) / 4)
    # per type, the 10-choose-9 means too (the last leave-one-out alone would give (1 + 2/3 + 1/3) / 3)
    assert metrics["vqa_number"] == pytest.approx((1 + 0.6 + 0.3) / 3) and metrics["vqa_yes_no"] == 0.0
    assert metrics["vqa_soft_score"] == pytest.approx((1 + 2 / 3 + 1 / 3 + 0) / 4)
    assert metrics["vqa_majority_baseline"] == pytest.approx(0.25)  # "yes" is right on the last question only
    assert task.training  # evaluate restores the mode


# --------------------------------------------------------------------------------------------
# Question-only baselines
# --------------------------------------------------------------------------------------------
def _record(question: str, answer: str, answer_type: str, question_type: str) -> dict:
    return {"question": question, "answers": [answer] * 10, "multiple_choice_answer": answer,
            "answer_type": answer_type, "question_type": question_type}


def test_question_only_model_reads_what_a_question_gives_away():
    """A planted leak: the colour named in an "is there" question decides its answer. The bag-of-words
    model finds it; the per-question-type prior cannot; the scores are the official accuracy."""
    colors = ["red", "green", "blue", "cyan"]
    train = [_record(f"is there a {c} {k}?", "yes" if c in ("red", "green") else "no", "yes/no", "is there a")
             for c in colors for k in ("circle", "square", "cross", "diamond", "triangle") for _ in range(3)]
    train += [_record("how many circles are there?", str(n), "number", "how many") for n in (1, 2, 2)]
    val = [_record(f"is there a {c} shape?", "yes" if c in ("red", "green") else "no", "yes/no", "is there a")
           for c in colors]
    answers = answer_vocabulary(train)
    assert question_only_answers(train, [r["question"] for r in val], answers) == ["yes", "yes", "no", "no"]
    assert question_type_prior(train, val + train[-1:]) == ["no"] * 4 + ["2"]  # ties: alphabetical
    out = baseline_accuracies(train, val, answers, "2021")
    assert out["vqa_blind_yes_no"] == pytest.approx(1.0) and out["vqa_prior_yes_no"] == pytest.approx(0.5)
    assert baseline_accuracies(train, [{**r, "answers": []} for r in val], answers, "2021") == {}  # test-dev
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    question_only_answers(train, [r["question"] for r in val], answers)
    assert torch.equal(torch.rand(3), expected)  # the global RNG is untouched: a fine-tuning's seed stays its own


def test_question_only_model_answers_what_the_soft_scores_reward():
    """Counts whose annotators also give the neighbouring count: "2" is the most common target answer, but "1"
    earns the most VQA accuracy over these questions (partial credit from the neighbours); trained on the soft
    scores, the blind model answers "1"."""
    def count(answer: str, neighbour: str) -> dict:
        return {"question": "how many shapes are there?", "answers": [answer] * 8 + [neighbour] * 2,
                "multiple_choice_answer": answer, "answer_type": "number", "question_type": "how many"}

    train = [count("2", "1")] * 4 + [count("1", "0")] * 3  # expected score: "2" 4, "1" 4 x 2/3 + 3
    answers = answer_vocabulary(train)
    assert answers[0] == "2"  # the most common target answer
    assert question_only_answers(train, ["how many shapes are there?"], answers) == ["1"]


@pytest.mark.parametrize("rounds", [1, 4])
def test_shapes_questions_give_nothing_away_beyond_their_type(rounds):
    """The balanced world: the question-only model scores within 5 points of the per-question-type prior on
    every answer type (the default comparison's splits, 4 rounds of questions per image): nothing above it
    leaks from the question, and trained on the soft scores it also takes the annotators' partial credit that
    the prior's answer collects."""
    w = ShapesWorld(seed=0, num_images=600, val_images=400, eval_rounds=rounds, train_rounds=rounds)
    train, val = ([r for i in w.indices(s) for r in shapes_vqa_records(w, i)] for s in ("train", "val"))
    out = baseline_accuracies(train, val, answer_vocabulary(train), "2021")
    for kind in ("yes_no", "number", "other"):
        assert abs(out[f"vqa_blind_{kind}"] - out[f"vqa_prior_{kind}"]) <= 0.05, (kind, out)
    assert out["vqa_prior_yes_no"] < 0.7 and out["vqa_prior_number"] < 0.45  # no answer dominates its type


# --------------------------------------------------------------------------------------------
# Learning on the shapes world
# --------------------------------------------------------------------------------------------
def test_uniter_learns_vqa_on_shapes_well_above_the_majority_answer(shapes_data):
    data = shapes_data("uniter")
    torch.manual_seed(0)
    task = VQATask(tiny_model("uniter"), **data.options)
    before = task.evaluate(data.eval["val"])
    out = train_steps(task, data.train, steps=100, lr=1e-3)
    assert math.isfinite(out.loss.item())
    after = task.evaluate(data.eval["val"])
    assert after["vqa_majority_baseline"] == before["vqa_majority_baseline"] > 0.1
    assert after["vqa"] > after["vqa_majority_baseline"] + 0.1, after
    assert after["vqa_blind_baseline"] == before["vqa_blind_baseline"] < after["vqa"], after
    assert after["vqa"] > before["vqa"] + 0.1
