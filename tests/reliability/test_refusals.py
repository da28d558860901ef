"""Every user-facing refusal of the catalogue (tests/reliability/), run through the console script: a clean
error of a few lines naming its culprit, never a traceback or "this looks like a bug in vlkit" (issue 44,
class 4). The cases of issue 44 are in refusal_cases.py; the earlier catalogue's command-line refusals follow."""
from __future__ import annotations

import pytest
from refusal_cases import CASES, broken_yaml, jsonl_run
from reliability_helpers import captions, jsonl_data, raw_store, regions, run_args

EARLIER = {  # the refusals of the earlier rows of docs/reliability.md that a command line reaches
    "an unknown key": (lambda t: ["pretrain", "trainer.max_step=3"], "did you mean trainer.max_steps?"),
    "an unknown model": (lambda t: ["pretrain", "model=unitr"], "did you mean model=uniter?"),
    "an unknown objective": (lambda t: jsonl_run(t, "objectives.objectives.itmm={weight: 1}"), "itmm"),
    "an unquoted ~ path": (lambda t: ["pretrain", "trainer.output_dir=~/runs/x"], "vlkit does not expand ~"),
    "compare= broken YAML": (lambda t: ["compare", f"compare={broken_yaml(t)}"], "bad.yaml"),
    "trainer.grad_clip=nan": (lambda t: jsonl_run(t, "trainer.grad_clip=nan"), "trainer.grad_clip=nan is not a finite"),
    "trainer.lr=inf": (lambda t: jsonl_run(t, "trainer.lr=inf"), "trainer.lr=inf is not a finite number"),
    "trainer.betas=[0.9,1.5]": (lambda t: jsonl_run(t, "trainer.betas=[0.9,1.5]"), "each must be in [0, 1)"),
    "a caption whose image is missing": (
        lambda t: ["pretrain", "model=uniter", *jsonl_data(captions(t / "c.jsonl", ["img0", "ghost_img"]),
                                                          raw_store(t / "s.h5", {"img0": regions(0)})),
                   *run_args(t / "out")], "ghost_img"),
    "a file where the run writes a folder": (lambda t: jsonl_run(t, f"trainer.output_dir={t / 'caps.jsonl'}"),
                                             "is a file, not a folder"),
    "make-shapes out= a file": (lambda t: ["make-shapes", f"out={broken_yaml(t)}"], "bad.yaml is a file, not a folder"),
    "merge-features of no shards": (lambda t: ["merge-features", f"src={t}"], "no shard files (*.h5)"),
}


@pytest.mark.parametrize("name", [*CASES, *EARLIER])
def test_each_refusal_is_a_clean_error_never_a_bug(name, tmp_path, vlkit_console, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make, expected = {**CASES, **EARLIER}[name]
    code, _, err = vlkit_console(*make(tmp_path))
    assert "looks like a bug" not in err and "Traceback" not in err, err
    assert code in (1, 2) and expected in err, err
    assert len(err.splitlines()) <= 8, err  # a few lines: the message and the VLKIT_DEBUG hint
