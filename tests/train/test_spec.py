"""Issue 52: one typed run spec under both faces. The command line (compose -> spec -> command) and Python (keyword
arguments -> spec -> command) build equal specs for the same settings, and the comparison's metrics agree bit for bit;
every key is validated at exactly one site (its owner: `vlkit.settings` is gone); no module below the CLI composes;
the Python face's stumbles (overrides=, partial dicts, argument types, the one-writer lock, quiet mode) are fixed."""
from __future__ import annotations

import ast
import dataclasses
import importlib
import sys
import json
from pathlib import Path

import pytest

import vlkit
import vlkit.workflows as workflows
from vlkit.cli import build_spec, compose, main
from vlkit.runs import write_record

VLKIT = Path(vlkit.__file__).resolve().parent
TRAINER = {"max_steps": 3, "batch_size": 4, "warmup": 1, "progress": False, "trackers": [], "lr": 1e-3}
TRAINER_FLAGS = ["trainer.max_steps=3", "trainer.batch_size=4", "trainer.warmup=1", "trainer.progress=false",
                 "trainer.trackers=[]", "trainer.lr=1e-3"]


@pytest.fixture
def captured(monkeypatch):
    """The spec each Python function builds, instead of running its command."""
    from vlkit.compare.command import ComparisonResult
    from vlkit.train.spec import RunResult

    specs = {}

    def capture(name, result):
        return lambda spec: specs.setdefault(name, spec) and result

    for name in ("pretrain", "finetune", "evaluate"):
        monkeypatch.setattr(workflows.commands, name, capture(name, RunResult(name, Path("."), {})))
    monkeypatch.setattr(workflows, "compare_command", capture("compare", ComparisonResult(Path("."), "", [], {})))
    return specs


def cli_spec(command, *overrides):
    return build_spec(command, compose(command, list(overrides)), list(overrides))


def _fields(spec):
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.compare}


# -- the same settings, the same spec ------------------------------------------------------------------------------
def test_each_commands_spec_from_python_equals_the_command_lines(captured, tmp_path):
    (tmp_path / "mix.yaml").write_text("mlm: 2\nitm: 1\n")
    vlkit.pretrain("uniter/tiny", {"name": "shapes", "num_images": 30}, mix={"mlm": 2, "itm": 1}, trainer=TRAINER,
                   output_dir=tmp_path / "pre", cache_dir=tmp_path / "cache", threads=1)
    cli = cli_spec("pretrain", "model=uniter/tiny", f"objectives={tmp_path / 'mix.yaml'}", "data=shapes",
                   "data.num_images=30", *TRAINER_FLAGS, f"trainer.output_dir={tmp_path / 'pre'}",
                   f"cache_dir={tmp_path / 'cache'}", "threads=1")
    assert isinstance(cli, vlkit.PretrainSpec) and _fields(captured["pretrain"]) == _fields(cli)
    assert cli.trainer.max_steps == 3 and cli.objectives == {"mlm": 2, "itm": 1}

    vlkit.finetune("meter/tiny", {"name": "shapes", "num_images": 30}, task={"name": "vqa", "max_len": 20},
                   trainer={**TRAINER, "seed": 7}, eval_splits=["val", "test"], output_dir=tmp_path / "ft",
                   resume=True, seed=3)
    cli = cli_spec("finetune", "model=meter/tiny", "data=shapes", "data.num_images=30", "task=vqa", "task.max_len=20",
                   *TRAINER_FLAGS, "trainer.seed=3", "eval_splits=[val,test]",
                   f"trainer.output_dir={tmp_path / 'ft'}", "resume=true")
    assert captured["finetune"] == cli and cli.trainer.seed == 3 and cli.trainer.resume is True
    assert cli.task["max_len"] == 20 and cli.eval_splits == ("val", "test")

    vlkit.evaluate(tmp_path / "ft", split="test", task="retrieval", eval_options={"ties": "worst"},
                   output=tmp_path / "scores.json", predictions=tmp_path / "p.json")
    cli = cli_spec("evaluate", f"checkpoint={tmp_path / 'ft'}", "split=test", "task=retrieval",
                   "eval_options.ties=worst", f"output={tmp_path / 'scores.json'}", f"predictions={tmp_path / 'p.json'}")
    assert captured["evaluate"] == cli and cli.eval_options == {"ties": "worst"}

    vlkit.compare(["uniter/tiny", "meter/tiny"], preset="smoke", tasks=["vqa"], seeds=[0], baseline=False,
                  zero_shot=False, itm_pairs=8, budget={"pretrain_steps": 2}, data={"num_images": 24},
                  output_dir=tmp_path / "cmp", workers=1, plan={"mfu": 0.5})
    runs = ("[{name:uniter_tiny,model:{name:uniter,preset:tiny},objectives:uniter},"
            "{name:meter_tiny,model:{name:meter,preset:tiny},objectives:meter}]")
    cli = cli_spec("compare", "compare=smoke", f"compare.runs={runs}", "compare.tasks=[vqa]", "compare.seeds=[0]",
                   "compare.baseline=false", "compare.zero_shot=false", "compare.itm_pairs=8",
                   "compare.budget.pretrain_steps=2", "data.num_images=24", f"output_dir={tmp_path / 'cmp'}",
                   "workers=1", "compare.plan.mfu=0.5")
    assert isinstance(cli, vlkit.CompareSpec) and captured["compare"] == cli
    assert cli.plan["mfu"] == 0.5 and cli.compare["title"] is None  # the preset's title named its own runs


