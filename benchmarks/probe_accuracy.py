"""How well the dry run's probe predicts a unit's training time: each kind (model + mix, or model + task) of the
default comparison trains its full step budget in a fresh process, as a unit does; its mean step time (the
trainer's ``step_s``) is the truth, and the probe's estimate is the median over steps W+1 .. W+S of the same run
(a probe is the first W + S steps of its unit: same seed, data order and batch).

    python benchmarks/probe_accuracy.py                          # W in {1, 20}, S = 30, five kinds
    python benchmarks/probe_accuracy.py --kinds "uniter_tiny vqa" --warmups 0 1 5 20

One torch thread (a unit's default), one process at a time. Prints a table, writes
benchmarks/results/probe_accuracy.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

from child import report, run_child

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
KINDS = ("vilbert_tiny vilbert", "uniter_tiny uniter", "meter_tiny meter", "vilbert_tiny vqa", "uniter_tiny vqa")


def unit_step_times(kind: str, cache: str) -> list[float]:
    """Each step's seconds of the full budget of ``kind``'s first unit in the default comparison."""
    import torch

    from vlkit.cli import compose
    from vlkit.compare import Comparison, UnitWork, resolve_config
    from vlkit.compare.estimate import probe_kind, probe_precision, step_times
    from vlkit.train import pipeline

    torch.set_num_threads(1)
    cfg = resolve_config(compose("compare", ["compare=default", f"cache_dir={cache}", "progress=false"]))
    comparison = Comparison(cfg, Path(cache) / "out", progress=False)
    unit = next(u for u in comparison.all_units() if probe_kind(comparison, u) == kind)
    model = pipeline.build_run_model(comparison.environment(comparison.specs[unit.run]))
    return step_times(UnitWork(comparison), unit, model, comparison.unit_steps(unit), precision=probe_precision())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS))
    parser.add_argument("--warmups", nargs="+", type=int, default=[1, 20])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--cache", default=str(ROOT / "outputs" / "cache"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child: one kind, prints its step times
    args = parser.parse_args()
    if args.one:
        report(unit_step_times(args.one, args.cache))
        return
    rows = []
    for kind in args.kinds:
        times = run_child([sys.executable, __file__, "--one", kind, "--cache", args.cache], kind, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
        truth = sum(times) / len(times)
        row = {"kind": kind, "steps": len(times), "mean_step_s": truth, "step_s": times}
        for w in args.warmups:
            estimate = statistics.median(times[w:w + args.steps])
            row[f"probe_w{w}_s"], row[f"probe_w{w}_ratio"] = estimate, estimate / truth
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "step_s"}), flush=True)
    head = ["kind", "steps", "mean s/step"] + [f"probe W={w} (ratio)" for w in args.warmups]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        cells = [r["kind"], str(r["steps"]), f"{r['mean_step_s']:.4f}"]
        cells += [f"{r[f'probe_w{w}_s']:.4f} ({r[f'probe_w{w}_ratio']:.2f})" for w in args.warmups]
        print("| " + " | ".join(cells) + " |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "probe_accuracy.json").write_text(json.dumps(
        {"rows": rows, "probe_steps": args.steps, "threads": 1, "platform": platform.platform(),
         "load_average": os.getloadavg()[0]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
