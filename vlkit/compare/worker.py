"""One unit of a comparison in the process that runs it, whichever executor started that process.

`run_job(plan, key)` reads the comparison from ``plan.json``, runs the unit, records its state in its
folder (`vlkit.compare.units.UnitFolder`) and returns a small outcome (``finished`` or ``failed``, with the
error): an exception in the unit is a *failed* unit, never a crash of the executor. Its prints and logs
go to the unit's ``unit.log``. In a multi-process unit (several GPUs or nodes) every rank runs the unit
and rank 0 records it. ``python -m vlkit.compare.worker PLAN KEY`` is the entry point of such a launch.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from vlkit.compare.account import heartbeat_s, latest_session
from vlkit.compare.comparison import Comparison
from vlkit.compare.config import unit_threads
from vlkit.compare.unit_work import UnitWork
from vlkit.compare.units import LOG_FILE, PLAN_DAMAGED, UnitFolder, config_hash
from vlkit.digests import remember
from vlkit.io import read_json
from vlkit.runtime import every, gemm_gflops, kernels, watched_exited

_WORK: dict[str, Any] = {}  # plan path -> UnitWork: environments and task data cached per process


def work_of(plan_path: str | Path) -> Any:
    """The `vlkit.compare.unit_work.UnitWork` of the comparison planned in ``plan_path``, built once per process."""
    plan_path = str(Path(plan_path).resolve())
    if plan_path not in _WORK:
        plan = read_json(plan_path, PLAN_DAMAGED)
        remember(plan.get("digests"))  # the input files' digests the comparison computed: read once
        _WORK[plan_path] = UnitWork(Comparison(plan["config"], Path(plan_path).parent, progress=False))
    return _WORK[plan_path]


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


@contextlib.contextmanager
def _captured(log_path: Path):
    """stdout, stderr and vlkit's log records of the block, appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("vlkit")
    with open(log_path, "a", encoding="utf-8") as log:
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                yield log
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)


def freeze_held_objects() -> None:
    """Free the last unit's garbage, then exempt every object still alive (the comparison's cached environments
    and task data: hundreds of thousands of small objects) from the cyclic garbage collector. Each full
    collection during a unit otherwise walks them all again (0.3 s each; 0.6 s of a 29-s ViLBERT-tiny VQA unit,
    benchmarks/worker_gc.py)."""
    gc.collect()
    gc.freeze()


PROBE_REUSE_S = 60.0  # a worker's probe younger than this stands for the next unit too
_PROBES: dict[int, tuple[float, float]] = {}  # threads -> (time.monotonic() of the probe, its GFLOPS)


def machine_speed() -> dict[str, Any]:
    """Where a unit ran (host, CUDA device or cpu, its float kernels: `vlkit.runtime.kernels`) and how fast that machine multiplied matrices just after it (`vlkit.runtime.gemm_gflops` on
    the unit's threads, so a busy core shows): a unit's wall time is read beside it. The process's last probe on
    as many threads is reused while it is under `PROBE_REUSE_S` seconds old: a probe costs about 0.1 s, as much as a
    smoke test's whole unit, while the speed drifts over hours."""
    import socket

    import torch

    threads, now = torch.get_num_threads(), time.monotonic()
    if threads not in _PROBES or now - _PROBES[threads][0] >= PROBE_REUSE_S:
        _PROBES[threads] = (now, round(gemm_gflops(), 1))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"host": socket.gethostname(), "device": device, "threads": threads, "gemm_gflops": _PROBES[threads][1],
            "kernels": kernels()}


def run_job(plan_path: str | Path, key: str) -> dict[str, Any]:
    """Run unit ``key`` of the comparison planned in ``plan_path`` here; see the module docstring."""
    import torch

    work = work_of(plan_path)
    comparison = work.comparison
    torch.set_num_threads(unit_threads(comparison.cfg))  # a spawned worker would otherwise take every core
    freeze_held_objects()
    unit = comparison.unit_of(key)
    config = comparison.unit_config(unit)
    unit_hash = config_hash(config)
    folder = UnitFolder(comparison.unit_dir(unit), key)
    main = _rank() == 0
    attempt = folder.start(unit_hash, config, latest_session(comparison.output_dir)) if main else 0
    beating = every(heartbeat_s(comparison.compare), folder.heartbeat.touch) if main else contextlib.nullcontext()
    with beating, _captured(folder.directory / (LOG_FILE if main else f"unit.rank{_rank()}.log")) as log:
        print(f"--- {key}: attempt {attempt}, pid {os.getpid()}, {torch.get_num_threads()} torch thread(s)", file=log,
              flush=True)
        try:
            result = work.run(unit)
        except Exception as err:  # noqa: BLE001 - a failed unit is recorded, the comparison goes on
            trace = traceback.format_exc()
            print(trace, file=log, flush=True)
            if main:
                folder.fail(unit_hash, config, attempt, err, trace)
            return {"unit": key, "state": "failed", "error": f"{type(err).__name__}: {err}"}
    if main:
        result["machine"] = machine_speed()
        if watched_exited():  # its session was killed meanwhile: the attempt died with it, the next session reruns it
            os._exit(1)
        folder.finish(unit_hash, config, attempt, result)
    return {"unit": key, "state": "finished"}


if __name__ == "__main__":  # one rank of a multi-process unit (accelerate launch ... -m vlkit.compare.worker PLAN KEY)
    outcome = run_job(sys.argv[1], sys.argv[2])
    from vlkit.runtime import shutdown

    shutdown(barrier=True)
    sys.exit(0 if outcome["state"] == "finished" else 3)
