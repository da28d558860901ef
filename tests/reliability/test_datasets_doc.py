"""docs/datasets.md: every command composes as written, and its VQA fine-tuning runs as written on tiny files in the
official schema (DATA_DIR and RUN replaced, tiny trainer settings added)."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from reliability_helpers import captions, jsonl_data, raw_store, regions, run_args

DOC = Path(__file__).resolve().parents[2] / "docs" / "datasets.md"


def doc_commands() -> list[list[str]]:
    """The ``vlkit ...`` commands of the page's bash blocks, as argument lists."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            args = shlex.split(line, comments=True)
            if args[:1] == ["vlkit"]:
                out.append(args[1:])
    return out


@pytest.mark.parametrize("args", doc_commands(), ids=lambda a: " ".join(a[:3]))
def test_every_command_composes(args):
    from vlkit.cli import compose

    cfg = compose(args[0], args[1:])
    if cfg.get("task") is not None and cfg.task.name is not None:
        assert cfg.task.source == "files"


def test_the_vqa_command_runs_as_written(tmp_path, vlkit_console):
    root = tmp_path / "DATA_DIR"
    (root / "vqa").mkdir(parents=True)
    (root / "coco").mkdir()
    images = {"train2014": [458752, 262146], "val2014": [393225]}
    store = raw_store(root / "coco" / "feats.h5", {f"COCO_{split}_{i:012d}": regions(i % 97)
                                                   for split, ids in images.items() for i in ids})
    for split, ids in images.items():
        questions = [{"image_id": i, "question": q, "question_id": i * 1000 + k}
                     for i in ids for k, q in enumerate(["What color is the shape?", "How many shapes are there?"])]
        answers = {0: "red", 1: "two"}
        (root / "vqa" / f"v2_OpenEnded_mscoco_{split}_questions.json").write_text(json.dumps(
            {"task_type": "Open-Ended", "data_type": "mscoco", "data_subtype": split, "questions": questions}))
        (root / "vqa" / f"v2_mscoco_{split}_annotations.json").write_text(json.dumps({"annotations": [
            {"question_id": q["question_id"], "image_id": q["image_id"], "answer_type": "other", "question_type": "what",
             "multiple_choice_answer": answers[q["question_id"] % 2],
             "answers": [{"answer": answers[q["question_id"] % 2], "answer_confidence": "yes", "answer_id": j + 1}
                         for j in range(10)]} for q in questions]}))
    run = tmp_path / "RUN"
    caps = captions(tmp_path / "caps.jsonl", [f"COCO_train2014_{i:012d}" for i in images["train2014"]])
    assert vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(run, 1))[0] == 0
    (vqa,) = [a for a in doc_commands() if "task=vqa" in a]
    args = [a.replace("DATA_DIR", str(root)).replace("=RUN", f"={run}") for a in vqa]
    out = tmp_path / "runs" / "uniter-vqa"
    args = [a for a in args if not a.startswith("trainer.output_dir=")] + run_args(out, 2)
    code, stdout, err = vlkit_console(*args)
    assert code == 0, err
    assert "val/vqa" in json.loads((out / "run.json").read_text())["metrics"]  # scored on the val2014 files
