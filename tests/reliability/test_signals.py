"""Catalogue, class "signals" (the single commands; `vlkit compare` has its own tests): SIGTERM and SIGINT stop a
command cleanly, exit 128 + the signal number, keep every complete checkpoint and leave the run resumable."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from reliability_helpers import jsonl_data, run_args
from test_kill import _leftovers, _same_run

from vlkit.runtime import Interrupted, interrupt_on_signals, stop_processes

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_training_exits_cleanly_and_the_run_resumes_bit_exactly(tmp_path, data, vlkit_console, signum):
    store, caps, _ = data()
    args = ["pretrain", "model=uniter", *jsonl_data(caps, store), "trainer.keep_checkpoints=0"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert vlkit_console(*args, *run_args(straight, steps=4))[0] == 0
    code = f"""
        import os, sys
        from vlkit.train.trainer import Trainer
        step = Trainer._train_step
        def signalled(self, model, optimizer, scheduler, stream, i):
            if i == 2:  # inside step 3, after the step-2 checkpoint (as SLURM's SIGTERM comes, at any time)
                os.kill(os.getpid(), {int(signum)})
            return step(self, model, optimizer, scheduler, stream, i)
        Trainer._train_step = signalled
        from vlkit.cli import console
        sys.exit(console({[*args, *run_args(stopped, steps=4)]!r}))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, proc.stderr[-3000:]
    assert f"vlkit pretrain: interrupted by {name}" in proc.stderr and "resume=true" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (stopped / "checkpoints" / "step_2" / "trainer_state.json").is_file()
    assert not (stopped / "checkpoints" / "step_3").exists()
    assert vlkit_console(*args, *run_args(stopped, steps=4), "resume=true")[0] == 0
    _same_run(straight, stopped)
    assert _leftovers(stopped) == []


def test_interrupt_on_signals_restores_the_handlers_and_stop_processes_ends_children():
    import multiprocessing

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as info:
        with interrupt_on_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
    assert info.value.exit_code == 143 and info.value.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    stubborn = ctx.Process(target=_ignore_sigterm_and_sleep, args=(ready,))
    stubborn.start()
    assert ready.wait(120)
    stop_processes([stubborn], grace=1.0)
    assert not stubborn.is_alive() and stubborn.exitcode == -signal.SIGKILL


def _ignore_sigterm_and_sleep(ready) -> None:
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(120)
