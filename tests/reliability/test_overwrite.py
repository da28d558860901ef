"""Catalogue, issue 44 class 8: ``vlkit convert ... overwrite=true`` over an existing folder builds the new one
beside it and swaps it in whole; a folder that holds a converted checkpoint is no run to continue."""
from __future__ import annotations

import json

from refusal_cases import CASES, converted_over_a_run, convert_args


def test_convert_overwrite_replaces_a_finetuning_run_whole(tmp_path):
    dst = converted_over_a_run(tmp_path)  # held checkpoints/, task.safetensors, tokenizer/ and metrics.jsonl
    assert sorted(p.name for p in dst.iterdir()) == ["model", "run.json", "task.safetensors"]
    assert (dst / "task.safetensors").read_bytes() != b"old"  # the converted task weights, not the old run's
    assert json.loads((dst / "run.json").read_text())["converted"]["family"] == "uniter"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left beside it


def test_convert_over_a_folder_without_overwrite_keeps_it(tmp_path, vlkit_console):
    dst = tmp_path / "dst"
    (dst / "checkpoints").mkdir(parents=True)
    code, _, err = vlkit_console(*convert_args(tmp_path, dst))
    assert code == 1 and "pass overwrite=true to replace it" in err and sorted(dst.iterdir()) == [dst / "checkpoints"]


def test_finetune_resume_over_a_converted_folder_does_not_continue_an_old_run(tmp_path, vlkit_console):
    make, expected = CASES["finetune resume=true over a converted folder"]
    code, _, err = vlkit_console(*make(tmp_path))
    dst = tmp_path / "run"
    assert code == 1 and expected in err and f"init={dst}" in err
    assert sorted(p.name for p in dst.iterdir()) == ["model", "run.json", "task.safetensors"]  # nothing written
