"""Issue 45: an executor from an outside package (tests/plugins/vlkit_subprocess: each unit in a fresh
``python -m vlkit.compare.worker`` process), found through the ``vlkit.plugins`` entry point and touching no vlkit
file, reproduces the local executor's records and gets its own ``compare.subprocess`` block (validated, in
``--help``), its dry-run line and its resume rules."""
from __future__ import annotations

import json
import re
import sys

from pathlib import Path

import pytest

from vlkit.cli import command_help, compose, main

SMALL = ["compare=smoke", "compare.seeds=[0]", "compare.tasks=[vqa,nlvr2]", "progress=false"]
ONE_RUN = [*SMALL, "compare.runs=[{name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter}]"]
PACKAGE = Path(__file__).resolve().parent / "vlkit_subprocess"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
TIMING = {"train_samples_per_s", "latency_ms"}


def untimed(folder) -> list[dict]:
    records = json.loads((folder / "results.json").read_text())["records"]
    return [{k: v for k, v in r.items() if k not in TIMING and not k.endswith("wall_s")} for r in records]


@pytest.fixture(scope="module")
def runs(install_plugin, tmp_path_factory):
    """The same comparison on the local executor and on the plugin's."""
    target = install_plugin("vlkit_subprocess", "vlkit_subprocess", executors=("subprocess",))
    root = tmp_path_factory.mktemp("subprocess")
    common = [*ONE_RUN, f"cache_dir={root / 'cache'}", "workers=2"]
    assert main(["compare", *common, f"output_dir={root / 'local'}"]) == 0
    assert main(["compare", *common, f"output_dir={root / 'plugin'}", "compare.executor=subprocess",
                 "compare.subprocess.max_parallel=2"]) == 0
    return target, root, common


def test_the_plugin_executor_reproduces_the_local_records(runs):
    target, root, _ = runs
    assert sys.modules["vlkit_subprocess"].__file__.startswith(str(target))  # the installed copy, found by entry point
    assert untimed(root / "plugin") == untimed(root / "local")
    logs = [p.read_text() for p in (root / "plugin" / "runs").glob("*/*/*/unit.log")]
    pids = {m for log in logs for m in re.findall(r"attempt \d+, pid (\d+),", log)}
    assert len(logs) == 5 and len(pids) == 5  # each unit in a process of its own


def test_the_plugin_has_its_own_config_block(runs, tmp_path):
    cfg = compose("compare", ["compare.subprocess.max_parallel=3"])  # a declared key: no '+' needed
    assert dict(cfg.compare.subprocess) == {"max_parallel": 3, "python": None, "env": {}}
    assert re.search(r"compare\.subprocess\.max_parallel=null +units at once \(default: workers\)", command_help("compare"))
    out = tmp_path / "out"
    with pytest.raises(KeyError, match=r"compare.subprocess: unknown key\(s\) max_paralel; known: env, max_parallel, "
                                       r"python"):
        main(["compare", *ONE_RUN, "+compare.subprocess.max_paralel=3", f"output_dir={out}"])
    with pytest.raises(FileNotFoundError, match="compare.subprocess.python=/no/python: no such executable"):
        main(["compare", *ONE_RUN, "compare.executor=subprocess", "compare.subprocess.python=/no/python",
              f"output_dir={out}"])
    assert not out.exists()  # refused before anything was written


def test_the_plugin_has_its_dry_run_line(runs, capsys):
    _, root, common = runs
    assert main(["compare", *common, "dry_run=true", "compare.subprocess.max_parallel=3"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^- executor subprocess: 3 fresh process\(es\) at once -> about \S+ h wall$", out, re.M)
    assert "- executor local: 2 unit(s) at once" in out  # the built-ins' lines stay


def test_the_plugin_has_its_resume_rules(runs):
    _, root, common = runs
    plugin = [*common, f"output_dir={root / 'plugin'}", "compare.executor=subprocess", "resume=true"]
    assert main(["compare", *plugin, "compare.subprocess.max_parallel=1"]) == 0  # resume-safe: how many at once
    with pytest.raises(ValueError, match=r"changed: .*compare\.subprocess\.env\.SEED: \"<unset>\" -> \"1\""):
        main(["compare", *plugin, "compare.subprocess.max_parallel=2", "+compare.subprocess.env.SEED='1'"])


def test_the_page_shows_the_plugin_as_tested():
    blocks = re.findall(r"```(\w+)\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert (PACKAGE / "vlkit_subprocess.py").read_text() in [code for lang, code in blocks if lang == "python"]
    assert (PACKAGE / "pyproject.toml").read_text() in [code for lang, code in blocks if lang == "toml"]
