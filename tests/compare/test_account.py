"""Issue 47: what a comparison spent, across every session. A comparison SIGKILLed twice (its whole process group, as
a lost node or `kill -9` of a job) and finished by a third session reports the sum of the three sessions' spans as
its wall time, the sum of every attempt's wall as its unit-seconds, the attempts the kills cut short as died (and
wasted), on each executor; the report shows every session beside the plan."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vlkit.compare.account import SESSIONS_DIR

# one family's 5 units (a pre-training, its 2 fine-tunings, 2 scratch ones), two at a time, each unit long enough
# (seconds; checkpointed every 2 steps) for a kill to land inside one
ARGS = ["compare=smoke", "compare.seeds=[0]", "compare.tasks=[vqa,nlvr2]", "progress=false", "threads=1", "workers=2",
        "compare.runs=[{name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter}]",
        "compare.budget.pretrain_steps=12", "compare.budget.finetune_steps={vqa: 80, nlvr2: 80}",
        "compare.checkpoint_every=2", "compare.heartbeat_s=0.25"]
EXECUTORS = {"local": [], "slurm": ["compare.executor=slurm", "compare.slurm.cluster=local",
                                    "compare.slurm.timeout_min=30"], "ray": ["compare.executor=ray"]}
EXIT_ALLOWANCE_S = 8.0  # a session's record ends with its report; the interpreter's exit after it is not counted


def _states(out: Path) -> list[dict]:
    states = []
    for path in (out / "runs").glob("*/*/*/unit.json"):
        try:
            states.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return states


def _unit_running(out: Path, finished: int) -> bool:
    """Whether ``finished`` units finished and a unit runs that has beaten since it started (so a kill now lands
    inside it and its attempt ends after its start; its worker exits with the session and never records it finished,
    `vlkit.runtime.watched_exited`)."""
    states = {s["unit"]: s for s in _states(out)}
    if sum(s["state"] == "finished" for s in states.values()) < finished:
        return False
    for path in (out / "runs").glob("*/*/*/heartbeat"):
        state = states.get("/".join(path.parent.parts[-3:]))
        if state and state["state"] == "running" and path.stat().st_mtime > state["started"] + 0.1:
            return True
    return False


def _timeline(out: Path) -> list[dict]:
    """Each unit's attempts and last heartbeat, as the kill loop saw them (for a failure's message)."""
    beats = {"/".join(p.parent.parts[-3:]): p.stat().st_mtime for p in (out / "runs").glob("*/*/*/heartbeat")}
    return [{"unit": s["unit"], "state": s["state"], "heartbeat": beats.get(s["unit"]), "attempts": s["attempts"]}
            for s in _states(out)]


def _session(args: list[str], out: Path, kill_after: int | None, timeout: float = 900) -> float:
    """Run one session of the comparison; with ``kill_after``, SIGKILL its process group once that many units
    finished and another one is running. Returns the session's span as seen from outside."""
    # Ray >= 2.60: a local ray.init() writes a token to ~/.ray and turns token auth on, `ray start` does when one
    # is there, and a driver given an address sends it only under RAY_AUTH_MODE=token: keep auth off, $HOME as is
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    start = time.time()
    process = subprocess.Popen([sys.executable, "-m", "vlkit.cli", "compare", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    if kill_after is None:
        log, _ = process.communicate(timeout=timeout)
        assert process.returncode == 0, log
        return time.time() - start
    deadline = time.monotonic() + timeout
    while not _unit_running(out, kill_after):
        assert process.poll() is None, process.stdout.read() + json.dumps(_timeline(out), indent=1)
        assert time.monotonic() < deadline, "the comparison did not get far enough"
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGKILL)  # the driver, its workers, submitit's jobs, Ray's processes
    process.wait()
    span = time.time() - start
    process.stdout.close()
    return span


@pytest.mark.slow
@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_the_account_of_a_comparison_killed_twice_adds_every_session_and_attempt(executor, tmp_path, cache):
    if executor == "slurm":
        pytest.importorskip("submitit")
    if executor == "ray":
        pytest.importorskip("ray")
    out = tmp_path / "out"
    args = [*ARGS, *EXECUTORS[executor], f"output_dir={out}", f"cache_dir={cache}"]
    spans = [_session(args, out, kill_after=1), _session([*args, "resume=true"], out, kill_after=3),
             _session([*args, "resume=true"], out, kill_after=None)]

    account = json.loads((out / "results.json").read_text())["account"]
    sessions = account["sessions"]
    assert [s["session"] for s in sessions] == [1, 2, 3]
    assert [s["end"] for s in sessions] == ["killed", "killed", "finished"]
    assert {s["executor"] for s in sessions} == {executor}
    assert sessions[1]["command"].endswith("resume=true")
    # wall: the sum of the three sessions' spans, each the span its process had (less its exit, after the report)
    assert account["wall_s"] == pytest.approx(sum(s["span_s"] for s in sessions), rel=0.02)
    assert account["wall_s"] == pytest.approx(sum(spans), rel=0.02, abs=3 * EXIT_ALLOWANCE_S)
    for recorded, seen in zip(sessions, spans):
        assert seen - EXIT_ALLOWANCE_S <= recorded["span_s"] <= seen + 0.5, (recorded, seen)
    # unit-seconds: every attempt each unit recorded, the died ones included (each ends at its last heartbeat)
    attempts = [a for state in _states(out) for a in state["attempts"]]
    assert all(a["state"] in ("finished", "died") for a in attempts)
    assert account["unit_s"] == pytest.approx(sum(a["ended"] - a["started"] for a in attempts), rel=1e-9)
    died = [a for a in attempts if a["state"] == "died"]
    assert len(died) >= 2 and account["died"] == len(died) and account["attempts"] == len(attempts)  # one per kill
    assert account["wasted_unit_s"] == pytest.approx(sum(a["ended"] - a["started"] for a in died), rel=1e-9)
    assert all(a["ended"] > a["started"] for a in died)  # each beat before it was killed
    assert sum(s["died"] for s in sessions) == len(died) and sum(s["finished"] for s in sessions) == 5
    assert sessions[0]["finished"] >= 1 and sessions[2]["retried"] + sessions[1]["retried"] >= 1
    assert sorted(k for s in sessions for k in s["units"]["finished"]) == sorted(account["units"])  # each unit once
    # device-hours and the plan beside them: one CPU per unit
    assert account["device_hours"] == pytest.approx(account["unit_s"] / 3600)
    assert account["plan"]["device"] == "cpu" and 0 < account["mfu"] < 1
    assert set(account["units"]) == {s["unit"] for s in _states(out)}
    # the same account in the manifest, in results.md and from compare-report
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["wall_s"] == account["wall_s"] and manifest["account"]["died"] == len(died)
    results = (out / "results.md").read_text()
    assert re.search(rf"wall time {account['wall_s']:,.0f} s over 3 session\(s\)", results)
    assert "| 1 |" in results and "| killed |" in results and "| finished |" in results
    report = subprocess.run([sys.executable, "-m", "vlkit.cli", "compare-report", f"output_dir={out}"],
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0 and "over 3 session(s)" in report.stdout, report.stdout + report.stderr
    again = json.loads((out / "results.json").read_text())["account"]
    assert (again["wall_s"], again["unit_s"]) == (account["wall_s"], account["unit_s"])
    assert len(list((out / SESSIONS_DIR).glob("*.json"))) == 3  # a report is not a session
    # the manifest keeps the command, machine and commit that started the comparison, not the report's
    rewritten = json.loads((out / "manifest.json").read_text())
    assert {k: rewritten[k] for k in ("command", "platform", "git_commit")} == \
        {k: manifest[k] for k in ("command", "platform", "git_commit")}
    assert "compare-report" not in rewritten["command"] and " compare " in f" {manifest['command']} "


def test_sessions_take_their_own_numbers_and_a_killed_one_ends_at_its_last_heartbeat(tmp_path):
    from vlkit.compare.account import Session, latest_session, read_sessions

    first = Session.begin(tmp_path, time.time() - 5, "vlkit compare", "local")
    first.end("finished")
    kept = (tmp_path / SESSIONS_DIR / "001.json").read_text()
    second = Session.begin(tmp_path, time.time(), "vlkit compare resume=true", "slurm")
    second.beat()
    assert latest_session(tmp_path) == 2 and (tmp_path / SESSIONS_DIR / "001.json").read_text() == kept
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {**second.record, "session": 3, "pid": int(dead.stdout), "started": 100.0, "last_seen": 130.0}
    Session(tmp_path, record).write()  # a session whose process is gone, last seen 30 s after its start
    sessions = read_sessions(tmp_path)
    assert [(s["session"], s["end"]) for s in sessions] == [(1, "finished"), (2, "running"), (3, "killed")]
    assert sessions[0]["span_s"] == pytest.approx(first.record["ended"] - first.record["started"])
    assert sessions[0]["span_s"] >= 5 and sessions[2]["span_s"] == 30.0


def test_a_died_attempt_ends_at_its_units_last_heartbeat(tmp_path):
    from vlkit.compare.units import UnitFolder

    folder = UnitFolder(tmp_path, "u/seed0/pretrain")
    assert folder.start("h", {}, session=1) == 1
    folder.heartbeat.touch()
    beat = folder.last_seen()
    assert folder.start("h", {}, session=2) == 2  # the first attempt's process is gone: it died at its heartbeat
    folder.finish("h", {}, 2, {"wall_s": 1.0})
    attempts = folder.read()["attempts"]
    assert [(a["attempt"], a["session"], a["state"]) for a in attempts] == [(1, 1, "died"), (2, 2, "finished")]
    assert attempts[0]["ended"] == beat and attempts[1]["ended"] >= attempts[1]["started"]


def test_heartbeat_must_be_a_positive_number_of_seconds():
    from vlkit.compare.account import heartbeat_s

    assert heartbeat_s({}) == 10.0 and heartbeat_s({"heartbeat_s": 0.5}) == 0.5
    for bad in (0, -1, "often", True):
        with pytest.raises(ValueError, match="compare.heartbeat_s"):
            heartbeat_s({"heartbeat_s": bad})
