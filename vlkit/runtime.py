"""What every layer of vlkit may use about its process: how many torch threads it runs (`set_threads`), whether
its CPU runs bf16 natively (`native_cpu_bf16`), which float kernels it computes with (`kernels`), how fast it
multiplies matrices (`gemm_gflops`), how it ends its
process group (`shutdown`), and how it stops.

How a vlkit process stops: SIGTERM (what SLURM and ``kill`` send) and SIGINT (Ctrl-C) become an
`Interrupted` exception in the main thread, so ``finally`` blocks and context managers run (a feature
writer keeps its complete shards, a checkpoint being saved is either whole or absent), child processes
are stopped, and the console exits with ``128 + signal number`` (143 for SIGTERM, 130 for SIGINT).

    with interrupt_on_signals():
        run()  # raises Interrupted on SIGTERM / SIGINT

A second signal during the clean-up ends the process at once (the default action of that signal).
`stop_processes` ends child processes (``multiprocessing.Process``-like objects): SIGTERM, a grace
period, then SIGKILL, so that no worker outlives its parent.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from typing import Any, Iterable, Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """The process received ``signum`` (SIGTERM or SIGINT); ``exit_code`` is ``128 + signum``."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.signal_name = signal.Signals(self.signum).name
        self.exit_code = 128 + self.signum
        super().__init__(f"interrupted by {self.signal_name}")


@contextlib.contextmanager
def interrupt_on_signals(signals: Iterable[int] = SIGNALS) -> Iterator[None]:
    """Within the block, the first of ``signals`` raises `Interrupted` in the main thread, a second one takes
    that signal's default action; the previous handlers come back afterwards. Outside the main thread
    (where Python cannot install handlers) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if received:  # a second signal while cleaning up: stop now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        received.append(signum)
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def stop_processes(processes: Iterable[Any], grace: float = 10.0) -> None:
    """SIGTERM every live process of ``processes``, wait up to ``grace`` seconds for them all, then SIGKILL
    those still running (objects with ``is_alive``, ``terminate``, ``kill`` and ``join``)."""
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            p.kill()
            p.join()


@contextlib.contextmanager
def every(interval: float, action: Any) -> Iterator[None]:
    """Within the block, call ``action()`` now and then every ``interval`` seconds from a daemon thread (a heartbeat:
    a process that is killed simply stops calling it); the block's end stops the calls."""
    stopped = threading.Event()

    def loop() -> None:
        while not stopped.wait(interval):
            action()

    action()
    thread = threading.Thread(target=loop, daemon=True, name="vlkit-every")
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        thread.join()


def process_started(pid: int | None = None) -> float:
    """When process ``pid`` (default: this one) started (seconds since the epoch): a command's span includes the
    interpreter's start, and a pid reused by another process shows another start (`vlkit.locks`). On Linux from
    ``/proc`` to the clock tick (psutil adds the boot time rounded to whole seconds: up to 1 s off); elsewhere
    psutil's. `ProcessLookupError` when no process ``pid`` exists."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{'self' if pid is None else int(pid)}/stat") as f:  # field 22, starttime: ticks after boot
            since_boot = int(f.read().rsplit(")", 1)[1].split()[19]) / ticks
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - since_boot)
    except FileNotFoundError:
        if pid is not None and os.path.isdir("/proc/self"):
            raise ProcessLookupError(f"no process {pid}") from None
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        raise ProcessLookupError(f"no process {pid}") from None


def pid_alive(pid: Any) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user counts); a pid that is no number does
    not."""
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


_WATCHED: dict[int, int | None] = {}  # pid given to exit_with -> its pidfd (None where pidfd_open is missing)


def exit_with(pid: int) -> None:
    """End this process as soon as process ``pid`` of this host exits: a SIGKILLed `vlkit compare` leaves no
    worker behind (its units would otherwise run on beside the session that resumes it). On Linux a pidfd wakes
    the watcher the moment ``pid`` exits; elsewhere it looks every half second."""
    if pid in _WATCHED:
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        fd = None
    _WATCHED[pid] = fd

    def watch() -> None:
        if fd is not None:
            select.select([fd], [], [])
        while fd is None and pid_alive(pid):
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="vlkit-parent-watch").start()