def test_a_two_run_comparison_gives_the_command_lines_numbers_bit_for_bit(tmp_path):
    settings = dict(tasks=["vqa"], seeds=[0], baseline=False, zero_shot=False, itm_pairs=8)
    py = vlkit.compare(["uniter/tiny", "meter/tiny"], preset="smoke", data={"num_images": 24, "val_images": 8},
                       output_dir=tmp_path / "py", workers=1, cache_dir=tmp_path / "cache", quiet=True, **settings)
    runs = ("[{name:uniter_tiny,model:{name:uniter,preset:tiny},objectives:uniter},"
            "{name:meter_tiny,model:{name:meter,preset:tiny},objectives:meter}]")
    assert main(["compare", "compare=smoke", f"compare.runs={runs}", "compare.tasks=[vqa]", "compare.seeds=[0]",
                 "compare.baseline=false", "compare.zero_shot=false", "compare.itm_pairs=8", "data.num_images=24",
                 "data.val_images=8", f"output_dir={tmp_path / 'cli'}", "workers=1",
                 f"cache_dir={tmp_path / 'cache'}", "progress=false"]) == 0
    cli = json.loads((tmp_path / "cli" / "results.json").read_text())["records"]
    timing = ("wall_s", "samples_per_s", "latency_ms", "train_samples_per_s", "latency_ms_per_ex")
    untimed = [[{k: v for k, v in r.items() if k not in timing and "time" not in k and "per_s" not in k
                 and "latency" not in k and "wall" not in k} for r in rs] for rs in (py.records, cli)]
    assert untimed[0] == untimed[1] and len(untimed[0]) == 2 and all("vqa" in r for r in untimed[0])


