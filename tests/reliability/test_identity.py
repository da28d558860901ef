"""Issue 44, class 2: identity by content, not path. A comparison unit's identity includes the content of every
file it reads (`vlkit.digests`): after a task's answers file changed, resume reruns the units that read it and
says why. Every finished unit records the digest of its results; one edited by hand is reported as altered and
rerun, never reused."""
import json
import re
from pathlib import Path

import pytest

from vlkit.compare.units import UnitFolder, status
from vlkit.digests import file_digest, input_digests, result_digest

UNITS = ["uniter/seed0/pretrain", "uniter/seed0/scratch-vqa", "uniter/seed0/scratch-nlvr2",
         "uniter/seed0/pretrained-vqa", "uniter/seed0/pretrained-nlvr2"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from vlkit.cli import main

    root = tmp_path_factory.mktemp("world")
    assert main(["make-shapes", f"out={root}", "num_images=40", "val_images=12"]) == 0
    return root


def _comparison(world: Path, tmp_path: Path) -> list[str]:
    files = {s: {"questions": str(world / f"v2_OpenEnded_mscoco_{s}_questions.json"),
                 "annotations": str(world / f"v2_mscoco_{s}_annotations.json")} for s in ("train", "val")}
    path = tmp_path / "files.yaml"
    path.write_text(f"""# @package _global_
defaults:
  - smoke
  - _self_
compare:
  seeds: [0]
  zero_shot: false
  tasks: [vqa, nlvr2]
  itm_pairs: 16
  task_overrides:
    vqa: {{source: files, files: {json.dumps(files)}}}
  runs:
    - {{name: uniter, model: {{name: uniter, preset: tiny}}, objectives: uniter}}
""")
    return ["compare", f"compare={path}", f"output_dir={tmp_path / 'out'}", "threads=1", "workers=1", "progress=false",
            f"cache_dir={tmp_path / 'cache'}"]


def _attempts(out: Path) -> dict[str, int]:
    return {key: json.loads((out / "runs" / key / "unit.json").read_text())["attempt"] for key in UNITS}


def test_digests_are_cached_by_size_and_mtime_and_name_only_paths(tmp_path, monkeypatch):
    import vlkit.digests

    f = tmp_path / "answers.json"
    f.write_text('{"a": 1}')
    reads = []
    real = vlkit.digests.sha256_file
    monkeypatch.setattr(vlkit.digests, "sha256_file", lambda p: reads.append(p) or real(p))
    first = file_digest(f)
    assert file_digest(f) == first and len(reads) == 1  # read once
    f.write_text('{"a": 2}')
    assert file_digest(f) != first and len(reads) == 2  # rewritten: read again
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shapes").mkdir()  # a bare word is a name even where a folder of that name exists
    assert input_digests({"tokenizer": "shapes", "files": [str(f)], "split": "val"}) == {str(f): file_digest(f)}


def test_a_changed_answers_file_reruns_the_units_that_read_it_and_says_why(world, tmp_path, vlkit_console):
    args = _comparison(world, tmp_path)
    out = tmp_path / "out"
    code, _, err = vlkit_console(*args)
    assert code == 0, err
    answers = world / "v2_mscoco_val_annotations.json"
    vqa = json.loads((out / "runs" / "uniter/seed0/scratch-vqa" / "unit.json").read_text())
    assert vqa["config"]["inputs"][str(answers)] == file_digest(answers)  # the content is the identity
    assert "inputs" not in json.loads((out / "runs" / "uniter/seed0/pretrain" / "unit.json").read_text())["config"]
    before = _attempts(out)

    body = json.loads(answers.read_text())
    first = body["annotations"][0]
    other = next(a["multiple_choice_answer"] for a in body["annotations"]
                 if a["multiple_choice_answer"] != first["multiple_choice_answer"])
    first["multiple_choice_answer"] = other
    first["answers"] = [{**a, "answer": other} for a in first["answers"]]
    answers.write_text(json.dumps(body))

    code, _, err = vlkit_console(*args, "resume=true")
    assert code == 0, err
    for key in ("uniter/seed0/scratch-vqa", "uniter/seed0/pretrained-vqa"):
        assert re.search(rf"{key} runs again: input file\(s\) changed since it finished: inputs\.{re.escape(str(answers))}",
                         err), err
    after = _attempts(out)
    rerun = {k for k in UNITS if after[k] != before[k]}
    assert rerun == {"uniter/seed0/scratch-vqa", "uniter/seed0/pretrained-vqa"}  # the units that read the file
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True
    vqa = json.loads((out / "runs" / "uniter/seed0/scratch-vqa" / "unit.json").read_text())
    assert vqa["config"]["inputs"][str(answers)] == file_digest(answers)


def test_a_result_edited_by_hand_is_reported_altered_and_rerun(world, tmp_path, vlkit_console):
    args = _comparison(world, tmp_path)
    out = tmp_path / "out"
    code, _, err = vlkit_console(*args)
    assert code == 0, err
    path = out / "runs" / "uniter/seed0/scratch-nlvr2" / "unit.json"
    state = json.loads(path.read_text())
    assert state["result_digest"] == result_digest(state["result"])
    computed = state["result"]["metrics"]["nlvr2"]
    state["result"]["metrics"]["nlvr2"] = 0.99  # a better number typed in
    path.write_text(json.dumps(state, indent=2))
    assert status(UnitFolder(path.parent, "").read(), state["hash"]) == "altered"
    before = _attempts(out)

    code, _, err = vlkit_console(*args, "resume=true")
    assert code == 0, err
    assert "uniter/seed0/scratch-nlvr2 runs again: its result in unit.json was edited after the unit wrote it" in err
    after = _attempts(out)
    assert {k for k in UNITS if after[k] != before[k]} == {"uniter/seed0/scratch-nlvr2"}
    rerun = json.loads(path.read_text())
    assert rerun["result"]["metrics"]["nlvr2"] == computed and rerun["result_digest"] == result_digest(rerun["result"])
    row = next(r for r in json.loads((out / "results.json").read_text())["records"] if r["variant"] == "scratch")
    assert row["nlvr2"] == computed
