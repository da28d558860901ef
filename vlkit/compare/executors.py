"""Where the units of a comparison run: ``compare.executor=local | slurm | ray`` or a plugin's (`vlkit.EXECUTORS`, a
registry a plugin joins with `vlkit.register_executor`): a subclass of `vlkit.compare.executor_base.Executor`, its
contract as code, that declares its own ``compare.<name>`` block, dry-run line and resume-safe keys (the settings, the
dry run and the resume check derive theirs from the registry).

An executor starts a unit (`submit`) and reports the units that ended (`wait`) as outcomes: ``finished``,
``failed`` (the unit raised: deterministic, never retried) or ``died`` (its process or node was lost: an
OOM kill, a pre-emption, a lost node; retried up to ``compare.retries`` times). Every executor runs the
same `vlkit.compare.worker.run_job`, so records are identical across executors.
`vlkit.compare.scheduler.drive` is the one scheduler over them: units start when the units they depend on
finished, at most ``slots`` at a time; the dependents of a failed unit are skipped; everything else goes on.
"""
from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vlkit.compare.config import unit_threads
from vlkit.compare.executor_base import Executor, blocks
from vlkit.compare.units import UnitFolder
from vlkit.compare.worker import run_job
from vlkit.extras import require
from vlkit.registry import register_executor
from vlkit.runtime import exit_with


class ExecutorSettings:
    """What every executor is told: workers and threads per unit, the GPUs a unit takes, and each executor's
    ``compare.<name>`` block (`block`)."""

    def __init__(self, cfg: dict[str, Any]):
        compare = cfg["compare"]
        self.workers = int(cfg.get("workers") or min(2, os.cpu_count() or 1))
        self.threads = unit_threads(cfg)
        self.gpus_per_unit = int(compare.get("gpus_per_unit") or 0)
        self.blocks = blocks(compare)

    def block(self, name: str) -> dict[str, Any]:
        """Executor ``name``'s ``compare.<name>`` block, defaults filled in."""
        return self.blocks[name]


def _pool_worker(connection: Any, plan_path: str, env: dict[str, str], launch: list[str] | None) -> None:
    """A local worker process: runs the units it is sent, one at a time, until the pipe closes."""
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what a Ctrl-C stops
    exit_with(os.getppid())
    while True:
        try:
            key = connection.recv()
        except (EOFError, OSError):
            return
        if launch is None:
            outcome = run_job(plan_path, key)
        else:  # a unit on several GPUs: one process per GPU through Accelerate
            code = subprocess.call([*launch, plan_path, key], env=os.environ.copy())
            outcome = outcome_on_disk(plan_path, key, f"accelerate launch exited with {code}")
        connection.send(outcome)


def outcome_on_disk(plan_path: str, key: str, otherwise: str) -> dict[str, Any]:
    """The outcome a unit recorded in its folder (a unit whose state stayed ``running`` died)."""
    state = UnitFolder(Path(plan_path).parent / "runs" / key, key).read() or {}
    if state.get("state") in ("finished", "failed"):
        return {"unit": key, "state": state["state"], "error": state.get("error")}
    return {"unit": key, "state": "died", "error": otherwise}


def unguarded_script() -> tuple[str, int] | None:
    """(file, line) of the script whose top level runs this call outside ``if __name__ == "__main__":``, else None.
    A spawned worker starts by importing the script that started the comparison (``__main__``) again: a call at its
    top level would run again in every worker, each starting a comparison of its own."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame = sys._getframe()
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if not path or frame is None:  # an interactive session, or a call made after the script's top level ran
        return None
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    line = frame.f_lineno
    guarded = any(isinstance(node, ast.If) and _is_main_test(node.test) and node.lineno <= line <= node.end_lineno
                  for node in tree.body)
    return None if guarded else (path, line)


def _is_main_test(test: ast.expr) -> bool:
    """Whether ``test`` is ``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = {ast.dump(test.left), ast.dump(test.comparators[0])}
    return sides == {ast.dump(ast.Name("__name__", ast.Load())), ast.dump(ast.Constant("__main__"))}