# -- one site per key ----------------------------------------------------------------------------------------------
def test_every_key_is_validated_at_exactly_one_site():
    from vlkit.cli import COMMANDS, SPEC_COMMANDS
    from vlkit.compare.costs import cost_settings
    from vlkit.compare.spec import COMPARE_RULES
    from vlkit.config import to_container
    from vlkit.data.spec import RULES as DATA_RULES
    from vlkit.train import TrainerConfig
    from vlkit.train.spec import COMMAND_RULES

    assert not (VLKIT / "settings.py").exists()  # the central table is gone
    assert not any("RULES" in line and "settings" in line for line in (VLKIT / "cli.py").read_text().splitlines())
    owners = {  # command -> site -> the dotted keys it validates
        "pretrain": {"TrainerConfig": [f"trainer.{f.name}" for f in dataclasses.fields(TrainerConfig)],
                     "vlkit.data.spec": [f"data.{k}" for k in DATA_RULES], "vlkit.train.spec": list(COMMAND_RULES)},
        "compare": {"vlkit.compare.spec": list(COMPARE_RULES), "vlkit.data.spec": [f"data.{k}" for k in DATA_RULES],
                    "plan_settings": [f"compare.plan.{k}" for k in cost_settings({})],
                    "heartbeat_s": ["compare.heartbeat_s"], "look_sizes_of": ["compare.until", "compare.max_seeds",
                                                                                "compare.round_seeds"],
                    "seeds_problems": ["compare.seeds"]},
    }
    owners["finetune"] = owners["evaluate"] = owners["pretrain"]
    for command, sites in owners.items():
        seen: dict[str, str] = {}
        for site, keys in sites.items():
            for key in keys:
                assert key not in seen, f"vlkit {command}: {key} is validated by {seen[key]} and {site}"
                seen[key] = site
        composed = to_container(compose(command, ["checkpoint=x"] if command == "evaluate" else []))
        for site, keys in sites.items():  # each rule is of a key the command has (no dead rule)
            if site in ("vlkit.train.spec", "vlkit.compare.spec"):
                for key in keys:
                    node = composed
                    for part in key.split("."):
                        assert part in node, f"{site} holds a rule of {key}, which vlkit {command} lacks"
                        node = node[part]
    for command, (target, _) in COMMANDS.items():  # the commands without a spec: their module holds their rules
        if command in SPEC_COMMANDS:
            continue
        module = importlib.import_module(target.split(":")[0])
        function = getattr(module, target.split(":")[1])
        rules = getattr(sys.modules[function.__module__], "KEY_RULES", {}).get(command, {})
        composed = to_container(compose(command, []))
        assert set(rules) <= set(composed), (command, set(rules) - set(composed))
    assert not hasattr(__import__("vlkit.cli").cli, "KEY_RULES")  # no rule table of the console's own


def test_problems_are_named_in_each_callers_spelling(tmp_path):
    with pytest.raises(vlkit.SpecError) as err:  # every problem at once, each as the caller wrote it
        vlkit.finetune("uniter/tiny", data={"max_len": 1, "image": {"num_bb": 0}}, trainer={"lr": -1},
                       threads=0, output_dir=tmp_path / "out")
    for named in ('finetune(data={"max_len": ...}) must be >= 3', 'finetune(data={"image": {"num_bb": ...}}) must be',
                  'finetune(trainer={"lr": ...}) must be >= 0', "finetune(threads=...) must be >= 1"):
        assert named in str(err.value)
    with pytest.raises(vlkit.SpecError, match=r"pretrain\(seed=\.\.\.\)='x'|pretrain\(output_dir=\.\.\.\) is empty"):
        vlkit.pretrain("uniter/tiny", output_dir="")
    with pytest.raises(vlkit.SpecError, match=r'compare\(plan=\{"mfu": \.\.\.\}\)=2'):
        vlkit.compare(["uniter/tiny"], preset="smoke", plan={"mfu": 2}, output_dir=tmp_path / "cmp")
    with pytest.raises(vlkit.SpecError, match=r"(?=.*data\.max_len must be >= 3)(?=.*trainer\.lr must be >= 0)"):
        main(["finetune", "data.max_len=1", "trainer.lr=-1", f"trainer.output_dir={tmp_path / 'out'}"])
    assert not (tmp_path / "out").exists() and not (tmp_path / "cmp").exists()


