"""The user-facing refusals of issue 44 (classes 4, 5, 7, 8, 9) as command lines with the files they need:
each class's test runs its own, and test_refusals.py runs every one through the console script.

A case is ``(name, make, argv, expected)``: ``make(tmp_path) -> {name: path}`` writes the files, ``argv``
names them as ``{name}`` (``{tmp}`` is the case's folder), ``expected`` is a phrase the message must hold."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

from reliability_helpers import captions, jsonl_data, raw_store, regions, run_args, shapes_store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BROKEN_YAML = "mlm:\n  weight: 1\n bad: [\n"  # line 3 is indented less than its mapping


class Payload:
    """A pickle that would run a command when loaded (it never is)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def hostile_pickle(path: Path) -> Path:
    path.write_bytes(pickle.dumps(Payload(path.with_name("PWNED"))))
    return path


def truncated_pickle(path: Path) -> Path:
    path.write_bytes(pickle.dumps({f"answer{k}": k for k in range(50)})[:40])
    return path


def uniter_config(tmp: Path) -> Path:
    meta = json.loads((FIXTURES / "uniter_vqa.json").read_text())
    path = tmp / "uniter-base.json"
    path.write_text(json.dumps(meta["config_json"]))
    return path


def convert_args(tmp: Path, dst: Path, *extra: str, src: str = "uniter_vqa.pt") -> list[str]:
    """``vlkit convert`` of a tiny released UNITER (tests/fixtures) into ``dst``, as conf/convert.yaml's example."""
    return ["convert", "family=uniter", f"src={FIXTURES / src}", f"dst={dst}", f"config={uniter_config(tmp)}", *extra]


def shapes_run(tmp: Path, *extra: str, out: Path | None = None) -> list[str]:
    """A fine-tuning command on a 20-image shapes world whose regions a raw store holds (no extraction)."""
    store, _ = shapes_store(tmp / "shapes.h5", 20)
    return ["finetune", "model=uniter", "data.num_images=20", "data.image.source=features",
            f"data.image.path={store}", f"cache_dir={tmp / 'cache'}", *run_args(out or tmp / "out", 1), *extra]


def refexp_files(tmp: Path, refs: Path) -> list[str]:
    """``task=refexp`` on RefCOCO files: ``refs`` (refs(unc).p) and an empty COCO instances.json."""
    (tmp / "instances.json").write_text(json.dumps({"images": [], "annotations": []}))
    return ["task=refexp", "task.source=files", f"task.refs={refs}", f"task.instances={tmp / 'instances.json'}"]


def vqa_files(tmp: Path, duplicate: bool = True, string_ids: bool = False) -> tuple[Path, Path]:
    """VQA v2 questions and annotations of the shapes world's images; the annotations give question_id 2 twice
    (``duplicate``); ``string_ids``: every question_id a string ("q1" ...), as the official files never write them."""
    from vlkit.data.shapes import ShapesWorld

    world = ShapesWorld(0, 20, 128)
    questions = [{"question_id": f"q{k}" if string_ids else k, "image_id": world.image_id(k % 10),
                  "question": "what colour is the circle"} for k in range(1, 5)]
    anns = [{"question_id": q["question_id"], "image_id": q["image_id"], "answer_type": "other",
             "question_type": "what color", "multiple_choice_answer": "red",
             "answers": [{"answer": "red", "answer_id": j} for j in range(1, 11)]} for q in questions]
    if duplicate:
        anns.append({**anns[1], "multiple_choice_answer": "blue",
                     "answers": [{"answer": "blue", "answer_id": j} for j in range(1, 11)]})
    (tmp / "questions.json").write_text(json.dumps({"questions": questions}))
    (tmp / "annotations.json").write_text(json.dumps({"annotations": anns}))
    return tmp / "questions.json", tmp / "annotations.json"


def broken_yaml(tmp: Path) -> Path:
    path = tmp / "bad.yaml"
    path.write_text(BROKEN_YAML)
    return path


def jsonl_run(tmp: Path, *extra: str, steps: int = 1) -> list[str]:
    images = {f"img{k}": regions(k) for k in range(6)}
    store = raw_store(tmp / "store.h5", images)
    caps = captions(tmp / "caps.jsonl", list(images))
    return ["pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(tmp / "out", steps), *extra]


def comparison_file(tmp: Path, run: str) -> Path:
    """A comparison of the shapes world (the smoke preset, one seed, VQA) whose only run is ``run``."""
    path = tmp / "mine.yaml"
    path.write_text(f"defaults: [smoke, _self_]\nseeds: [0]\ntasks: [vqa]\nruns:\n  - {run}\n")
    return path


def converted_over_a_run(tmp: Path) -> Path:
    """A folder that held a fine-tuning run (checkpoints, task weights, tokenizer) that vlkit convert replaced."""
    from vlkit.cli import main

    dst = tmp / "run"
    for name in ("checkpoints/step_1/model.safetensors", "task.safetensors", "tokenizer/vocab.txt", "metrics.jsonl"):
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).write_text("old")
    assert main(convert_args(tmp, dst, "overwrite=true")) == 0
    return dst


