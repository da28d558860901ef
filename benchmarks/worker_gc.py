"""What Python's cyclic garbage collector costs a comparison worker, with and without freezing what the worker
holds before each unit (`vlkit.compare.worker`, ``gc.freeze``).

A worker keeps its environments and task data (hundreds of thousands of small objects) for every unit it runs;
each full collection during a unit walks them all. For each setting, one fresh process builds the default
comparison, runs a warm-up unit (data building), then ``--units`` consecutive fine-tunings of one task
(scratch variant, seeds 1, 2, ...), timing every collection with ``gc.callbacks``.

    python benchmarks/worker_gc.py --task refexp --units 4
    python benchmarks/worker_gc.py --task vqa --units 3 --cache-dir CACHE

Prints a table, writes benchmarks/results/worker_gc_<task>.json.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

from child import report, run_child

RESULTS = Path(__file__).resolve().parent / "results"


def child(task: str, units: int, freeze: bool, cache_dir: str | None) -> dict:
    """Run in a fresh process: the per-unit wall and collector seconds of ``units`` consecutive units."""
    import tempfile

    import torch

    torch.set_num_threads(1)
    from vlkit.cli import compose
    from vlkit.compare import Comparison, UnitWork, resolve_config
    from vlkit.compare.units import Unit
    from vlkit.compare.worker import freeze_held_objects

    spent, started = [0.0], [0.0]

    def timer(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]

    overrides = ["progress=false", *([f"cache_dir={cache_dir}"] if cache_dir else [])]
    work = UnitWork(Comparison(resolve_config(compose("compare", overrides)), Path(tempfile.mkdtemp()), progress=False))
    work.run(Unit(0, 0, "scratch", task))  # warm-up: the task's data, built once per process
    gc.callbacks.append(timer)
    rows = []
    for seed in range(1, units + 1):
        spent[0], start = 0.0, time.perf_counter()
        if freeze:
            freeze_held_objects()
        work.run(Unit(0, seed, "scratch", task))
        rows.append({"wall_s": time.perf_counter() - start, "gc_s": spent[0]})
    return {"freeze": freeze, "units": rows, "tracked_objects": len(gc.get_objects())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="refexp", help="a task of the default comparison")
    parser.add_argument("--units", type=int, default=4, help="consecutive units after the warm-up")
    parser.add_argument("--cache-dir", default=None, help="feature cache (default: VLKIT_CACHE's)")
    parser.add_argument("--child", choices=["freeze", "plain"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        report(child(args.task, args.units, args.child == "freeze", args.cache_dir))
        return
    sides = {}
    for side in ("plain", "freeze"):
        command = [sys.executable, __file__, "--child", side, "--task", args.task, "--units", str(args.units),
                   *(["--cache-dir", args.cache_dir] if args.cache_dir else [])]
        sides[side] = run_child(command, f"worker_gc {side}", env={**os.environ, "OMP_NUM_THREADS": "1"})
    print(f"{args.task}, {args.units} consecutive units after a warm-up, 1 thread, one process per setting")
    print("| setting | median unit s | median collector s per unit | objects the collector walks after |")
    print("|---|---|---|---|")
    for side, r in sides.items():
        print(f"| {side} | {statistics.median(u['wall_s'] for u in r['units']):.2f} | "
              f"{statistics.median(u['gc_s'] for u in r['units']):.2f} | {r['tracked_objects']:,} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"worker_gc_{args.task}.json").write_text(json.dumps(
        {"task": args.task, "sides": sides, "load_average": os.getloadavg()[0]}, indent=2))


if __name__ == "__main__":
    main()