# -- the doors -----------------------------------------------------------------------------------------------------
def test_the_keys_the_preflight_and_recorded_paths_name_have_a_python_spelling():
    """The keys vlkit.runs' and the missing-split messages name, written as docs/python.md's table says."""
    from vlkit.config import python_spelling

    spell = {f: python_spelling(f, workflows.ARGUMENTS[f]) for f in ("finetune", "evaluate")}
    assert spell["evaluate"]("eval_splits") == "evaluate(eval_splits=...)"
    assert spell["evaluate"]("split") == "evaluate(split=...)"
    assert spell["evaluate"]("task.files.test") == 'evaluate(task={"files": {"test": ...}})'
    assert spell["finetune"]("data.image.path") == 'finetune(data={"image": {"path": ...}})'
    assert spell["evaluate"]("checkpoint") == "evaluate(run=...)"
    table = (Path(__file__).parents[2] / "docs" / "python.md").read_text()
    for cell in ("`eval_splits=[val,test]`", "`split=test`", "`task.files.<split>=...`", "`data.image.path=...`",
                 '`data={"image": {"source": "features", "path": ...}}`', '`task={"files": {"<split>": ...}}`'):
        assert cell in table, cell
    assert "`vlkit.load_model_and_processor(folder, images=..., cache_dir=...)`" in table
    blocks = [b.split("```", 1)[0] for b in table.split("```python\n")[1:]]
    compare_block = next(b for b in blocks if "vlkit.compare(" in b)
    guard = next(node for node in ast.parse(compare_block).body if isinstance(node, ast.If))
    assert ast.unparse(guard.test) == "__name__ == '__main__'" and "vlkit.compare(" in ast.unparse(guard.body)


def test_no_module_below_the_cli_composes_and_the_python_door_writes_no_override_strings():
    for path in VLKIT.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        name = path.relative_to(VLKIT.parent).with_suffix("").as_posix().replace("/", ".")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "vlkit.cli" and name not in ("vlkit.cli",):
                raise AssertionError(f"{name} imports vlkit.cli ({[a.name for a in node.names]})")
            if isinstance(node, ast.Name) and node.id == "compose_file" or \
                    isinstance(node, ast.alias) and node.name == "compose_file":
                assert name in ("vlkit.cli", "vlkit.config"), f"{name} composes ({path})"
    tree = ast.parse((VLKIT / "workflows.py").read_text(encoding="utf-8"))
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    formatted = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)]
    imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert "tempfile" not in imported and not any("TemporaryDirectory" in s or "mkdtemp" in s for s in strings)
    import re

    override = re.compile(r"^\+?[a-z_]+(\.[a-z_]+)*=\S")  # ``trainer.max_steps=3``, ``data=jsonl``
    assert not [s for s in strings if override.match(s)]
    assert not [f for f in formatted if re.match(r"f['\"]\{?[a-z_.]*\}?=", f) and "=" in f.split("{")[0][2:]]


