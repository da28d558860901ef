"""Feature extraction spread over processes and nodes: each process extracts the images whose id hashes
to its rank (`vlkit.features.shards.shard_of`) into its own shard of a sharded store.

``vlkit extract-features processes=N ...`` starts N processes on this machine the way Accelerate's
launchers do (`accelerate.utils.PrepareForLaunch` under `torch.multiprocessing.start_processes`, the
rank in ``RANK`` / ``LOCAL_RANK``, the world in ``WORLD_SIZE``); under ``accelerate launch`` (one node
with N GPUs, or several nodes) the same command finds its rank in the environment. Either way each
process runs `extract_rank` through `accelerate.PartialState` (gloo on CPU, NCCL on GPUs, process
``i`` of a node on ``cuda:i``), then rank 0 builds the index once every shard is complete.

Each shard is written by `vlkit.features.detector.extract_features` (atomic per-batch commits), so a
killed process resumes on its own with ``resume=true`` (run the same command again, with the same number
of processes: the number is part of each shard's name). The features of an image do not depend on the
process that extracted it: the result equals a one-process run, id by id.

Progress: every process records its count in ``<out>/.progress/rank-<r>.json`` after each batch; rank 0
shows one bar over all processes (images/s of the whole run) and prints the total rate at the end.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from vlkit.features.shards import build_index, shard_name, shard_of
from vlkit.io import atomic_write_text
from vlkit.runtime import free_port, stop_processes

PROGRESS = ".progress"


class SharedProgress:
    """A progress bar over every process of an extraction: ``update(n)`` records this rank's count in
    ``<out>/.progress/rank-<r>.json``; on rank 0 the bar (tqdm: images/s) shows the sum over the ranks."""

    def __init__(self, out: str | os.PathLike, rank: int, world_size: int, total: int | None, enabled: bool = True,
                 desc: str | None = None):
        self.dir = Path(out) / PROGRESS
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size, self.count = rank, world_size, 0
        self.path = self.dir / f"rank-{rank:05d}.json"
        self.start = time.perf_counter()
        self.bar = None
        if rank == 0:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc or f"extract {Path(out).name} ({world_size} processes)",
                            unit="img", disable=not enabled)
        self._write(False)

    def _write(self, finished: bool) -> None:
        atomic_write_text(self.path, json.dumps({"done": self.count, "finished": finished}))

    def counts(self) -> list[dict[str, Any]]:
        """Each rank's ``{done, finished}`` (a rank that has not written yet: nothing done)."""
        out = []
        for rank in range(self.world_size):
            try:
                out.append(json.loads((self.dir / f"rank-{rank:05d}.json").read_text()))
            except (FileNotFoundError, json.JSONDecodeError):
                out.append({"done": 0, "finished": False})
        return out

    def _refresh(self) -> int:
        done = sum(c["done"] for c in self.counts())
        if self.bar is not None and done > self.bar.n:
            self.bar.update(done - self.bar.n)
        return done

    def update(self, n: int = 1) -> None:
        self.count += n
        self._write(False)
        if self.bar is not None:
            self._refresh()

    def close(self) -> None:
        self._write(True)

    def wait_all(self, poll: float = 0.5) -> dict[str, float]:
        """Rank 0: follow the other ranks until every one has finished; returns ``{images, seconds, images_per_s}``."""
        while not all(c["finished"] for c in self.counts()):
            self._refresh()
            time.sleep(poll)
        done = self._refresh()
        if self.bar is not None:
            self.bar.close()
        seconds = time.perf_counter() - self.start
        return {"images": done, "seconds": seconds, "images_per_s": done / seconds if seconds > 0 else 0.0}


def extract_rank(images: Iterable[tuple[str, Any]], out: str | os.PathLike, rank: int, world_size: int,
                 total: int | None = None, progress: bool = True, bar: SharedProgress | None = None,
                 **kwargs: Any) -> Path:
    """Extract the images of rank ``rank`` (those whose id hashes to it) into its shard of the sharded
    store ``out`` (a directory); ``kwargs`` go to `vlkit.features.detector.extract_features`. Returns the
    shard. ``bar``: the `SharedProgress` to count on (default: a new one)."""
    from vlkit.features.detector import extract_features

    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    out = Path(out)
    if out.is_file():
        raise FileExistsError(f"{out} is a file: extraction over {world_size} processes writes a sharded store, "
                              "a directory; name a new out=DIR")
    out.mkdir(parents=True, exist_ok=True)
    mine = ((str(i), image) for i, image in images if shard_of(str(i), world_size) == rank)  # lazy: images may stream
    bar = bar or SharedProgress(out, rank, world_size, total, enabled=progress)
    try:
        return extract_features(mine, out / shard_name(rank, world_size), progress=False, bar=bar, **kwargs)
    finally:
        bar.close()


def launch(function: Callable[..., Any], args: Sequence[Any], processes: int, cpu: bool) -> None:
    """Run ``function(*args)`` in ``processes`` new processes of this machine, with the environment
    ``accelerate launch`` gives its processes (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` /
    ``MASTER_PORT``; ``ACCELERATE_USE_CPU`` on CPU), so ``function`` takes the same path as under it."""
    from accelerate.utils import PrepareForLaunch, patch_environment
    from torch.multiprocessing import start_processes

    import torch

    # the parent's torch threads (the command's threads=) in every process: the same kernels, the same features
    env = dict(world_size=processes, nproc=processes, node_rank=0, master_addr="127.0.0.1",
               master_port=str(free_port()), accelerate_mixed_precision="no", omp_num_threads=torch.get_num_threads())
    if cpu:
        env.update(accelerate_use_cpu="yes", gloo_socket_ifname="lo")  # one machine: loopback (as accelerate's debug_launcher)
    with patch_environment(**env):
        context = start_processes(PrepareForLaunch(function, distributed_type="MULTI_CPU" if cpu else "MULTI_GPU"),
                                  args=tuple(args), nprocs=processes, join=False, start_method="spawn")
    try:
        while not context.join():
            pass
    except BaseException:  # a failed process, or this one interrupted: no process outlives the launch
        stop_processes(context.processes)
        raise


def distributed_extraction(images: Sequence[tuple[str, Any]], out: str | os.PathLike, device: str = "auto",
                           progress: bool = True, **kwargs: Any) -> Path:
    """This process's part of an extraction over every process of the run (rank and world from the
    environment, through `accelerate.PartialState`): its shard, then (rank 0, when all are done) the index."""
    import torch
    from accelerate import PartialState

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    state = PartialState(cpu=device == "cpu")
    if device == "cuda" and state.num_processes > 1:
        device = f"cuda:{state.local_process_index}"
    rank, world = state.process_index, state.num_processes
    Path(out).mkdir(parents=True, exist_ok=True)
    bar = SharedProgress(out, rank, world, len(images), enabled=progress)
    state.wait_for_everyone()  # every rank has reset its progress record (a killed run may have left them)
    extract_rank(images, out, rank, world, bar=bar, device=device, **kwargs)
    if rank == 0:
        stats = bar.wait_all()
        state.wait_for_everyone()
        build_index(out)
        shutil.rmtree(Path(out) / PROGRESS, ignore_errors=True)
        if progress:
            print(f"{out}: {stats['images']} images over {world} processes in {stats['seconds']:.1f} s, "
                  f"{stats['images_per_s']:.1f} images/s")
    else:
        state.wait_for_everyone()
    state.wait_for_everyone()
    return Path(out)


__all__ = ["SharedProgress", "distributed_extraction", "extract_rank", "launch"]
