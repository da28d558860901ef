"""Whether a comparison's records are bit-identical between runs and between CPU kernels: one comparison run twice
with this machine's kernels and once with torch's kernels for another instruction set (``ATEN_CPU_CAPABILITY``,
e.g. AVX2 kernels on an AVX-512 CPU), each on a cold feature cache with the same thread count. Prints, for each
pair, how many per-seed metric values agree bit for bit and the largest difference; writes
benchmarks/results/kernel_identity.json (one entry per command).

    python benchmarks/kernel_identity.py                                   # compare=smoke, AVX2 as the other kernels
    python benchmarks/kernel_identity.py compare.budget.pretrain_steps=200  # overrides of the comparison
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from vlkit.compare.statistics import COSTS, metric_columns
from vlkit.io import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results" / "kernel_identity.json"


def run(folder: Path, capability: str | None, extra: list[str]) -> dict:
    """``vlkit compare`` into ``folder`` (a cold cache of its own) under ``capability``; its records and kernels."""
    env = {**os.environ, **({"ATEN_CPU_CAPABILITY": capability} if capability else {})}
    subprocess.run([sys.executable, "-m", "vlkit.cli", "compare", *extra, f"output_dir={folder / 'out'}",
                    f"cache_dir={folder / 'cache'}", "progress=false"], check=True, env=env, stdout=subprocess.DEVNULL)
    result = json.loads((folder / "out" / "results.json").read_text())
    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    return {"records": result["records"], "kernels": manifest["machine"]["kernels"]}


def agreement(a: list[dict], b: list[dict]) -> dict:
    """Per-seed metric values of two runs of one comparison: how many are equal bit for bit, and the largest
    absolute difference (points)."""
    key = lambda r: (r["run"], r["variant"], r["seed"])  # noqa: E731
    theirs = {key(r): r for r in b}
    metrics = [m for m in metric_columns(a) if m not in COSTS]
    pairs = [(r[m], theirs[key(r)].get(m)) for r in a for m in metrics if isinstance(r.get(m), float)]
    diffs = [abs(x - y) * 100 for x, y in pairs if y is not None]
    return {"values": len(pairs), "identical": sum(x == y for x, y in pairs), "max_abs_diff_points": max(diffs, default=0.0),
            "metrics": metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capability", default="avx2", help="the other kernels (ATEN_CPU_CAPABILITY): avx2, default")
    parser.add_argument("extra", nargs="*", help="overrides of the comparison (default: compare=smoke)")
    args = parser.parse_args()
    extra = args.extra if any(e.startswith("compare=") for e in args.extra) else ["compare=smoke", *args.extra]
    with tempfile.TemporaryDirectory(prefix="vlkit-kernels-") as tmp:
        first, again, other = (run(Path(tmp) / name, cap, extra) for name, cap in
                               (("first", None), ("again", None), ("other", args.capability)))
    out = {"command": " ".join(["vlkit compare", *extra]), "kernels": {"this": first["kernels"], "other": other["kernels"]},
           "same_kernels": agreement(first["records"], again["records"]),
           "other_kernels": agreement(first["records"], other["records"])}
    for name in ("same_kernels", "other_kernels"):
        row = out[name]
        print(f"{name}: {row['identical']}/{row['values']} per-seed metric values identical, largest difference "
              f"{row['max_abs_diff_points']:.2f} points")
    print(f"kernels: this {out['kernels']['this']}; other {out['kernels']['other']}")
    runs = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    atomic_write_text(RESULTS, json.dumps({**runs, out["command"]: out}, indent=2) + "\n")  # one entry per command
    print(f"written: {RESULTS.relative_to(Path.cwd()) if RESULTS.is_relative_to(Path.cwd()) else RESULTS}")


if __name__ == "__main__":
    main()
