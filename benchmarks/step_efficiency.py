"""How close the default comparison's tiny pre-training step comes to what this CPU can do, per family.

For each family's pre-training unit exactly as `vlkit compare` runs it (its model, objective mix, batch,
data and trainer, one process, ``--threads`` torch threads), one step is measured three ways:

- its FLOPs: forward + backward of every pass of the mix, counted by `torch.utils.flop_counter`
  (the FLOPs of ``1 + steps`` steps minus those of 1);
- its wall time, the same difference (data, optimizer, logging: everything a step costs);
- the time its FLOP-carrying kernels (matmuls, attention, ...) take when replayed alone at the same shapes
  and dtypes: what the step would cost if nothing but its arithmetic ran, at the GEMM rate these small
  shapes allow.

Reports the achieved GFLOPS, the fraction of the step spent in arithmetic at its shapes' own rate
(``kernel_fraction`` = replayed kernel time / step time) and the fraction of a 2048x2048 fp32 GEMM's rate
on the same threads, measured in the same run.

    python benchmarks/step_efficiency.py                                  # the default comparison, 1 thread
    python benchmarks/step_efficiency.py compare.trainer.common.batch_size=64 --tag batch64
    python benchmarks/step_efficiency.py trainer.adamw_impl=loop --tag loop   # any `vlkit compare` override

Prints a table, writes benchmarks/results/step_efficiency[_<tag>].json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from vlkit.runtime import gemm_gflops

RESULTS = Path(__file__).resolve().parent / "results"


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _spec(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), str(x.dtype))
    if isinstance(x, (list, tuple)):
        return tuple(_spec(v) for v in x)
    return x  # numbers, None, dtypes, devices: hashable, passed on as they are


class KernelRecorder(TorchDispatchMode):
    """Every call of an op that `torch.utils.flop_counter` counts, as (op, argument shapes / dtypes)."""

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()
        self.ops: dict[str, Any] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._overloadpacket in flop_registry:
            key = (str(func), _spec(args), _spec(sorted(kwargs.items())))
            self.calls[key] += 1
            self.ops[str(func)] = func
        return func(*args, **kwargs)


def _make(spec: Any) -> Any:
    if isinstance(spec, tuple) and len(spec) == 3 and spec[0] == "T":
        dtype = getattr(torch, spec[2].removeprefix("torch."))
        return torch.randn(spec[1]).to(dtype) if dtype.is_floating_point else torch.zeros(spec[1], dtype=dtype)
    if isinstance(spec, tuple):
        return tuple(_make(v) for v in spec)
    return spec


def replay_seconds(recorder: KernelRecorder, calls: Counter, repeats: int = 3) -> float:
    """Seconds the recorded kernels take alone: each distinct call timed on fresh tensors of its shapes
    (median of ``repeats`` after one warm-up), times how often the step made it."""
    total = 0.0
    with torch.no_grad():
        for (name, args, kwargs), count in calls.items():
            func, args = recorder.ops[name], list(_make(args))
            kwargs = {k: _make(v) for k, v in kwargs}
            func(*args, **kwargs)
            total += count * statistics.median(_seconds(lambda: func(*args, **kwargs)) for _ in range(repeats))
    return total


def measure_family(comparison: Any, index: int, steps: int) -> dict[str, Any]:
    """FLOPs, wall seconds and replayed kernel seconds of one pre-training step of run ``index``."""
    from vlkit.compare.config import objective_mix
    from vlkit.compare.units import Unit
    from vlkit.train import pipeline

    spec = comparison.specs[index]
    env = comparison.environment(spec)  # features extracted (or found) before anything is timed
    mix = objective_mix(spec)

    def fit(n: int, counter: FlopCounterMode | None = None, recorder: KernelRecorder | None = None) -> float:
        model = pipeline.build_run_model(env)
        trainer = {**comparison.unit_trainer(Unit(index, 0), n), "save_every": 0, "log_every": 1}
        with tempfile.TemporaryDirectory(prefix="vlkit-step-") as tmp:
            start = time.perf_counter()
            if counter is None:
                pipeline.pretrain_model(env, model, mix, trainer, Path(tmp), 0)
            else:
                with counter, recorder:
                    pipeline.pretrain_model(env, model, mix, trainer, Path(tmp), 0)
            return time.perf_counter() - start

    fit(1)  # warm-up: imports, caches
    wall = (min(fit(1 + steps) for _ in range(2)) - min(fit(1) for _ in range(2))) / steps
    counted = []
    for n in (1, 1 + steps):
        counter, recorder = FlopCounterMode(display=False), KernelRecorder()
        fit(n, counter, recorder)
        counted.append((counter.get_total_flops(), recorder))
    flops = (counted[1][0] - counted[0][0]) / steps
    calls = counted[1][1].calls - counted[0][1].calls
    kernels = replay_seconds(counted[1][1], calls) / steps
    batch = comparison.unit_trainer(Unit(index, 0))["batch_size"]
    return {"run": spec.name, "batch_size": batch, "flops_per_step": flops, "step_s": wall,
            "kernel_s": kernels, "gflops": flops / wall / 1e9, "kernel_gflops": flops / kernels / 1e9,
            "kernel_fraction": kernels / wall, "samples_per_s": batch / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="`vlkit compare` overrides (the default comparison's otherwise)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a compare worker uses 1)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps after the first")
    parser.add_argument("--tag", default="", help="suffix of the JSON file (a variant's name)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="feature cache (default: VLKIT_CACHE's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from vlkit.cli import compose
    from vlkit.compare import Comparison, resolve_config

    overrides = ["progress=false", *([f"cache_dir={args.cache_dir}"] if args.cache_dir else []), *args.overrides]
    cfg = resolve_config(compose("compare", overrides))
    comparison = Comparison(cfg, Path(tempfile.mkdtemp(prefix="vlkit-step-")), progress=False)
    peak = gemm_gflops(2048, repeats=5)
    rows = [measure_family(comparison, k, args.steps) for k in range(len(comparison.specs))]
    for r in rows:
        r["peak_fraction"] = r["gflops"] / peak
    print(f"fp32 2048x2048 GEMM, {args.threads} thread(s): {peak:.1f} GFLOPS")
    print("| run | batch | MFLOP/step | ms/step | GFLOPS | kernels alone GFLOPS | kernel fraction | of 2048² GEMM | samples/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['batch_size']} | {r['flops_per_step'] / 1e6:.0f} | {r['step_s'] * 1e3:.1f} | "
              f"{r['gflops']:.2f} | {r['kernel_gflops']:.2f} | {r['kernel_fraction']:.1%} | {r['peak_fraction']:.1%} | "
              f"{r['samples_per_s']:.0f} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "step_efficiency" + (f"_{args.tag}" if args.tag else "") + ".json"
    (RESULTS / name).write_text(json.dumps({
        "rows": rows, "gemm_2048_gflops": peak, "threads": args.threads, "steps": args.steps,
        "overrides": args.overrides, "torch": torch.__version__, "platform": platform.platform(),
        "cpus": os.cpu_count(), "load_average": os.getloadavg()[0]}, indent=2))


if __name__ == "__main__":
    main()