def accelerate_launch(processes: int, devices: str) -> list[str]:
    """The command that runs one unit as ``processes`` Accelerate processes on ``devices``."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--gpu_ids", devices, "--main_process_port", "0", "-m", "vlkit.compare.worker"]


def visible_gpus() -> list[str]:
    """The GPUs this process may use (``CUDA_VISIBLE_DEVICES`` order), without initialising CUDA here."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


@register_executor("local")
class LocalExecutor(Executor):
    """Long-lived worker processes on this machine, each with its own devices: with K visible GPUs and
    ``gpus_per_unit=g``, K // g units at once, each on its own ``CUDA_VISIBLE_DEVICES`` (g > 1: an Accelerate
    launch over them); without GPUs, ``workers`` processes of ``threads`` torch threads. A worker that dies
    takes only its unit with it (outcome ``died``) and is replaced."""

    @classmethod
    def check(cls, settings: ExecutorSettings) -> None:
        g = settings.gpus_per_unit
        if g > 0 and len(visible_gpus()) < g:
            raise ValueError(f"compare.gpus_per_unit={g}, but this machine shows {len(visible_gpus())} GPU(s)")
        script = unguarded_script()
        if script is not None:
            raise RuntimeError(
                f"compare: {script[0]} starts the comparison at its top level (line {script[1]}), outside "
                "`if __name__ == \"__main__\":`. Its worker processes start by importing that script again, so each "
                "would start the comparison anew: put the call under the idiom,\n\n    if __name__ == \"__main__\":\n"
                "        vlkit.compare(...)\n\nand run the script again (nothing was written)")

    @classmethod
    def planned_slots(cls, settings: ExecutorSettings) -> int:
        g = settings.gpus_per_unit
        return max(1, (len(visible_gpus()) // g) if g else settings.workers)

    def __init__(self, plan_path: Path, settings: ExecutorSettings):
        import multiprocessing

        super().__init__(plan_path, settings)
        self.context = multiprocessing.get_context("spawn")
        g = settings.gpus_per_unit
        self.check(settings)
        if g > 0:
            gpus = visible_gpus()
            groups = [",".join(gpus[i:i + g]) for i in range(0, len(gpus) - g + 1, g)]
            self.envs = [{"CUDA_VISIBLE_DEVICES": group} for group in groups]
        else:
            self.envs = [{} for _ in range(settings.workers)]
        self.launch = accelerate_launch(g, ",".join(str(i) for i in range(g))) if g > 1 else None
        self.slots = len(self.envs)
        self.workers: list[Any] = [None] * self.slots  # (process, connection) per slot
        self.busy: dict[int, str] = {}

    def _worker(self, slot: int) -> tuple[Any, Any]:
        current = self.workers[slot]
        if current is None or not current[0].is_alive():
            ours, theirs = self.context.Pipe()
            process = self.context.Process(target=_pool_worker, args=(theirs, self.plan_path, self.envs[slot], self.launch),
                                           daemon=True, name=f"vlkit-compare-{slot}")
            process.start()
            theirs.close()
            self.workers[slot] = current = (process, ours)
        return current

    def submit(self, key: str) -> None:
        slot = next(i for i in range(self.slots) if i not in self.busy)
        self._worker(slot)[1].send(key)
        self.busy[slot] = key

    def wait(self, timeout: float) -> list[tuple[str, dict[str, Any]]]:
        from multiprocessing.connection import wait

        handles = {}
        for slot in self.busy:
            process, connection = self.workers[slot]
            handles[connection] = slot
            handles[process.sentinel] = slot
        out = []
        for handle in wait(list(handles), timeout):
            slot = handles[handle]
            if slot not in self.busy:
                continue
            key = self.busy.pop(slot)
            process, connection = self.workers[slot]
            try:
                out.append((key, connection.recv()))
            except (EOFError, OSError):
                process.join(5)
                out.append((key, {"unit": key, "state": "died",
                                  "error": f"worker process died (exit code {process.exitcode})"}))
                self.workers[slot] = None
        return out

    def close(self) -> None:
        """Idle workers end when their pipe closes; a worker still in a unit (a stop) is terminated."""
        for slot, worker in enumerate(self.workers):
            if worker is not None:
                worker[1].close()
                if slot in self.busy:
                    worker[0].terminate()
        for worker in self.workers:
            if worker is not None:
                worker[0].join(30)
                if worker[0].is_alive():
                    worker[0].kill()


class UnitJob:
    """A unit as a submitit job: checkpointable, so a pre-empted or timed-out job is requeued and the unit
    resumes from its last checkpoint; in a job of several tasks (nodes x GPUs) every task is one rank of an
    Accelerate process group set up from SLURM's variables."""

    def __call__(self, plan_path: str, key: str) -> dict[str, Any]:
        import submitit

        if submitit.JobEnvironment().num_tasks > 1:
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        return run_job(plan_path, key)

    def checkpoint(self, plan_path: str, key: str) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(UnitJob(), plan_path, key)


SLURM_KEYS = {  # compare.slurm.<key> -> submitit parameter
    "partition": "slurm_partition", "nodes": "nodes", "gpus_per_node": "gpus_per_node",
    "cpus_per_task": "cpus_per_task", "mem_gb": "mem_gb", "timeout_min": "timeout_min",
    "account": "slurm_account", "qos": "slurm_qos", "constraint": "slurm_constraint",
    "array_parallelism": "slurm_array_parallelism",
}


def slurm_parameters(settings: ExecutorSettings) -> dict[str, Any]:
    """submitit's parameters of one unit's job from ``compare.slurm.*``: one task per GPU on every node
    (one task when the unit takes no GPU), the rest as given; unknown keys are refused."""
    block = settings.block("slurm")
    given = {k: v for k, v in block.items() if v is not None and k in SLURM_KEYS}
    params = {SLURM_KEYS[k]: v for k, v in given.items()}
    gpus = int(given.get("gpus_per_node", settings.gpus_per_unit) or 0)
    params["gpus_per_node"] = gpus
    params["tasks_per_node"] = max(1, gpus)
    params.setdefault("cpus_per_task", settings.threads)
    params.setdefault("timeout_min", 60 * 24)
    for key, value in (block.get("extra") or {}).items():  # any other submitit parameter, by its own name
        params[key] = value
    return params


@register_executor("slurm")
class SlurmExecutor(Executor):
    """One submitit job per unit (``compare.slurm.*``); fine-tunings are submitted when their pre-training
    finished. ``compare.slurm.cluster=local`` runs the same jobs as local processes (submitit's local
    executor), ``debug`` in this process; unset: SLURM when ``sbatch`` is there."""

    config = {"cluster": None, "folder": None, **dict.fromkeys(SLURM_KEYS), "extra": {}}
    notes = {
        "cluster": "null: SLURM (sbatch); local: the same jobs as local processes; debug: in this process",
        "folder": "submitit's logs (default: <output_dir>/slurm/%j)",
        "nodes": "nodes per unit (a multi-node unit rendezvous through Accelerate inside the job)",
        "gpus_per_node": "default: compare.gpus_per_unit (one task per GPU)", "cpus_per_task": "default: threads",
        "timeout_min": "default: 1440; a job that reaches it is requeued and resumes from its checkpoint",
        "array_parallelism": "jobs at once (default 256 on SLURM, workers with cluster=local)",
        "extra": "any other submitit parameter by its own name (slurm_exclude, slurm_mail_user, ...)"}

    @classmethod
    def check(cls, settings: ExecutorSettings) -> None:
        require("submitit", "compare.executor=slurm")
        slurm_parameters(settings)

    @classmethod
    def planned_slots(cls, settings: ExecutorSettings) -> int:
        return int(settings.block("slurm").get("array_parallelism") or 256)

    @classmethod
    def nodes(cls, block: dict[str, Any]) -> int:
        return int(block.get("nodes") or 1)

    def __init__(self, plan_path: Path, settings: ExecutorSettings):
        submitit = require("submitit", "compare.executor=slurm")
        super().__init__(plan_path, settings)
        folder = self.options.get("folder") or str(Path(plan_path).parent / "slurm" / "%j")
        self.executor = submitit.AutoExecutor(folder=folder, cluster=self.options.get("cluster"))
        params = slurm_parameters(settings)
        if self.executor.cluster != "slurm":  # the local and debug executors take the generic parameters only
            params = {k: v for k, v in params.items() if not k.startswith("slurm_")}
        self.executor.update_parameters(name="vlkit-compare", **params)
        self.slots = int(self.options.get("array_parallelism") or (settings.workers if self.executor.cluster != "slurm"
                                                                      else 256))
        self.jobs: dict[Any, str] = {}

    def submit(self, key: str) -> None:
        self.jobs[self.executor.submit(UnitJob(), self.plan_path, key)] = key

    def wait(self, timeout: float) -> list[tuple[str, dict[str, Any]]]:
        from submitit.core.utils import UncompletedJobError

        deadline = time.monotonic() + timeout
        while True:
            done = [job for job in self.jobs if job.done()]
            if done or time.monotonic() >= deadline:
                break
            time.sleep(min(0.2, timeout))
        out = []
        for job in done:
            key = self.jobs.pop(job)
            try:
                out.append((key, job.result()))
            except UncompletedJobError as err:  # killed, timed out without requeue, node lost
                out.append((key, {"unit": key, "state": "died", "error": f"job {job.job_id}: {_first_line(err)}"}))
            except Exception as err:  # noqa: BLE001 - the job's own code raised outside the unit
                out.append((key, outcome_on_disk(self.plan_path, key, f"job {job.job_id}: {_first_line(err)}")
                            | {"state": "failed"}))
        return out

    def close(self) -> None:
        for job in list(self.jobs):
            job.cancel(check=False)


@register_executor("ray")
class RayExecutor(Executor):
    """Units as Ray tasks (``num_gpus`` = ``compare.gpus_per_unit``, ``num_cpus`` = ``compare.ray.num_cpus``
    or ``threads``) on the cluster at ``compare.ray.address``, or a local one when unset; at most
    ``compare.ray.max_concurrent`` (default: ``workers``) at once. The output folder must be on storage
    every node sees."""

    config = {"address": None, "num_cpus": None, "max_concurrent": None}
    notes = {"address": "an existing cluster (auto, ray://host:10001, host:6379); null: a local one",
             "num_cpus": "per unit (default: threads)", "max_concurrent": "units at once (default: workers)"}

    @classmethod
    def check(cls, settings: ExecutorSettings) -> None:
        require("ray", "compare.executor=ray")

    @classmethod
    def planned_slots(cls, settings: ExecutorSettings) -> int:
        return int(settings.block("ray").get("max_concurrent") or settings.workers)

    def __init__(self, plan_path: Path, settings: ExecutorSettings):
        ray = require("ray", "compare.executor=ray")
        super().__init__(plan_path, settings)
        self.ray = ray
        address = self.options.get("address")
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     **({} if address else {"num_cpus": settings.workers * settings.threads}))
        self.driver = None if address else os.getpid()  # a local cluster's units end with this process
        self.remote = ray.remote(num_cpus=float(self.options.get("num_cpus") or settings.threads),
                                 num_gpus=settings.gpus_per_unit, max_retries=0)(_ray_unit)
        self.slots = int(self.options.get("max_concurrent") or settings.workers)
        self.refs: dict[Any, str] = {}

    def submit(self, key: str) -> None:
        self.refs[self.remote.remote(self.plan_path, key, self.driver)] = key

    def wait(self, timeout: float) -> list[tuple[str, dict[str, Any]]]:
        ready, _ = self.ray.wait(list(self.refs), num_returns=1, timeout=timeout)
        out = []
        for ref in ready:
            key = self.refs.pop(ref)
            try:
                out.append((key, self.ray.get(ref)))
            except self.ray.exceptions.RayTaskError as err:  # raised outside the unit's own try
                out.append((key, {"unit": key, "state": "failed", "error": _first_line(err)}))
            except self.ray.exceptions.RayError as err:  # worker or node lost, out of memory
                out.append((key, {"unit": key, "state": "died", "error": _first_line(err)}))
        return out

    def close(self) -> None:
        for ref in self.refs:
            self.ray.cancel(ref, force=True)


def _ray_unit(plan_path: str, key: str, driver: int | None) -> dict[str, Any]:
    """A unit as a Ray task; on a local cluster its worker ends with the ``driver`` process (Ray's own workers
    outlive a SIGKILLed driver by seconds, long enough to finish a unit beside the session that resumes it)."""
    if driver is not None:
        exit_with(driver)
    return run_job(plan_path, key)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"