# -- the Python face's stumbles ------------------------------------------------------------------------------------
def test_overrides_are_refused_with_the_keyword_spelling(tmp_path):
    with pytest.raises(TypeError, match=r"overrides=.*'trainer.max_steps=3' -> finetune\(trainer=\{\"max_steps\": "
                                        r"\.\.\.\}\) = 3"):
        vlkit.finetune("uniter/tiny", trainer={"max_steps": 2}, overrides=["trainer.max_steps=3"])
    with pytest.raises(TypeError, match=r"'data.on_error=skip' -> pretrain\(data=\{\"on_error\": \.\.\.\}\) = skip"):
        vlkit.pretrain("uniter/tiny", overrides=["data.on_error=skip"], output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_partial_data_dict_merges_into_the_runs_data_and_keeps_its_images(captured, tmp_path, monkeypatch):
    monkeypatch.setenv("VLKIT_CACHE", str(tmp_path / "user-cache"))
    run = tmp_path / "pre"
    (run / "model").mkdir(parents=True)
    (tmp_path / "photos").mkdir()
    (tmp_path / "captions.jsonl").write_text("")
    recorded = {"name": "jsonl", "path": str(tmp_path / "captions.jsonl"), "tokenizer": "bert-base-uncased",
                "max_len": 62, "filter_long": False, "max_unk_rate": 0.05, "on_error": "raise",
                "image": {"source": "folder", "path": str(tmp_path / "photos"), "size": 32}}
    write_record(run / "run.json", {"kind": "pretrain", "data": recorded})  # this user's record: outside paths read
    vlkit.finetune(run, data={"on_error": "skip"}, output_dir=tmp_path / "ft")
    data = captured["finetune"].data  # the run's captions and images (not the shapes world), on_error changed
    assert {k: data[k] for k in recorded} == {**recorded, "on_error": "skip", "image": data["image"]}
    assert {k: data["image"][k] for k in recorded["image"]} == recorded["image"]
    vlkit.pretrain("uniter/tiny", data={"num_images": 30}, output_dir=tmp_path / "p")
    assert captured["pretrain"].data["name"] == "shapes" and captured["pretrain"].data["num_images"] == 30
    with pytest.raises(vlkit.SpecError, match=r'finetune\(data=\{"on_eror": \.\.\.\}\) is not a known key \(did you '
                                              r"mean 'on_error'"):
        vlkit.finetune(run, data={"on_eror": "skip"}, output_dir=tmp_path / "ft2")


@pytest.mark.parametrize("call, named", [
    (lambda: vlkit.pretrain("uniter/tiny", output_dir=123), r"pretrain\(output_dir=123\): give a folder path"),
    (lambda: vlkit.evaluate(12345), r"evaluate\(run=12345\): give a run's folder"),
    (lambda: vlkit.finetune("uniter/tiny", task=["vqa"]), r"finetune\(task=\['vqa'\]\): give a task name"),
    (lambda: vlkit.compare("meter/tiny"), r"compare\(runs='meter/tiny'\): give a list of runs"),
    (lambda: vlkit.compare(["meter/tiny"], tasks="vqa"), r"compare\(tasks='vqa'\): give a list"),
    (lambda: vlkit.build_processor("uniter/tiny", images=123), r"build_processor\(images=123\): give a path"),
    (lambda: vlkit.pretrain("uniter/tiny", mix=3), r"pretrain\(mix=3\): give a mix preset name"),
    (lambda: vlkit.pretrain(3.5), r"pretrain\(model=3.5\): give a model"),
    (lambda: vlkit.finetune("uniter/tiny", seed="1"), r"finetune\(seed='1'\): give a whole number"),
    (lambda: vlkit.pretrain("uniter/tiny", mix="uniterr"), r"pretrain\(mix=\.\.\.\): unknown objectives 'uniterr' "
                                                          r"\(did you mean 'uniter'"),
])
def test_a_wrong_argument_is_named(call, named, captured):
    with pytest.raises((TypeError, ValueError), match=named):
        call()


def test_the_command_holds_its_folders_lock_from_python_too(tmp_path):
    from vlkit.locks import FolderInUse, hold

    with hold(tmp_path / "out", "trainer.output_dir", "another pretrain"):
        with pytest.raises(FolderInUse, match="another pretrain"):
            vlkit.pretrain("uniter/tiny", trainer={"max_steps": 1}, output_dir=tmp_path / "out")
        with pytest.raises(FolderInUse):
            vlkit.finetune("uniter/tiny", trainer={"max_steps": 1}, output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_quiet_mode_prints_no_summary_and_returns_the_results(tmp_path, capsys):
    kwargs = dict(trainer={**TRAINER, "max_steps": 1, "warmup": 0}, cache_dir=tmp_path / "cache", threads=1)
    result = vlkit.pretrain("uniter/tiny", {"name": "shapes", "num_images": 20}, output_dir=tmp_path / "a",
                            quiet=True, **kwargs)
    assert result.metrics["step"] == 1 and '"pretrain"' not in capsys.readouterr().out
    vlkit.set_quiet(True)
    try:
        again = vlkit.pretrain("uniter/tiny", {"name": "shapes", "num_images": 20}, output_dir=tmp_path / "b",
                               **kwargs)
        assert '"pretrain"' not in capsys.readouterr().out
        assert [r["loss"] for r in again.history] == [r["loss"] for r in result.history]
        vlkit.pretrain("uniter/tiny", {"name": "shapes", "num_images": 20}, output_dir=tmp_path / "c", quiet=False,
                       **kwargs)
        assert '"pretrain"' in capsys.readouterr().out
    finally:
        vlkit.set_quiet(False)
