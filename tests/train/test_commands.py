"""Issue 5: `vlkit pretrain -> finetune -> evaluate` end to end on the shapes world for each family."""
import json

import pytest

from vlkit.cli import main
from vlkit.train import read_metrics


@pytest.mark.parametrize("family", ["vilbert", "uniter", "meter"])
def test_pretrain_finetune_evaluate(command_args, family, cache, tmp_path):
    pre, ft = tmp_path / "pre", tmp_path / "ft"
    assert main(["pretrain", f"model={family}", *command_args(cache, pre)]) == 0
    records = read_metrics(pre)
    assert [r["step"] for r in records] == [1, 2, 3] and all("loss" in r for r in records)
    assert (pre / "model" / "model.safetensors").exists() and list((pre / "checkpoints").iterdir())
    task = "refexp" if family != "meter" else "vqa"
    assert main(["finetune", f"task={task}", f"model={family}", f"init={pre}", *command_args(cache, ft)]) == 0
    run = json.loads((ft / "run.json").read_text())
    assert run["task"] == task and any(k.startswith("val/") for k in run["metrics"])
    assert main(["evaluate", f"checkpoint={ft}", f"cache_dir={cache}"]) == 0
    evaluated = json.loads((ft / "eval.json").read_text())
    assert evaluated == run["metrics"]  # the saved task reproduces its own evaluation
    assert main(["evaluate", f"checkpoint={pre}", "task=retrieval", f"cache_dir={cache}", f"output={tmp_path / 'zs.json'}"]) == 0
    assert "val/ir_r1" in json.loads((tmp_path / "zs.json").read_text())


def test_resume_continues_a_pretraining_run(command_args, cache, tmp_path):
    """A run interrupted after its step-2 checkpoint and resumed logs the losses of the uninterrupted run."""
    import shutil

    out = tmp_path / "run"
    args = ["pretrain", "model=uniter", *command_args(cache, out, steps=4), "trainer.save_every=2",
            "trainer.keep_checkpoints=0"]
    assert main(args) == 0
    straight = [r["loss"] for r in read_metrics(out)]
    shutil.rmtree(out / "checkpoints" / "step_4")  # as if killed before the last save
    assert main([*args, "resume=true"]) == 0
    assert [r["loss"] for r in read_metrics(out)] == straight and len(straight) == 4


def test_unknown_task_and_family_mismatch_errors(command_args, cache, tmp_path):
    from vlkit.cli import UsageError

    with pytest.raises(UsageError, match="unknown task 'captioning'"):
        main(["finetune", "task=captioning"])
    with pytest.raises(ValueError, match="takes pixels"):
        main(["pretrain", "model=meter", *command_args(cache, tmp_path / "x"), "data.image.source=features",
              "data.image.path=nowhere.h5"])
