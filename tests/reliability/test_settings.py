"""Catalogue, issue 44 class 5: every key's type and range is checked before any data work (each command's typed
spec, by the key's owner), and named as the user wrote it."""
from __future__ import annotations

import time

import pytest
from refusal_cases import CASES


def test_max_steps_abc_is_refused_before_feature_extraction(tmp_path, vlkit_console):
    started = time.monotonic()
    code, _, err = vlkit_console(*CASES["trainer.max_steps=abc"][0](tmp_path))
    assert code == 1 and "trainer.max_steps='abc': give a whole number" in err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()  # no region feature extracted
    assert time.monotonic() - started < 60  # was 189 s of extraction first


@pytest.mark.parametrize("setting, named", [
    ("compare.checkpoint_every=-1", "compare.checkpoint_every must be >= 0, got -1"),
    ("compare.itm_pairs=-5", "compare.itm_pairs must be >= 0, got -5"),  # recorded itm_acc -0.0
    ("workers=0", "workers must be >= 1, got 0"),  # was taken as unset
    ("threads=0", "threads must be >= 1, got 0"),  # ... while threads=0 was refused: one rule for both now
    ("compare.heartbeat_s=0", "compare.heartbeat_s=0: a positive number of seconds"),  # its owner's rule (account)
    ("workers=two", "workers='two': give a whole number"),
])
def test_comparison_settings_are_named_as_written_before_any_file(setting, named, tmp_path, vlkit_console):
    code, _, err = vlkit_console("compare", "compare=smoke", setting, f"output_dir={tmp_path / 'cmp'}")
    assert code == 1 and named in err and "save_every" not in err
    assert not (tmp_path / "cmp").exists()


def test_every_problem_is_listed_at_once(tmp_path, vlkit_console):
    code, _, err = vlkit_console("pretrain", "threads=0", "data.max_len=x", "trainer.max_steps=abc", "trainer.lr=-1",
                                 "model.hidden_size=abc", "resume=maybe", f"trainer.output_dir={tmp_path / 'out'}")
    assert code == 1
    for named in ("threads must be >= 1, got 0", "data.max_len='x'", "trainer.max_steps='abc'",
                  "model.hidden_size='abc'", "resume='maybe': give true or false"):
        assert named in err


def test_a_dataset_without_its_paths_names_the_missing_keys(tmp_path, vlkit_console):
    code, _, err = vlkit_console(*CASES["data=coco without its paths"][0](tmp_path))
    assert code == 2 and "???" not in err
    assert "vlkit pretrain data=coco needs data.path (captions_train2014.json" in err and "data.image.path (" in err


def test_the_python_api_checks_the_same_keys(tmp_path):
    import vlkit

    with pytest.raises(vlkit.SpecError, match=r"pretrain\(trainer=\{\"max_steps\": ...\}\)='abc': give a whole number"):
        vlkit.pretrain("uniter", trainer={"max_steps": "abc"}, output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
