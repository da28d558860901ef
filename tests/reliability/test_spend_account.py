"""Issue 54: the spend account never costs a record, and counts only records it can trust. A run whose objective
mix its model cannot serve is refused before any unit (the account rebuilt every run's pre-training after the
units ran); a failure of the account leaves the report written, saying what failed; a session or attempt record
that is truncated, of the wrong shape, ends before it starts, is dated ahead of the clock, or names a live pid
that is not vlkit's is set aside and named with its file, in results.md and by `vlkit compare-report`."""
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest
from refusal_cases import comparison_file

from vlkit.compare import account as account_module, command as command_module
from vlkit.compare.account import SESSIONS_DIR, SKEW_S, Session, read_sessions, unit_attempts

FAST = ["threads=1", "workers=1", "progress=false"]
DAY = 86400.0


def test_a_mix_the_model_cannot_serve_is_refused_before_any_unit(tmp_path, vlkit_console):
    """At 455e9a4 the units ran and the report then died on `IncompatibleObjective` (the account's plan)."""
    out = tmp_path / "out"
    mine = comparison_file(tmp_path, "{name: uniter_mim, model: {name: uniter, preset: tiny}, "
                                      "objectives: meter_mim_discrete}")
    code, _, err = vlkit_console("compare", f"compare={mine}", f"output_dir={out}", *FAST)
    assert code == 1, err
    assert "run uniter_mim: objective mix: mim masks image patches; uniter takes regions" in err, err
    assert "looks like a bug" not in err and not out.exists()


def _raise(*_args, **_kwargs):
    raise RuntimeError("injected")


def test_a_failing_account_keeps_every_record_and_the_report_says_what_failed(tmp_path, vlkit_console, monkeypatch):
    out = tmp_path / "out"
    mine = comparison_file(tmp_path, "{name: scratch, model: {name: uniter, preset: tiny}, objectives: null}")
    args = ("compare", f"compare={mine}", f"output_dir={out}", *FAST, f"cache_dir={tmp_path / 'cache'}")
    with monkeypatch.context() as patch:  # pricing the plan fails: the account has spent figures, no planned ones
        patch.setattr(command_module, "spent_costs", _raise)
        code, stdout, err = vlkit_console(*args)
    assert code == 0, err
    unit = json.loads((out / "runs/scratch/seed0/scratch-vqa/unit.json").read_text())
    assert unit["state"] == "finished" and unit["result"]["metrics"]
    results = (out / "results.md").read_text()
    note = "Not accounted: the FLOP costs of the units failed: RuntimeError: injected."
    assert note in results and note in stdout and "Spent: wall time" in results
    assert json.loads((out / "results.json").read_text())["records"]

    (out / SESSIONS_DIR / "009.json").write_text('{"session": 9, "started": 17')  # cut short
    with monkeypatch.context() as patch:  # the account itself fails: the report is still written
        patch.setattr(account_module, "account", _raise)
        code, stdout, err = vlkit_console("compare-report", f"output_dir={out}")
    assert code == 0, err
    results = (out / "results.md").read_text()
    assert "Not accounted: the account of what it spent failed: RuntimeError: injected." in results
    assert json.loads((out / "results.json").read_text())["records"] and (out / "units.md").is_file()

    code, stdout, err = vlkit_console("compare-report", f"output_dir={out}")  # nothing injected: all accounted
    assert code == 0 and "Not accounted" not in stdout, stdout + err
    aside = "Set aside: sessions/009.json: not a readable JSON record (truncated or edited"
    assert aside in stdout and aside in (out / "results.md").read_text()


# -- the records the account reads ---------------------------------------------------------------------------------
def _session(tmp_path, **changes) -> dict:
    now = time.time()
    record = {"session": 1, "started": now - 60, "last_seen": now - 10, "ended": now - 10, "end": "finished",
              "host": "elsewhere", "pid": 1, "executor": "local", "command": "vlkit compare"}
    record.update(changes)
    (tmp_path / SESSIONS_DIR).mkdir(exist_ok=True)
    (tmp_path / SESSIONS_DIR / "001.json").write_text(json.dumps(record))
    return record


@pytest.mark.parametrize("content, why", [
    ('{"session": 1, "started": 1700000000.0, "last_se', "not a readable JSON record (truncated or edited"),
    ("[1, 2]", "holds a list, not a record (a mapping)"),
    ('{"session": 1, "started": 1700000000.0}', "lacks the key(s) last_seen, ended, end, host, pid, executor, command"),
    ('{"session": 1, "started": "noon", "last_seen": 1, "ended": null, "end": null, "host": "h", "pid": 1, '
     '"executor": "local", "command": "c"}', "started='noon' is not a time"),
])
def test_a_session_record_of_the_wrong_shape_is_set_aside_naming_its_file(tmp_path, content, why):
    """At 455e9a4: skipped as a session that ran nothing, or a bare KeyError / "looks like a bug"."""
    (tmp_path / SESSIONS_DIR).mkdir()
    (tmp_path / SESSIONS_DIR / "001.json").write_text(content)
    aside = []
    assert read_sessions(tmp_path, set_aside=aside) == []
    assert aside[0]["file"] == "sessions/001.json" and why in aside[0]["why"], aside


def test_a_session_cut_short_before_its_first_write_ran_nothing_and_is_not_a_problem(tmp_path):
    (tmp_path / SESSIONS_DIR).mkdir()
    (tmp_path / SESSIONS_DIR / "001.json").write_text("")  # Session.begin's O_EXCL file, killed before the write
    aside = []
    assert read_sessions(tmp_path, set_aside=aside) == [] and aside == []


