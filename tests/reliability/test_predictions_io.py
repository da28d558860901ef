"""Catalogue, issue 44 class 7: prediction writers quote what their format cannot hold bare, readers refuse what
the publisher's format forbids (one question_id twice), and an output path that cannot be written is refused
before the split is predicted."""
from __future__ import annotations

import csv
import json

import pytest
import torch
from refusal_cases import CASES, vqa_files
from reliability_helpers import FEAT, raw_store, regions

from vlkit.data.formats import FormatError, read_vqa


def test_an_nlvr2_identifier_holding_a_comma_is_quoted_and_read_back(tmp_path):
    import vlkit
    from vlkit.data.images import RegionSource
    from vlkit.data.tokenizers import build_tokenizer
    from vlkit.tasks.nlvr2 import NLVR2Task
    from vlkit.tasks.predictions import read_nlvr2_predictions, write_predictions

    store = raw_store(tmp_path / "s.h5", {f"img{k}": regions(k) for k in range(4)})
    identifiers = ["dev-1-0-0", 'dev-2,3-0-1', 'dev-"4"-0-0', "dev-5-0-1"]
    with open(tmp_path / "nlvr2.jsonl", "w") as f:
        for k, ident in enumerate(identifiers):
            f.write(json.dumps({"identifier": ident, "left_image": f"img{k % 4}", "right_image": f"img{(k + 1) % 4}",
                                "sentence": "there is a red circle", "label": ["True", "False"][k % 2]}) + "\n")
    tok = build_tokenizer("shapes")
    cfg = {"name": "nlvr2", "source": "files", "max_len": 20,
           "files": {"train": str(tmp_path / "nlvr2.jsonl"), "test": str(tmp_path / "nlvr2.jsonl")}}
    data = NLVR2Task.build_data(cfg, tok, RegionSource(store, num_bb=100))
    torch.manual_seed(0)
    task = NLVR2Task(vlkit.build_model("uniter", preset="tiny", vocab_size=len(tok), v_feature_size=FEAT),
                     **data.options)
    out = tmp_path / "nlvr2.csv"
    write_predictions(task, data.eval["test"], out, batch_size=2)
    rows = list(csv.reader(out.open(newline="")))
    assert [r[0] for r in rows] == identifiers and all(len(r) == 2 for r in rows)  # was 3 fields on the comma's row
    assert '"dev-2,3-0-1"' in out.read_text()
    assert list(read_nlvr2_predictions(out)) == identifiers


def test_the_nlvr2_reader_names_a_broken_row(tmp_path):
    from vlkit.tasks.predictions import read_nlvr2_predictions

    (tmp_path / "p.csv").write_text("dev-1-0-0,True\ndev-2,3-0-1,False\n")
    with pytest.raises(ValueError, match=r"p\.csv:2: expected identifier,True\|False, got 3 field"):
        read_nlvr2_predictions(tmp_path / "p.csv")


def test_vqa_annotations_giving_one_question_id_twice_are_refused(tmp_path, vlkit_console):
    questions, annotations = vqa_files(tmp_path)
    with pytest.raises(FormatError, match=rf"{annotations}: annotations\[4\] gives question_id 2 again "
                                          r"\(first at annotations\[1\]\)"):
        read_vqa(questions, annotations)
    data = json.loads(questions.read_text())
    data["questions"].append(data["questions"][0])
    questions.write_text(json.dumps(data))
    with pytest.raises(FormatError, match=r"questions\[4\] gives question_id 1 again"):
        read_vqa(questions)
    make, expected = CASES["VQA question_id twice"]  # fine-tuning on them: refused before step 1 (it exited 0)
    cli = tmp_path / "cli"
    cli.mkdir()
    code, _, err = vlkit_console(*make(cli))
    assert code == 1 and expected in err and not (cli / "out" / "checkpoints").exists()


def test_vqa_string_question_ids_are_refused_naming_the_file_and_the_first_id(tmp_path, vlkit_console):
    """Issue 54: the official VQA files give integer question ids (the VQA API's getQuesIds: "integer array of
    question ids"); at 455e9a4 string ids ended in a 60-line ArrowTypeError traceback called a bug."""
    questions, annotations = vqa_files(tmp_path, duplicate=False, string_ids=True)
    with pytest.raises(FormatError, match=rf"{questions}: questions\[0\]: question_id 'q1' is a str; the VQA format's "
                                          r"question ids are integers"):
        read_vqa(questions)
    with pytest.raises(FormatError, match=rf"{annotations}: annotations\[0\]: question_id 'q1' is a str"):
        read_vqa(questions, annotations)
    make, expected = CASES["VQA string question_id"]  # fine-tuning on them: refused before step 1
    cli = tmp_path / "cli"
    cli.mkdir()
    code, _, err = vlkit_console(*make(cli))
    assert code == 1 and expected in err and "looks like a bug" not in err, err
    assert not (cli / "out" / "checkpoints").exists()


def test_predictions_naming_an_existing_folder_is_refused_before_predicting(tmp_path, vlkit_console):
    code, _, err = vlkit_console(*CASES["predictions= an existing folder"][0](tmp_path))
    # refused before the checkpoint is even read (it does not exist): no split is predicted first
    assert code == 1 and f"predictions={tmp_path} is a folder" in err and "absent" not in err
    (tmp_path / "afile").write_text("x")
    code, _, err = vlkit_console("evaluate", f"checkpoint={tmp_path / 'absent'}", "split=test",
                                 f"predictions={tmp_path / 'afile' / 'p.json'}")
    assert code == 1 and "afile is a file, not a folder" in err
