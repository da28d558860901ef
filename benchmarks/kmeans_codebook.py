"""MIM's k-means codebook (``meter_mim_discrete``): SciPy's k-means++ seeding against vlkit's, side by side.

The codebook is fitted once per pre-training unit on the first 256 training images' patches (16 per
METER-tiny image of 64 px: 4,096 patches of 768 values, 256 codes). SciPy's ``kmeans2(minit="++")``
recomputes the distances of every centre chosen so far at each step (k^2 x n x d); vlkit seeds with the
same k-means++ rule, each centre's distances computed once (k x n x d), then runs the same ``kmeans2``
iterations (``minit="matrix"``). Reports each seeding's time, its arithmetic rate against a 2048² fp64
GEMM measured in the same run (the distances are fp64), and the k-means objective of both fits.

    python benchmarks/kmeans_codebook.py [--images 256] [--codes 256] [--threads 1]

Prints a table, writes benchmarks/results/kmeans_codebook.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
from scipy.cluster.vq import kmeans2

from vlkit.io import atomic_write_text
from vlkit.objectives.mim import _kmeans_plusplus, _normalise_patches, patchify
from vlkit.runtime import gemm_gflops

RESULTS = Path(__file__).resolve().parent / "results" / "kmeans_codebook.json"


def inertia(x: np.ndarray, centroids: np.ndarray) -> float:
    d2 = (x ** 2).sum(1)[:, None] - 2 * x @ centroids.T + (centroids ** 2).sum(1)[None]
    return float(d2.min(1).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--codes", type=int, default=256)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--patch", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    pixels = torch.rand(args.images, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    x = _normalise_patches(patchify(pixels, args.patch)).flatten(0, 1).double().numpy()
    n, d, k = *x.shape, args.codes
    peak = gemm_gflops(2048, torch.float64)
    rows = []
    for name, flops, fit in (
            ("scipy kmeans2 minit=++", 2 * d * n * k * (k - 1) / 2,
             lambda: kmeans2(x, k, iter=20, minit="++", seed=0)[0]),
            ("vlkit k-means++ + kmeans2 minit=matrix", 3 * d * n * k,
             lambda: kmeans2(x, _kmeans_plusplus(x, k, np.random.default_rng(0)), iter=20, minit="matrix")[0])):
        start = time.perf_counter()
        centroids = fit()
        seconds = time.perf_counter() - start
        rows.append({"fit": name, "seconds": seconds, "seeding_gflop": flops / 1e9,
                     "seeding_gflops_if_all_time": flops / seconds / 1e9, "inertia": inertia(x, centroids)})
    print(f"{n} patches x {d} values, {k} codes, {args.threads} thread(s); fp64 2048² GEMM {peak:.1f} GFLOPS")
    print("| fit | seconds | seeding GFLOP | seeding GFLOPS (whole fit's time) | of GEMM | inertia |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['fit']} | {r['seconds']:.2f} | {r['seeding_gflop']:.1f} | {r['seeding_gflops_if_all_time']:.1f} | "
              f"{r['seeding_gflops_if_all_time'] / peak:.0%} | {r['inertia']:.2f} |")
    print(f"speed-up: {rows[0]['seconds'] / rows[1]['seconds']:.1f}x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS, json.dumps({
        "rows": rows, "speedup": rows[0]["seconds"] / rows[1]["seconds"], "gemm_2048_fp64_gflops": peak,
        "patches": n, "dim": d, "codes": k, "threads": args.threads, "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__}, indent=2))


if __name__ == "__main__":
    main()
