"""Catalogue: the console script speaks to people (help, suggestions, one-paragraph errors)."""
from __future__ import annotations

import pytest

from vlkit.cli import COMMANDS


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_of_every_command(command, vlkit_console):
    code, out, err = vlkit_console(command, "--help")
    assert code == 0 and err == "" and out.startswith(f"usage: vlkit {command} [key=value ...]")
    assert "keys (default; set any with key=value):" in out
    if command in ("pretrain", "finetune", "evaluate"):
        assert "model=       meter, meter_base" in out and "uniter_tiny" in out  # families and presets
        assert "objectives=  meter, " in out and "uniter_mlm_itm_mrc" in out  # mixes
        assert "task=        nlvr2, none, refexp, retrieval, snli_ve, vqa" in out
        assert "trainer.max_steps=1000" in out and "data.on_error=raise" in out
    if command == "compare":
        assert ("compare=     base, claims, default, fusion, masking, mim, objectives, paper_meter, paper_uniter, "
                "paper_uniter_alldata, paper_vilbert, smoke") in out
    if command == "extract-features":
        assert "on_error=raise" in out and "images=???" in out


@pytest.mark.parametrize("args,expected", [
    (["pretrain", "model=unitr"], "unknown model 'unitr'; did you mean model=uniter?"),
    (["pretrain", "trainer.max_step=10"], "unknown key 'trainer.max_step'; did you mean trainer.max_steps?"),
    (["finetune", "task=captioning"], "unknown task 'captioning'. Choose task= from: nlvr2, none, refexp, retrieval"),
    (["pretrain", "objectives=unitr"], "unknown objectives 'unitr'; did you mean objectives=uniter?"),
    (["compare", "compare=smok"], "unknown compare 'smok'; did you mean compare=smoke?"),
    (["pretrian"], "unknown command 'pretrian'; did you mean vlkit pretrain?"),
    (["pretrain", "steps"], "cannot read 'steps'; settings are key=value"),
])
def test_command_line_mistakes_get_suggestions_that_fit_vlkit(args, expected, vlkit_console):
    code, out, err = vlkit_console(*args)
    assert code == 2 and expected in err and "Traceback" not in err and "+" not in err.split("\n")[0]


def test_unknown_preset_names_the_closest(tmp_path, vlkit_console):
    code, _, err = vlkit_console("pretrain", "model.preset=bse", f"cache_dir={tmp_path}", "data.num_images=20")
    assert code == 1 and "unknown uniter preset 'bse' (did you mean 'base'?); presets: tiny, base, large" in err
    assert "Traceback" not in err


def test_one_paragraph_error_and_the_traceback_with_vlkit_debug(tmp_path, data, vlkit_console):
    _, caps, _ = data()
    missing = tmp_path / "nowhere.h5"
    args = ["pretrain", "data=jsonl", f"data.path={caps}", "data.tokenizer=shapes", f"data.image.path={missing}",
            f"trainer.output_dir={tmp_path / 'run'}"]
    code, _, err = vlkit_console(*args)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 2 and "Traceback" not in err
    assert lines[0].startswith("vlkit pretrain: error (FileNotFoundError): ") and str(missing) in lines[0]
    code, _, err = vlkit_console(*args, debug=True)
    assert code == 1 and "Traceback (most recent call last)" in err and str(missing) in err


def test_a_bug_keeps_its_traceback(monkeypatch, vlkit_console):
    import vlkit.cli

    def broken(*_):
        raise AttributeError("'NoneType' object has no attribute 'shape'")

    monkeypatch.setattr(vlkit.cli, "compose", broken)
    code, _, err = vlkit_console("make-shapes", "out=x")
    assert code == 1 and "Traceback" in err and "this looks like a bug in vlkit (AttributeError)" in err


def test_version(vlkit_console):
    from importlib.metadata import version

    import vlkit

    code, out, err = vlkit_console("--version")
    assert (code, out, err) == (0, f"vlkit {vlkit.__version__}\n", "") and vlkit.__version__ == version("vlkit")
