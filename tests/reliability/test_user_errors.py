"""Catalogue, issue 44 class 4: an exception caused by input is a clean error of a few lines naming the user's
file (and line), never a traceback ending "this looks like a bug in vlkit"."""
from __future__ import annotations

import json

import pytest
from refusal_cases import CASES, broken_yaml, convert_args, jsonl_run


@pytest.mark.parametrize("group", ["objectives", "data"])
def test_a_broken_yaml_file_names_the_users_file_and_line_not_a_copy(group, tmp_path, vlkit_console):
    bad = broken_yaml(tmp_path)
    code, _, err = vlkit_console(*jsonl_run(tmp_path, f"{group}={bad}"))
    assert code == 1 and f"{group}= file {bad}:3:2: not valid YAML" in err and "bad: [" in err
    assert "vlkit-conf-" not in err and "file_0_" not in err  # not the temporary copy Hydra reads
    assert "Traceback" not in err and "looks like a bug" not in err and len(err.splitlines()) <= 5
    assert not (tmp_path / "out").exists()


def test_a_yaml_file_that_is_not_a_mapping_is_named(tmp_path, vlkit_console):
    (tmp_path / "mix.yaml").write_text("- mlm\n- itm\n")
    code, _, err = vlkit_console("pretrain", f"objectives={tmp_path / 'mix.yaml'}")
    assert code == 1 and f"objectives= file {tmp_path / 'mix.yaml'}: expected a mapping of keys" in err


@pytest.mark.parametrize("case", ["RefCOCO refs.p hostile", "RefCOCO refs.p truncated", "VQA answers pickle hostile",
                                  "VQA answers pickle truncated"])
def test_refused_pickles_come_out_clean(case, tmp_path, vlkit_console):
    make, expected = CASES[case]
    code, _, err = vlkit_console(*make(tmp_path))
    assert code == 1 and expected in err and "Traceback" not in err and "looks like a bug" not in err
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "dst").exists()


def test_convert_task_vqa_as_conf_convert_yaml_shows_it(tmp_path, vlkit_console):
    """``vlkit convert family=uniter src=... dst=... config=... task=vqa`` ended in a RecursionError: ``task`` is a
    plain key of convert but a config group of the training commands, and the error path composed itself again."""
    dst = tmp_path / "uniter-vqa"
    code, out, err = vlkit_console(*convert_args(tmp_path, dst, "task=vqa"))
    assert code == 0, err
    assert json.loads((dst / "run.json").read_text())["task"] == "vqa" and '"kind": "vqa"' in out
    code, _, err = vlkit_console("convert", "src=x.pt", "trainer=uniter")  # a group convert has no place for
    assert code == 2 and "unknown key 'trainer'" in err and "Recursion" not in err
