"""Training samples/s of the default comparison's pre-training units, this checkout against an older
commit, measured side by side: each (side, family) runs in its own process, one at a time, alternating
sides, with the same thread count and a warm feature cache.

    python benchmarks/compare_speed.py --ref 20f1279            # the default comparison before issue 11
    python benchmarks/compare_speed.py --ref 20f1279 --repeats 2 --threads 1

A side runs its own `vlkit compare` default exactly as that commit defines it (its captions, objective
mixes, batch and step budget), so the figure is "the default comparison's train samples/s" of each
commit: ``len(examples seen) / wall time of the pre-training`` (dataset building and the first epoch's
feature loading included, as `vlkit compare` reports it). Prints a table, writes
benchmarks/results/compare_speed.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from child import run_child

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FAMILIES = ("vilbert", "uniter", "meter")

# run from another checkout, which may lack benchmarks/child.py: it prints the RESULT line itself
CHILD = r"""
import json, sys, tempfile, torch
from pathlib import Path
torch.set_num_threads(int(sys.argv[3]))
from vlkit.cli import compose
from vlkit.compare import resolve_config, Comparison
cfg = resolve_config(compose("compare", [f"cache_dir={sys.argv[2]}", "progress=false"]))
cfg["compare"]["zero_shot"] = False
cfg["compare"]["tasks"] = [t for t in cfg["compare"]["tasks"] if t != "retrieval"]
comparison = Comparison(cfg, Path(tempfile.mkdtemp()), progress=False)
names = [s.name for s in comparison.specs]
index = names.index(sys.argv[1])
comparison.environment(comparison.specs[index])  # features extracted (or found) before timing
try:  # the work of a unit in its own class (issue 45 on); before it, Comparison.pretrain_unit
    from vlkit.compare.unit_work import UnitWork
    pretrain = UnitWork(comparison).pretrain
except ImportError:
    pretrain = comparison.pretrain_unit
if hasattr(comparison, "all_units"):  # a unit object (issue 20 on); before it, (run index, seed)
    stats = pretrain(next(u for u in comparison.all_units() if u.is_pretrain and u.run == index and u.seed == 0))["stats"]
else:
    stats = pretrain(index, 0)["stats"]
print("RESULT " + json.dumps({"samples_per_s": stats["train_samples_per_s"], "wall_s": stats["pretrain_wall_s"],
                             "steps": cfg["compare"]["budget"]["pretrain_steps"],
                             "batch": cfg["compare"]["trainer"]["common"]["batch_size"]}))
"""


def checkout(ref: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref], check=True,
                   capture_output=True)
    return where


def measure(source: Path, family: str, cache: Path, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(source), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return run_child([sys.executable, "-c", CHILD, family, str(cache), str(threads)], f"{source} {family}",
                     cwd=source, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", required=True, help="the older commit (e.g. 20f1279)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-dir", type=Path, default=None, help="feature cache (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache_dir or Path(tmp) / "cache"
        old = checkout(args.ref, Path(tmp) / "ref")
        try:
            sides = {args.ref: old, "HEAD": ROOT}
            rows = []
            for family in FAMILIES:
                for side, source in sides.items():  # warm-up: extraction, imports, disk caches
                    measure(source, family, cache, args.threads)
                samples: dict[str, list[float]] = {side: [] for side in sides}
                for _ in range(args.repeats):
                    for side, source in sides.items():
                        samples[side].append(measure(source, family, cache, args.threads)["samples_per_s"])
                best = {side: max(v) for side, v in samples.items()}
                rows.append({"family": family, "threads": args.threads, "ref": args.ref,
                             "ref_samples_per_s": best[args.ref], "head_samples_per_s": best["HEAD"],
                             "speedup": best["HEAD"] / best[args.ref], "samples": samples})
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], capture_output=True)
    print(f"| family | {args.ref} samples/s | HEAD samples/s | HEAD / {args.ref} |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['family']} | {r['ref_samples_per_s']:.0f} | {r['head_samples_per_s']:.0f} | {r['speedup']:.2f}x |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compare_speed.json").write_text(json.dumps({"rows": rows, "platform": platform.platform(),
                                                             "cpus": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
