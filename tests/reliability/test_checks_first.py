"""Issue 44, class 3: no file before the checks pass. A typo in a comparison file, a missing extra
(``compare.executor=ray`` without ray, ``slurm`` without submitit) or an unknown ``compare.slurm`` key is refused
before the comparison writes anything: the folder is left as it was found (no plan.json, slurm/, sessions/), so
the fixed command runs without ``resume=true`` or deleting anything. A damaged plan.json or unit.json read on
resume is a clean error naming the file."""
import json
import sys

import pytest

from vlkit.locks import lock_path

FAST = ["threads=1", "workers=1", "progress=false"]


def _left(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else ["<absent>"]


def _comparison_file(tmp_path, run: str):
    path = tmp_path / "mine.yaml"
    path.write_text(f"defaults: [smoke, _self_]\nseeds: [0]\nruns:\n  - {run}\n")
    return path


@pytest.mark.parametrize("run, culprit", [
    ("{name: uniter, model: {name: uniter, preset: tiny, hiden_size: 8}, objectives: uniter}",
     "run uniter: uniter models have no field model.hiden_size (did you mean 'hidden_size'"),
    ("{name: uniter, model: {name: uniter, preset: tinyy}, objectives: uniter}",
     "run uniter: unknown uniter preset 'tinyy' (did you mean 'tiny'?)"),
    ("{name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter, mix: {masking: {prob: 0.1}}}",
     "run uniter: objective mix: sampling must be per_batch|sum and masking conditional|joint"),
])
@pytest.mark.parametrize("folder", ["absent", "empty"])
def test_a_typo_in_a_comparison_file_leaves_the_folder_as_it_was(tmp_path, vlkit_console, run, culprit, folder):
    out = tmp_path / "out"
    if folder == "empty":
        out.mkdir()
    code, _, err = vlkit_console("compare", f"compare={_comparison_file(tmp_path, run)}", f"output_dir={out}", *FAST,
                                 f"cache_dir={tmp_path / 'cache'}")
    assert code == 1 and culprit in err, err
    assert "looks like a bug" not in err
    assert _left(out) == (["<absent>"] if folder == "absent" else [])
    assert not lock_path(out).exists()


@pytest.mark.parametrize("executor, module, extra", [("ray", "ray", "ray"), ("slurm", "submitit", "slurm")])
def test_a_missing_extra_is_named_with_its_install_command_before_any_file(tmp_path, vlkit_console, monkeypatch,
                                                                         executor, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed: importing it fails
    out = tmp_path / "out"
    code, _, err = vlkit_console("compare", "compare=smoke", "compare.seeds=[0]", f"compare.executor={executor}",
                                 f"output_dir={out}", *FAST)
    assert code == 1, err
    assert f"compare.executor={executor} needs {module}" in err and f"pip install 'vlkit[{extra}]'" in err, err
    assert "looks like a bug" not in err and "ModuleNotFoundError" not in err.split(":")[1]
    assert _left(out) == ["<absent>"]


def test_an_unknown_slurm_key_is_refused_before_plan_json_or_slurm(tmp_path, vlkit_console):
    pytest.importorskip("submitit")
    out = tmp_path / "out"
    code, _, err = vlkit_console("compare", "compare=smoke", "compare.seeds=[0]", "compare.executor=slurm",
                                 "+compare.slurm.partitionn=gpu", "compare.slurm.cluster=local", f"output_dir={out}",
                                 *FAST)
    assert code == 1 and "compare.slurm: unknown key(s) partitionn; known: " in err, err
    assert _left(out) == ["<absent>"]


def _planned(tmp_path):
    """A comparison folder as `vlkit compare` plans it (smoke, one seed), without running it."""
    from vlkit.cli import compose
    from vlkit.compare.command import write_plan
    from vlkit.compare.config import resolve_config

    out = tmp_path / "out"
    cfg = resolve_config(compose("compare", ["compare=smoke", "compare.seeds=[0]", *FAST]))
    write_plan(cfg, out, ["compare=smoke", "compare.seeds=[0]", *FAST], resume=False)
    return out


def test_a_truncated_plan_json_is_named_on_resume_and_by_the_report(tmp_path, vlkit_console):
    out = _planned(tmp_path)
    plan = out / "plan.json"
    plan.write_text(plan.read_text()[:100])
    for args in (["compare", "compare=smoke", "compare.seeds=[0]", *FAST, f"output_dir={out}", "resume=true"],
                 ["compare-report", f"output_dir={out}"]):
        code, _, err = vlkit_console(*args)
        assert code == 1, err
        assert f"{plan}: not readable JSON, truncated or damaged" in err and "restore it" in err, err
        assert "JSONDecodeError" not in err and "looks like a bug" not in err
    assert _left(out) == ["plan.json"]  # nothing else written


def test_a_truncated_unit_json_is_named_not_taken_for_a_unit_that_never_ran(tmp_path, vlkit_console):
    out = _planned(tmp_path)
    unit = out / "runs" / "uniter" / "seed0" / "pretrain" / "unit.json"
    unit.parent.mkdir(parents=True)
    unit.write_text(json.dumps({"unit": "uniter/seed0/pretrain", "state": "finished"})[:30])
    code, _, err = vlkit_console("compare-report", f"output_dir={out}")
    assert code == 1, err
    assert f"{unit}: not readable JSON, truncated or damaged" in err and "the record of unit uniter/seed0/pretrain" in err
    assert "looks like a bug" not in err
