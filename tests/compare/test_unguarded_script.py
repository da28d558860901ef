"""Issue 52: `vlkit.compare` pasted into a script without ``if __name__ == "__main__":`` fails at once in the parent,
naming the idiom, before any worker starts or any file is written (a spawned worker imports the script again and
would start the comparison anew); a unit whose process died carries the executor's reason into ``units.md``."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from vlkit.compare.report import units_markdown
from vlkit.compare.units import UnitFolder, status

ROOT = Path(__file__).resolve().parents[2]
CALL = """vlkit.compare(["uniter/tiny"], preset="smoke", tasks=["vqa"], seeds=[0], baseline=False, zero_shot=False,
              itm_pairs=8, data={"num_images": 24, "val_images": 8}, output_dir=sys.argv[1], workers=1,
              cache_dir=sys.argv[2])"""


def _run(script: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600)


def test_an_unguarded_script_fails_at_once_in_the_parent_naming_the_idiom(tmp_path):
    script = tmp_path / "compare_runs.py"
    script.write_text(f"import sys\n\nimport vlkit\n\n{CALL}\n")
    proc = _run(script, str(tmp_path / "out"), str(tmp_path / "cache"))
    assert proc.returncode != 0
    err = proc.stderr
    assert f"compare: {script} starts the comparison at its top level (line 5)" in err
    assert err.count('if __name__ == "__main__":') == 2  # the message names the idiom and shows it once
    assert "worker process died" not in err and "bootstrapping phase" not in err
    assert not (tmp_path / "out").exists()  # no plan, no sessions/ record


def test_the_guard_and_calls_made_after_the_top_level_pass(tmp_path):
    script = tmp_path / "positions.py"
    script.write_text(textwrap.dedent("""\
        from vlkit.compare.executors import unguarded_script

        def call():
            return unguarded_script()

        print("top", call())
        if __name__ == "__main__":
            print("guarded", call())
        if "__main__" == __name__:
            print("reversed", unguarded_script())
        """))
    proc = _run(script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"top ('{script}', 6)", "guarded None", "reversed None"]


def test_a_unit_whose_process_died_carries_the_reason_into_units_md(tmp_path):
    started = UnitFolder(tmp_path / "runs" / "a", "a")
    started.start("h1", {"k": 1}, session=1)
    started.died("h1", "worker process died (exit code -9)")
    never = UnitFolder(tmp_path / "runs" / "b", "b")  # its process died before it could start the unit
    never.died("h2", "worker process died (exit code 1)")
    states = [("a", status(started.read(), "h1"), started.read()), ("b", status(never.read(), "h2"), never.read())]
    assert [s for _, s, _ in states] == ["died", "died"]
    assert started.read()["attempts"][0]["state"] == "died" and never.read()["attempts"] == []
    table = units_markdown(tmp_path, states, {"units": {}, "plan": {"device": "cpu"}})
    assert "| a | died |" in table and "worker process died (exit code -9) |" in table
    assert "| b | died |" in table and "worker process died (exit code 1) |" in table
    assert started.start("h1", {"k": 1}, session=2) == 2  # a retry goes on from the died record
