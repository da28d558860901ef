"""A run's own fine-tuning trainer (``finetune_trainer``, e.g. METER's official learning-rate multipliers): it
applies after the comparison's, per task where it says so, and a bad key is refused before any work."""
import pytest

from vlkit.cli import compose, main
from vlkit.compare.config import resolve_config
from vlkit.compare.comparison import Comparison
from vlkit.compare.units import Unit

RUNS = ("- {name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter}\n"
        "- {name: meter, model: {name: meter, preset: tiny}, objectives: meter,\n"
        "   finetune_trainer: {lr_mult: 5, tasks: {vqa: {lr_mult_head: 50}}}}\n")


def comparison(tmp_path, runs: str) -> Comparison:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "runs.yaml"
    path.write_text(runs)
    return Comparison(resolve_config(compose("compare", [f"compare={path}"])), tmp_path, progress=False)


def test_a_runs_finetune_trainer_applies_after_the_comparisons_per_task(tmp_path):
    comp = comparison(tmp_path, RUNS)
    shared = comp.compare["trainer"]
    uniter_vqa, meter_vqa = (comp.unit_trainer(Unit(run, 0, "scratch", "vqa")) for run in (0, 1))
    meter_retrieval = comp.unit_trainer(Unit(1, 0, "pretrained", "retrieval"))
    assert uniter_vqa["lr_mult_head"] == shared["finetune"]["lr_mult_head"] == 10 and "lr_mult" not in uniter_vqa
    assert (meter_vqa["lr_mult"], meter_vqa["lr_mult_head"]) == (5, 50)
    assert (meter_retrieval["lr_mult"], meter_retrieval["lr_mult_head"]) == (5, 10)
    assert meter_retrieval["group_by_length"] == 0  # compare.trainer.tasks.retrieval still applies
    assert (uniter_vqa["batch_size"], meter_vqa["batch_size"], meter_retrieval["batch_size"]) == (16, 16, 32)
    assert comp.unit_trainer(Unit(1, 0)) == comp.unit_trainer(Unit(0, 0))  # pre-training: the run's `trainer`
    assert meter_vqa["max_steps"] == comp.compare["budget"]["finetune_steps"]["vqa"]
    assert comp.unit_hash(Unit(1, 0, "scratch", "vqa")) != comparison(tmp_path / "b", RUNS.replace("50", "10")).unit_hash(
        Unit(1, 0, "scratch", "vqa"))
    comp.check_trainers()


@pytest.mark.parametrize("override, error, message", [
    ("{lr_multt: 5}", ValueError,
         r"run meter, vqa fine-tuning trainer: trainer.lr_multt is not a trainer setting \(did you mean trainer.lr_mult\?\)"),
    ("{tasks: {retrieval: {lr_mult_head: -1}}}", ValueError,
     "run meter, retrieval fine-tuning trainer: trainer.lr_mult_head must be >= 0"),
    ("{tasks: {vqaa: {lr_mult_head: 50}}}", KeyError, r"runs\[meter\].finetune_trainer.tasks: unknown task\(s\) \['vqaa'\]"),
])
def test_a_bad_finetune_trainer_is_refused_before_any_work_naming_the_run(tmp_path, override, error, message):
    path = tmp_path / "runs.yaml"
    path.write_text(RUNS.replace("{lr_mult: 5, tasks: {vqa: {lr_mult_head: 50}}}", override))
    with pytest.raises(error, match=message):
        main(["compare", f"compare={path}", f"output_dir={tmp_path / 'out'}"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override, where", [
    ("+compare.trainer.tasks.vqaa={lr: 1.0e-4}", "compare.trainer.tasks"),
    ("+compare.task_overrides.retreival={options: {rerank_k: 4}}", "compare.task_overrides"),
    ("+compare.budget.finetune_steps.nlvr=10", "compare.budget.finetune_steps"),
    ("compare.runs=[{name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter, "
     "task_overrides: {refexpp: {options: {}}}}]", r"compare.runs\[uniter\].task_overrides"),
])
def test_a_misspelt_task_anywhere_in_the_comparison_is_refused(tmp_path, override, where):
    """Every key that names a task is checked against the registered tasks: a typo would be ignored."""
    with pytest.raises(KeyError, match=rf"{where}: unknown task\(s\)"):
        main(["compare", override, f"output_dir={tmp_path / 'out'}"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("runs, where", [
    ("task_overrides: {vqa: {max_lenn: 20}}\nruns:\n  - {name: uniter, model: {name: uniter, preset: tiny}, "
     "objectives: uniter}\n", r"compare.task_overrides.vqa: unknown key 'max_lenn' \(did you mean 'max_len'\?\)"),
    ("- {name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter,\n"
     "   task_overrides: {retrieval: {options: {rerank_kk: 4}}}}\n",
     r"compare.runs\[uniter\].task_overrides.retrieval.options: unknown key 'rerank_kk' \(did you mean 'rerank_k'"),
])
def test_a_misspelt_task_key_in_a_comparison_file_is_refused(tmp_path, runs, where):
    """A task override's keys are checked against the task's config, as ``task.<key>=`` is on the command line:
    a typo in a comparison file would otherwise be ignored."""
    path = tmp_path / "runs.yaml"
    path.write_text(runs)
    with pytest.raises(KeyError, match=where):
        main(["compare", f"compare={path}", f"output_dir={tmp_path / 'out'}"])
    assert not (tmp_path / "out").exists()