# name -> (argv from the case's folder, a phrase of the expected message)
CASES = {
    # class 4: input-caused exceptions are clean errors
    "objectives= broken YAML": (lambda t: jsonl_run(t, f"objectives={broken_yaml(t)}"), "bad.yaml:3:2: not valid YAML"),
    "data= broken YAML": (lambda t: ["pretrain", f"data={broken_yaml(t)}"], "bad.yaml:3:2: not valid YAML"),
    "RefCOCO refs.p hostile": (lambda t: shapes_run(t, *refexp_files(t, hostile_pickle(t / "refs.p"))),
                               "refs.p: refusing to unpickle posix.system"),
    "RefCOCO refs.p truncated": (lambda t: shapes_run(t, *refexp_files(t, truncated_pickle(t / "refs.p"))),
                                 "refs.p: not a readable pickle"),
    "VQA answers pickle hostile": (lambda t: convert_args(t, t / "dst", "task=vqa",
                                                          f"answers={hostile_pickle(t / 'ans2label.pkl')}"),
                                   "ans2label.pkl: refusing to unpickle posix.system"),
    "VQA answers pickle truncated": (lambda t: convert_args(t, t / "dst", "task=vqa",
                                                            f"answers={truncated_pickle(t / 'ans2label.pkl')}"),
                                     "ans2label.pkl: not a readable pickle"),
    "a key of a command without that group": (lambda t: ["convert", "src=x.pt", "trainer=uniter"],
                                              "unknown key 'trainer'"),
    # class 5: values checked before any data work, named as the user wrote them
    "trainer.max_steps=abc": (lambda t: ["pretrain", "trainer.max_steps=abc", f"cache_dir={t / 'cache'}",
                                         f"trainer.output_dir={t / 'out'}"], "trainer.max_steps='abc': give a whole number"),
    "compare.checkpoint_every=-1": (lambda t: ["compare", "compare=smoke", "compare.checkpoint_every=-1",
                                               f"output_dir={t / 'cmp'}"], "compare.checkpoint_every must be >= 0, got -1"),
    "workers=0": (lambda t: ["compare", "compare=smoke", "workers=0", f"output_dir={t / 'cmp'}"],
                  "workers must be >= 1, got 0"),
    "threads=0": (lambda t: ["compare", "compare=smoke", "threads=0", f"output_dir={t / 'cmp'}"],
                  "threads must be >= 1, got 0"),
    "compare.itm_pairs=-5": (lambda t: ["compare", "compare=smoke", "compare.itm_pairs=-5", f"output_dir={t / 'cmp'}"],
                             "compare.itm_pairs must be >= 0, got -5"),
    "data=coco without its paths": (lambda t: ["pretrain", "data=coco", f"trainer.output_dir={t / 'out'}"],
                                    "needs data.path"),
    "model.hidden_size=abc": (lambda t: ["pretrain", "model.hidden_size=abc", f"trainer.output_dir={t / 'out'}"],
                              "model.hidden_size='abc': give a whole number"),
    # class 7: readers refuse what the publisher forbids, writers what their file cannot hold
    "VQA question_id twice": (lambda t: shapes_run(t, "task=vqa", "task.source=files", "task.num_answers=2",
                                                   "task.files.train={questions:'%s',annotations:'%s'}" % vqa_files(t)),
                              "gives question_id 2 again (first at annotations[1])"),
    "VQA string question_id": (lambda t: shapes_run(t, "task=vqa", "task.source=files", "task.num_answers=2",
                                                    "task.files.train={questions:'%s',annotations:'%s'}"
                                                    % vqa_files(t, duplicate=False, string_ids=True)),
                               "annotations.json: annotations[0]: question_id 'q1' is a str; the VQA format's question ids "
                               "are integers"),
    # issue 54: a mix the model cannot serve, refused by the comparison's preflight
    "compare: MIM on UNITER": (lambda t: ["compare", "compare=%s" % comparison_file(
        t, "{name: uniter_mim, model: {name: uniter, preset: tiny}, objectives: meter_mim_discrete}"),
        f"output_dir={t / 'out'}", "threads=1", "workers=1", "progress=false"],
        "run uniter_mim: objective mix: mim masks image patches; uniter takes regions"),
    "predictions= an existing folder": (lambda t: ["evaluate", f"checkpoint={t / 'absent'}", "split=test",
                                                   f"predictions={t}"], "is a folder; name the file to write"),
    # class 8: overwrite replaces, and a replaced run is not continued
    "convert over a folder without overwrite": (lambda t: convert_args(t, converted_over_a_run(t)),
                                                "pass overwrite=true to replace it"),
    "finetune resume=true over a converted folder": (
        lambda t: shapes_run(t, "task=vqa", "resume=true", out=converted_over_a_run(t)),
        "holds a saved model"),
}