def test_a_session_that_ends_before_it_starts_is_set_aside_not_clamped(tmp_path):
    now = time.time()
    _session(tmp_path, started=now - 10, last_seen=now - 10, ended=now - 137)
    aside = []
    assert read_sessions(tmp_path, set_aside=aside) == []
    assert aside[0]["file"] == "sessions/001.json" and "ends before it starts (ended " in aside[0]["why"]


def test_a_session_dated_a_day_ahead_is_set_aside_not_reported_as_tomorrow(tmp_path):
    now = time.time()
    _session(tmp_path, started=now - 60, last_seen=now + DAY, ended=now + DAY)
    aside = []
    assert read_sessions(tmp_path, set_aside=aside) == []
    assert "s ahead of this machine's clock (more than the 300 s two clocks may differ by)" in aside[0]["why"]
    _session(tmp_path, ended=time.time() + SKEW_S / 2, last_seen=time.time() + SKEW_S / 2)  # within the skew
    assert len(read_sessions(tmp_path)) == 1


@pytest.fixture
def stranger():
    """A live process of this host that is not vlkit (a pid a killed session's record may name once reused)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    process.kill()
    process.wait()


@pytest.mark.parametrize("recorded", ["pid_started", "older_record"])
def test_an_unfinished_session_under_a_live_pid_that_is_not_vlkit_is_killed_not_running(tmp_path, stranger,
                                                                                          recorded):
    """At 455e9a4 it counted as a running session whose wall time grew with the clock."""
    import socket

    now = time.time()
    extra = {"pid_started": now - 3600} if recorded == "pid_started" else {}  # the writer started an hour ago
    # without pid_started (a record of an older vlkit): the process started after the record and is no vlkit
    _session(tmp_path, host=socket.gethostname(), pid=stranger.pid, started=now - 3600, last_seen=now - 3590,
             ended=None, end=None, **extra)
    [session] = read_sessions(tmp_path)
    assert session["end"] == "killed" and session["span_s"] == pytest.approx(10.0)


def test_this_processs_own_unfinished_session_is_running(tmp_path):
    session = Session.begin(tmp_path, time.time() - 1, "vlkit compare", "local")
    assert abs(session.record["pid_started"] - psutil.Process().create_time()) < 2
    [read] = read_sessions(tmp_path)
    assert read["end"] == "running"


def _unit(tmp_path, attempts, heartbeat_ahead: float = 0.0):
    folder = tmp_path / "runs" / "u"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "unit.json").write_text(json.dumps({"unit": "u", "state": "running", "attempts": attempts}))
    if heartbeat_ahead:
        (folder / "heartbeat").touch()
        stamp = time.time() + heartbeat_ahead
        os.utime(folder / "heartbeat", (stamp, stamp))
    return SimpleNamespace(compare={}, output_dir=tmp_path, all_units=lambda: ["u"],
                           unit_dir=lambda unit: tmp_path / "runs" / unit, key=lambda unit: unit)


def test_a_heartbeat_dated_a_day_ahead_is_not_a_day_of_unit_seconds(tmp_path):
    """At 455e9a4 a 6 s attempt whose heartbeat was dated a day ahead counted 86,442 unit-seconds (24 CPU-hours)."""
    now = time.time()
    comparison = _unit(tmp_path, [{"attempt": 1, "session": 1, "host": "elsewhere", "pid": 1, "started": now - 6,
                                   "state": "running"}], heartbeat_ahead=DAY)
    aside = []
    [attempt] = unit_attempts(comparison, aside)["u"]
    assert attempt["state"] == "died" and attempt["wall_s"] == 0.0
    assert aside[0]["file"] == "runs/u/heartbeat" and "s ahead of this machine's clock" in aside[0]["why"]


@pytest.mark.parametrize("attempt, why", [
    ([1, 2], "attempts[0] holds a list, not a record (a mapping)"),
    ({"attempt": 1, "host": "h", "started": 1.0, "state": "finished", "ended": 2.0}, "attempts[0] lacks the key(s) pid"),
    ({"attempt": 1, "host": "h", "pid": 1, "started": 50.0, "state": "finished", "ended": 20.0},
     "attempts[0] ends before it starts (ended "),
    ({"attempt": 1, "host": "h", "pid": 1, "started": 50.0, "state": "finished"}, "attempts[0] lacks the key(s) ended"),
    ({"attempt": 1, "host": "h", "pid": 1, "started": 50.0, "state": "done", "ended": 60.0},
     "attempts[0] state='done', not one of running, finished, failed, died"),
])
def test_an_attempt_of_the_wrong_shape_is_set_aside_naming_its_unit_json(tmp_path, attempt, why):
    good = {"attempt": 2, "host": "h", "pid": 1, "started": 100.0, "state": "finished", "ended": 106.0}
    aside = []
    attempts = unit_attempts(_unit(tmp_path, [attempt, good]), aside)["u"]
    assert [a["wall_s"] for a in attempts] == [6.0]  # the good attempt counted, the bad one named
    assert aside[0]["file"] == "runs/u/unit.json" and why in aside[0]["why"], aside


def test_a_unit_json_that_is_a_list_or_truncated_is_set_aside(tmp_path):
    comparison = _unit(tmp_path, [])
    (tmp_path / "runs/u/unit.json").write_text("[]")
    aside = []
    assert unit_attempts(comparison, aside) == {}
    assert aside[0] == {"file": "runs/u/unit.json", "why": "holds a list, not a unit's record (a mapping)"}
    (tmp_path / "runs/u/unit.json").write_text('{"unit": "u", "attem')
    aside = []
    assert unit_attempts(comparison, aside) == {}
    assert aside[0]["file"] == "runs/u/unit.json" and "not a readable JSON record" in aside[0]["why"]