def watched_exited() -> bool:
    """Whether a process given to `exit_with` has exited, though its watcher may not have ended this one yet: a
    worker asks before it records a unit as finished, so a unit never finishes after its session was killed."""
    return any(not pid_alive(pid) if fd is None else bool(select.select([fd], [], [], 0)[0])
               for pid, fd in _WATCHED.items())


def set_threads(threads: int | None, preset: str | None = None) -> int:
    """A command's ``threads=``: the given count, else 1 for ``tiny`` presets (a tiny model's ops are too small
    to share: two threads on a busy 2-core machine ran 10x slower than one) and torch's default otherwise."""
    import torch

    if threads is None and preset == "tiny":
        threads = 1
    if threads is not None:
        if int(threads) < 1:
            raise ValueError(f"threads={threads}: use a positive number of torch threads (or null)")
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


def native_cpu_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512-BF16 or AMX). Without, torch's CPU bf16 matmul runs a
    reference kernel: under 1 GFLOPS against about 80 in fp32 at a base model's shapes on a 2-core AVX2 machine.
    True where torch cannot tell (its probes are private)."""
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(probe() for probe in probes if probe is not None) or all(probe is None for probe in probes)


GEMM_N = 1024  # the matrix size of the machine-speed probe (`gemm_gflops`): 0.1 s on one thread of this project's CPU
GEMM_PROBE = f"fp32 {GEMM_N}² GEMM"  # how reports name that probe


def gemm_gflops(n: int = GEMM_N, dtype: Any = None, repeats: int = 3) -> float:
    """The rate of an ``n`` x ``n`` matrix multiply (``dtype``, default fp32) on this process's torch threads, in
    GFLOPS: the best of ``repeats`` after an untimed one. A machine's speed drifts (1.2x within hours on a shared
    2-core VM), so a wall time is read beside this figure; a comparison's units and its dry run record it."""
    import torch

    a = torch.randn(n, n, dtype=dtype or torch.float32)
    a @ a
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


def kernels() -> str:
    """The float kernels this process computes with: torch's build and the instruction set its CPU kernels were
    chosen for (``ATEN_CPU_CAPABILITY`` can lower it), and the GPU where one is visible, e.g. ``torch 2.14.1+cu130
    (git 1a2b3c4d5e6f), CPU AVX512``. Records are bit-identical between machines whose kernels read the same; elsewhere
    they differ within the seeds' noise (docs/compare.md, "Bit-identical records")."""
    import torch

    label = f"torch {torch.__version__} (git {torch.version.git_version[:12]}), CPU {torch.backends.cpu.get_cpu_capability()}"
    return f"{label}, GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else label


def free_port() -> int:
    """A TCP port of the loopback interface that nothing listens on now (a process group's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shutdown(barrier: bool = True) -> None:
    """End the process group (after a barrier: every rank done) while the interpreter is still alive;
    ``barrier=False`` on an error path, where the other ranks may never reach one.

    A process that exits with a gloo process group alive can abort (``terminate called without an active
    exception``, exit code -6): the group's C++ threads are torn down during interpreter finalisation
    while a peer's connection closes. Every entry point that may run under ``accelerate launch`` /
    ``torchrun`` calls this before returning (the ``vlkit`` console script does). The model a rank trained (a
    DDP wrapper holds the group) must be freed first: a group still referenced is only destroyed at exit, and
    aborted there about once in 25 runs on a loaded machine."""
    import gc

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()  # a DDP model left in a reference cycle keeps the group's threads alive past its destruction
    try:
        if barrier:
            dist.barrier()
    finally:
        dist.destroy_process_group()


__all__ = ["SIGNALS", "Interrupted", "exit_with", "interrupt_on_signals", "pid_alive", "stop_processes", "set_threads",
           "shutdown", "watched_exited"]
