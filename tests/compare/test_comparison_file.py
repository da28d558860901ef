"""Issue 21: a comparison file written from scratch (``compare=<path.yaml>``): a bare list of runs or a
partial ``compare:`` node merges over the default comparison; anything else is refused naming the file."""
import json

import pytest

import vlkit.workflows as workflows
from vlkit.cli import compose
from vlkit.compare.config import objective_mix, run_specs
from vlkit.config import plain
from vlkit.objectives import load_mix

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
    ("runz: []\n", "unknown key(s) runz; a comparison sets add_objectives, alpha, baseline, budget"),
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



class _Planned(Exception):
    """Raised in place of running a comparison: the spec it would run."""


@pytest.mark.parametrize("extra, planned", [({}, set()), ({"mim": {"weight": 0.5}}, {"mim"})])
def test_add_objectives_replaces_the_inherited_ones(tmp_path, monkeypatch, extra, planned):
    """Issue 53: a file (or an argument) that inherits the default comparison and sets ``add_objectives`` plans
    exactly those (``{}``: none), not the default's ``itc`` merged in; without it the default's stay."""
    own = set(load_mix("uniter")["objectives"])

    def added(compare):
        return set(objective_mix(run_specs(plain(compare))[0])["objectives"]) - own

    path = tmp_path / "paper.yaml"
    path.write_text(f"add_objectives: {json.dumps(extra)}\nruns:\n"
                    "  - {name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter}\n")
    (tmp_path / "inherits.yaml").write_text(RUNS)
    assert added(compose("compare", [f"compare={path}"]).compare) == planned
    assert added(compose("compare", [f"compare={tmp_path / 'inherits.yaml'}"]).compare) == {"itc"}

    def planned_spec(spec):
        raise _Planned(spec)

    monkeypatch.setattr(workflows, "compare_command", planned_spec)  # the Python face: the file, and the argument
    for kwargs in ({"preset": str(path)}, {"runs": ["uniter/tiny"], "add_objectives": extra}):
        with pytest.raises(_Planned) as err:
            workflows.compare(output_dir=tmp_path / "out", quiet=True, **kwargs)
        assert added(err.value.args[0].config["compare"]) == planned, kwargs
