"""Issue 20: durable units. A comparison killed (SIGKILL, twice) and resumed gives the records of an
uninterrupted run and never reruns a finished unit; a failing unit leaves every other unit finished and
its retry runs it alone; a killed unit resumes from its checkpoint; a changed configuration is refused."""
import gc
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vlkit.cli import main

from compare_helpers import records, untimed

FAST = ["threads=1", "progress=false"]


def _finished(out: Path) -> set[str]:
    done = set()
    for path in (out / "runs").glob("*/*/*/unit.json"):
        try:
            state = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if state.get("state") == "finished":
            done.add(state["unit"])
    return done


def _attempts(out: Path) -> dict[str, int]:
    """How often each unit started, read from the units' own logs."""
    return {str(p.parent.relative_to(out / "runs")): len(re.findall(r"^--- .*: attempt \d+", p.read_text(), re.M))
            for p in (out / "runs").glob("*/*/*/unit.log")}


def _compare_process(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vlkit.cli", "compare", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _kill_after(args: list[str], out: Path, units: int, timeout: float = 900) -> dict[str, int]:
    """Start the comparison, SIGKILL its parent once ``units`` units finished; return the finished units
    with the number of attempts each had made."""
    process = _compare_process(args)
    deadline = time.monotonic() + timeout
    while len(_finished(out)) < units:
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, "the comparison did not get far enough"
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    _wait_for_workers_to_die(out)
    attempts = _attempts(out)
    return {key: attempts[key] for key in _finished(out)}


def _wait_for_workers_to_die(out: Path, timeout: float = 60) -> None:
    """No worker outlives its parent: the pids recorded by units still marked running go away."""
    from vlkit.runtime import pid_alive

    deadline = time.monotonic() + timeout
    while True:
        pids = [json.loads(p.read_text()).get("pid") for p in (out / "runs").glob("*/*/*/unit.json")
                if json.loads(p.read_text()).get("state") == "running"]
        if not any(pid_alive(pid) for pid in pids):
            return
        assert time.monotonic() < deadline, f"worker processes {pids} outlived their parent"
        time.sleep(0.5)


@pytest.mark.slow
def test_sigkill_twice_then_resume_gives_the_uninterrupted_records(smoke, tmp_path):
    out = tmp_path / "killed"
    args = ["compare=smoke", f"output_dir={out}", "workers=2", f"cache_dir={smoke / 'cache'}",
            "compare.checkpoint_every=2", *FAST]
    first_kill = _kill_after(args, out, 4)
    assert not (out / "results.json").exists() or len(records(out)) < 12
    second_kill = _kill_after([*args, "resume=true"], out, 30)
    assert set(first_kill) <= set(second_kill)
    process = _compare_process([*args, "resume=true"])
    log, _ = process.communicate(timeout=900)
    assert process.returncode == 0, log
    assert [untimed(r) for r in records(out)] == [untimed(r) for r in records(smoke / "first")]
    a = json.loads((out / "manifest.json").read_text())
    b = json.loads((smoke / "first" / "manifest.json").read_text())
    assert a["ids_seen"] == b["ids_seen"] and a["data"]["hash"] == b["data"]["hash"] and a["complete"]
    report = json.loads((out / "results.json").read_text())
    reference = json.loads((smoke / "first" / "results.json").read_text())
    assert report["tests"] == reference["tests"] and report["chance"] == reference["chance"]
    attempts = _attempts(out)  # no unit that had finished before a kill ran again after it
    for done in (first_kill, second_kill):
        assert {k: attempts[k] for k in done} == done
    assert any(n > 1 for n in attempts.values())  # a kill landed in a unit, which ran again
    assert set(attempts) == {str(p.parent.relative_to(out / "runs")) for p in (out / "runs").glob("*/*/*/unit.json")}


def _bad_file_comparison(tmp_path: Path, cache: Path) -> tuple[list[str], Path, Path]:
    runs = tmp_path / "runs.yaml"
    bad = tmp_path / "dataset_shapes.json"
    bad.write_text('{"images": [')  # truncated
    runs.write_text(f"""# @package _global_
defaults:
  - smoke
  - _self_
compare:
  seeds: [0]
  tasks: [vqa, retrieval]
  runs:
    - {{name: vilbert, model: {{name: vilbert, preset: tiny}}, objectives: vilbert}}
    - {{name: uniter, model: {{name: uniter, preset: tiny}}, objectives: uniter,
       task_overrides: {{retrieval: {{source: files, path: {bad}, eval_splits: [val]}}}}}}
""")
    out = tmp_path / "out"
    return ["compare=" + str(runs), f"output_dir={out}", "workers=2", f"cache_dir={cache}", *FAST], out, bad


@pytest.mark.slow
def test_a_failing_unit_leaves_the_others_finished_and_its_retry_runs_it_alone(smoke, tmp_path, capsys):
    from vlkit.cli import compose
    from vlkit.data.shapes import ShapesWorld, write_shapes

    args, out, bad = _bad_file_comparison(tmp_path, smoke / "cache")
    assert main(["compare", *args]) == 1
    err = capsys.readouterr().err
    # uniter's pre-training reads the file too (its zero-shot retrieval): it fails, its fine-tunings are skipped
    failed = {"uniter/seed0/pretrain", "uniter/seed0/scratch-retrieval"}
    skipped = {"uniter/seed0/pretrained-vqa", "uniter/seed0/pretrained-retrieval"}
    for key in failed:
        assert f"{key}: failed" in err
        state = json.loads((out / "runs" / key / "unit.json").read_text())
        assert state["state"] == "failed" and "dataset_shapes.json" in state["error"]
        assert "Traceback" in (out / "runs" / key / "traceback.txt").read_text()
        assert "dataset_shapes.json" in (out / "runs" / key / "unit.log").read_text()
    for key in skipped:
        assert f"{key}: skipped" in err and not (out / "runs" / key).exists()
    assert len(_finished(out)) == 10 - 4  # vilbert's 5 units and uniter's scratch vqa went on
    retry = re.search(r"^  (vlkit compare .*resume=true)$", err, re.M).group(1)
    assert f"output_dir={out}" in retry
    # the report is there already, with the failed and skipped units listed as such
    units = (out / "units.md").read_text()
    assert all(f"| {key} | failed |" in units for key in failed) and all(f"| {key} | skipped |" in units for key in skipped)
    assert len(records(out)) == 3  # vilbert pretrained and scratch, uniter scratch (vqa only)
    assert main(["compare-report", f"output_dir={out}"]) == 0
    # the fix: the real file; the retry runs the failed units and their dependents, nothing else
    data = compose("compare", ["compare=" + args[0].split("=", 1)[1]])["data"]
    write_shapes(ShapesWorld.from_cfg(dict(data)), tmp_path / "fixed")
    bad.write_text((tmp_path / "fixed" / "dataset_shapes.json").read_text())
    before = _attempts(out)
    assert main(["compare", *shlex.split(retry)[2:]]) == 0
    after = _attempts(out)
    assert {k for k in after if after[k] != before.get(k, 0)} == failed | skipped
    assert len(_finished(out)) == 10 and "ir_r1" in records(out)[2] and "units: 10 finished" in (out / "units.md").read_text()


def test_resume_refuses_a_changed_configuration_naming_the_keys(tmp_path):
    from vlkit.compare.command import write_plan

    cfg = {"compare": {"seeds": [0], "trainer": {"common": {"lr": 1e-3}}, "retries": 0}, "data": {"name": "shapes"}}
    write_plan(cfg, tmp_path, ["compare=smoke"], resume=False)
    with pytest.raises(FileExistsError, match="resume=true"):
        write_plan(cfg, tmp_path, [], resume=False)
    write_plan({**cfg, "compare": {**cfg["compare"], "retries": 3}, "workers": 4}, tmp_path, [], resume=True)  # safe
    changed = {**cfg, "compare": {**cfg["compare"], "seeds": [0, 1], "trainer": {"common": {"lr": 2e-3}}}}
    with pytest.raises(ValueError, match=r"compare.seeds: \[0\] -> \[0, 1\]; compare.trainer.common.lr: 0.001 -> 0.002"):
        write_plan(changed, tmp_path, [], resume=True)


def test_seeds_must_be_a_non_empty_list_without_repeats():
    for seeds, message in (([], "non-empty"), ([0, 1, 0], r"seed\(s\) \[0\] repeated")):
        with pytest.raises(ValueError, match=message):
            main(["compare", "compare=smoke", f"compare.seeds={json.dumps(seeds)}", "dry_run=true"])


def test_a_unit_killed_mid_way_resumes_from_its_checkpoint(tmp_path, monkeypatch, cache):
    """A unit that dies after its step-2 checkpoint resumes there: the same result as a run straight
    through, every id seen since step 0, and the log says where it resumed."""
    from vlkit.cli import compose
    from vlkit.compare.command import write_plan
    from vlkit.compare.config import resolve_config
    from vlkit.compare.units import UnitFolder
    from vlkit.compare.worker import run_job
    from vlkit.train.trainer import Trainer

    def plan(name: str) -> Path:
        cfg = resolve_config(compose("compare", ["compare=smoke", "compare.seeds=[0]", "compare.checkpoint_every=2",
                                                 f"cache_dir={cache}", "threads=1"]))
        cfg["compare"]["runs"] = cfg["compare"]["runs"][1:2]  # uniter
        return write_plan(cfg, tmp_path / name, [], resume=False)

    held = {"cached": [1, 2]}  # alive before the unit, as a worker's environments and task data are
    straight = run_job(plan("straight"), "uniter/seed0/pretrain")
    assert not any(o is held for o in gc.get_objects())  # frozen: the unit's collections no longer walk it
    step = Trainer._train_step

    def dies_at_step_3(self, model, optimizer, scheduler, stream, i):
        if i == 2:
            raise MemoryError("killed")
        return step(self, model, optimizer, scheduler, stream, i)

    killed = plan("killed")
    monkeypatch.setattr(Trainer, "_train_step", dies_at_step_3)
    assert run_job(killed, "uniter/seed0/pretrain")["state"] == "failed"
    monkeypatch.setattr(Trainer, "_train_step", step)
    assert run_job(killed, "uniter/seed0/pretrain") == {**straight}
    unit = tmp_path / "killed" / "runs" / "uniter" / "seed0" / "pretrain"
    assert re.search(r"resuming from .*step_2 \(step 2", (unit / "unit.log").read_text())
    a = UnitFolder(unit, "").read()["result"]
    b = UnitFolder(tmp_path / "straight" / "runs" / "uniter" / "seed0" / "pretrain", "").read()["result"]
    assert untimed(a["stats"]) == untimed(b["stats"]) and a["metrics"] == b["metrics"] and a["ids"] == b["ids"]
    assert [r["loss"] for r in a["curve"]] == [r["loss"] for r in b["curve"]] and len(a["curve"]) == 4


def test_sigterm_stops_the_workers_and_leaves_a_resumable_folder(smoke, tmp_path):
    out = tmp_path / "stopped"
    process = _compare_process(["compare=smoke", f"output_dir={out}", "workers=2", f"cache_dir={smoke / 'cache'}", *FAST])
    deadline = time.monotonic() + 600
    while not _finished(out):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    log, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, log
    assert "stopped by SIGTERM" in log and "resume=true" in log
    _wait_for_workers_to_die(out, timeout=10)
