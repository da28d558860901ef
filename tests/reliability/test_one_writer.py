"""Issue 44, class 1: two writers in one folder. Every output folder a command writes has a lock beside it
(`vlkit.locks`): a second writer is refused at once naming the live one, a stale lock (a dead writer, a reused
pid) is taken over, and the lock goes when the command ends."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vlkit.locks import FolderInUse, acquire, hold, lock_path, release

PRETRAIN = ["model=uniter", "model.preset=tiny", "data.num_images=40", "trainer.batch_size=4", "trainer.progress=false",
            "trainer.trackers=[]", "threads=1"]


def _pretrain(out: Path, steps: int = 2) -> list[str]:
    return ["pretrain", *PRETRAIN, f"trainer.output_dir={out}", f"trainer.max_steps={steps}"]


def _steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_second_writer_is_refused_at_once_naming_the_live_one(tmp_path, vlkit_console):
    out = tmp_path / "run"
    with hold(out, "trainer.output_dir", "vlkit pretrain (the first)"):
        assert lock_path(out).is_file()
        started = time.monotonic()
        code, _, err = vlkit_console(*_pretrain(out))
        assert time.monotonic() - started < 30  # refused before any data work
    assert code == 1, err
    assert f"trainer.output_dir={out} is being written by another vlkit process: pid {os.getpid()} on host " \
           f"{socket.gethostname()} since" in err and "vlkit pretrain (the first)" in err
    assert "looks like a bug" not in err and not out.exists()
    assert not lock_path(out).exists()  # released when its holder's block ended


def test_two_pretrains_started_together_one_refused_the_other_intact(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [subprocess.Popen([sys.executable, "-m", "vlkit.cli", *_pretrain(out, steps=12)], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in processes]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    refused = next(err for code, _, err in results if code == 1)
    # refused by the lock while the other runs, or (had the first ended already) by the run it left
    assert "is being written by another vlkit process" in refused or "already holds a run" in refused, refused
    assert "looks like a bug" not in refused
    assert _steps(out) == list(range(1, 13))  # the winner's run, whole, not interleaved with another
    assert json.loads((out / "run.json").read_text())["kind"] == "pretrain"
    assert not lock_path(out).exists()


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize("how", ["dead", "reused"])
def test_a_stale_lock_is_taken_over(tmp_path, vlkit_console, how):
    """A lock whose writer died (its pid gone, or reused by a process that started at another time) is taken over."""
    out = tmp_path / "run"
    pid, started = (_dead_pid(), time.time() - 60) if how == "dead" else (os.getppid(), 12345.0)
    lock_path(out).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": started,
                                          "since": started, "command": "vlkit pretrain", "token": "old"}))
    code, _, err = vlkit_console(*_pretrain(out))
    assert code == 0, err
    assert _steps(out) == [1, 2] and not lock_path(out).exists()


def test_a_lock_of_another_host_or_half_written_is_judged_by_what_can_be_known(tmp_path):
    out = tmp_path / "run"
    lock_path(out).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": 1.0, "since": 1.0}))
    with pytest.raises(FolderInUse, match="pid 1 on host elsewhere since .* delete it only if that process is gone"):
        acquire(out, "output_dir")
    lock_path(out).write_text("")  # a writer killed between creating its lock and writing it
    os.utime(lock_path(out), (time.time() - 60, time.time() - 60))
    record = acquire(out, "output_dir")
    assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
    release(out, {**record, "token": "another"})  # not ours: stays
    assert lock_path(out).exists()
    release(out, record)
    assert not lock_path(out).exists() and not out.exists()


def test_folders_made_for_the_lock_go_with_it(tmp_path):
    out = tmp_path / "a" / "b" / "run"
    with hold({"out": out, "again": out}):  # one lock a path
        assert lock_path(out).is_file()
    assert not (tmp_path / "a").exists()


def _compare(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vlkit.cli", "compare", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_second_compare_resume_while_the_first_runs_is_refused(tmp_path, vlkit_console):
    out = tmp_path / "cmp"
    args = ["compare=smoke", "compare.seeds=[0]", f"output_dir={out}", "threads=1", "workers=1", "progress=false",
            f"cache_dir={tmp_path / 'cache'}"]
    first = _compare(args)
    try:
        deadline = time.monotonic() + 300
        while not (out / "plan.json").is_file():
            assert first.poll() is None, first.stdout.read()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        code, _, err = vlkit_console("compare", *args, "resume=true")
        assert code == 1, err
        assert f"output_dir={out} is being written by another vlkit process: pid {first.pid}" in err, err
        assert "looks like a bug" not in err
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=120)
    assert not any((out / "runs").glob("*/*/*/unit.log")) or all(
        "attempt 2" not in p.read_text() for p in (out / "runs").glob("*/*/*/unit.log"))  # no unit ran twice
