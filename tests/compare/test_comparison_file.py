"""Issue 21: a comparison file written from scratch (``compare=<path.yaml>``): a bare list of runs or a
partial ``compare:`` node merges over the default comparison; anything else is refused naming the file."""
import pytest

from vlkit.cli import compose
from vlkit.compare.config import run_specs

RUNS = "- {name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter}\n" \
       "- {name: meter, model: meter, objectives: null}\n"


def test_a_bare_list_of_runs_merges_over_the_default_comparison(tmp_path):
    path = tmp_path / "my_runs.yaml"
    path.write_text(RUNS)
    cfg = compose("compare", [f"compare={path}"])
    default = compose("compare", [])
    assert [r.name for r in run_specs(cfg.compare)] == ["uniter", "meter"]
    assert run_specs(cfg.compare)[1].objectives is None and run_specs(cfg.compare)[1].model == {"name": "meter"}
    assert cfg.compare.trainer == default.compare.trainer and cfg.compare.seeds == default.compare.seeds
    assert cfg.data.num_images == default.data.num_images == 600


def test_a_partial_comparison_overrides_only_what_it_sets(tmp_path):
    path = tmp_path / "partial.yaml"
    path.write_text("seeds: [0]\nbudget: {pretrain_steps: 3}\nruns:\n"
                    "  - {name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter}\n")
    cfg = compose("compare", [f"compare={path}", "compare.tasks=[vqa]"])
    default = compose("compare", [])
    assert list(cfg.compare.seeds) == [0] and cfg.compare.budget.pretrain_steps == 3 and list(cfg.compare.tasks) == ["vqa"]
    assert cfg.compare.budget.finetune_steps == default.compare.budget.finetune_steps
    assert cfg.compare.trainer == default.compare.trainer and [s.name for s in run_specs(cfg.compare)] == ["uniter"]


def test_a_shipped_presets_layout_keeps_its_own_defaults(tmp_path):
    path = tmp_path / "global.yaml"  # no "# @package _global_" header: read the same way
    path.write_text("defaults: [smoke]\ncompare:\n  title: mine\ndata: {num_images: 20}\n")
    cfg = compose("compare", [f"compare={path}"])
    assert cfg.compare.title == "mine" and cfg.data.num_images == 20
    assert cfg.compare.budget.pretrain_steps == compose("compare", ["compare=smoke"]).compare.budget.pretrain_steps


@pytest.mark.parametrize("text,message", [
    ("42\n", "expected a list of runs or a mapping"),
    ("runz: []\n", "unknown key(s) runz; a comparison sets add_objectives, baseline, budget"),
    ("runs: {uniter: 1}\n", "runs must be a list of runs, found dict"),
    ("- {name: uniter}\n", "runs[0] = {'name': 'uniter'} needs at least 'name' and 'model'"),
    ("runs: [\n", "not valid YAML"),
])
def test_anything_else_is_refused_naming_the_file(tmp_path, text, message):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="comparison file .*mine.yaml") as err:
        compose("compare", [f"compare={path}"])
    assert message in str(err.value)
