"""Issue 44, class 6: no option ignored without a word. ``manifest=`` beside keys that change the comparison it
records is refused naming each key with both values (the keys of how it runs apply); ``init=`` with
``resume=true`` over a run that did not start from it gets a message about init= and resume=."""
import json

import pytest

from vlkit.cli import compose
from vlkit.compare.config import resolve_config
from vlkit.locks import lock_path


@pytest.fixture
def manifest(tmp_path):
    cfg = resolve_config(compose("compare", ["compare=smoke", "threads=1"]))
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"config": cfg, "data": {"hash": "abc"}}))
    return path


def test_manifest_with_keys_that_change_its_comparison_is_refused_naming_them(manifest, tmp_path, vlkit_console):
    out = tmp_path / "out"
    code, _, err = vlkit_console("compare", f"manifest={manifest}", "compare.seeds=[5]",
                                 "compare.budget.pretrain_steps=7", f"output_dir={out}", "progress=false")
    assert code == 1, err
    assert f"manifest={manifest} reruns the comparison it records" in err
    assert "compare.budget.pretrain_steps=7 (the manifest has 4); compare.seeds=[5] (the manifest has [0, 1])" in err
    assert "looks like a bug" not in err and not out.exists() and not lock_path(out).exists()


def test_manifest_takes_how_to_run_from_the_command_line_and_equal_values_pass(manifest, tmp_path):
    overrides = [f"manifest={manifest}", "compare.seeds=[0,1]", "threads=1", "compare.executor=slurm",
                 "compare.retries=2", f"cache_dir={tmp_path}", "workers=3"]
    cfg = resolve_config(compose("compare", overrides), {o.split("=")[0] for o in overrides})
    assert cfg["compare"]["seeds"] == [0, 1] and cfg["compare"]["budget"]["pretrain_steps"] == 4
    assert cfg["compare"]["executor"] == "slurm" and cfg["compare"]["retries"] == 2  # applied, not ignored
    assert cfg["cache_dir"] == str(tmp_path) and cfg["workers"] == 3 and cfg["expected_data_hash"] == "abc"


def test_init_with_resume_over_a_run_it_did_not_start_names_init_and_resume(tmp_path, vlkit_console):
    common = ["model=uniter", "model.preset=tiny", "data.num_images=40", "trainer.batch_size=4", "trainer.max_steps=2",
              "trainer.progress=false", "trainer.trackers=[]", "threads=1", "trainer.save_every=1"]
    first, second = tmp_path / "first", tmp_path / "second"
    assert vlkit_console("pretrain", *common, f"trainer.output_dir={first}")[0] == 0
    assert vlkit_console("pretrain", *common, f"trainer.output_dir={second}")[0] == 0
    code, _, err = vlkit_console("pretrain", *common, f"trainer.output_dir={second}", f"init={first}", "resume=true",
                                 "trainer.max_steps=3")
    assert code == 1, err
    assert f"init={first} with resume=true: trainer.output_dir={second} holds a run" in err
    assert "drop init= to resume it" in err and "data.tokenizer" not in err
    # a run started from init= resumes with the same command
    third = tmp_path / "third"
    assert vlkit_console("pretrain", *common, f"trainer.output_dir={third}", f"init={first}")[0] == 0
    code, _, err = vlkit_console("pretrain", *common, f"trainer.output_dir={third}", f"init={first}", "resume=true",
                                 "trainer.max_steps=3")
    assert code == 0, err
