"""Images per second of ``vlkit extract-features`` (the shipped shapes detector, the command's defaults) at 1 and
at 2 torch threads, alternating, so that both see the same load.

    python benchmarks/extract_threads.py [--images 48] [--size 128] [--rounds 3] [--threads 1 2]

Each round extracts the same images (shapes-world scenes, PNG files in a folder) once per thread count into a
fresh store, through `vlkit.cli.main`, in this one process after a warm-up; the median round is reported beside
the machine: CPU count, the 1-minute load average before and after, torch version. Prints a table and writes
benchmarks/results/extract_threads.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from vlkit.io import atomic_write_text


def _extract(folder: Path, out: Path, threads: int) -> float:
    """Seconds of one ``vlkit extract-features`` of ``folder`` at ``threads``."""
    from vlkit.cli import main

    start = time.perf_counter()
    main(["extract-features", f"images={folder}", f"out={out}", "device=cpu", "progress=false", f"threads={threads}"])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--size", type=int, default=128, help="image side (px)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "extract_threads.json")
    args = parser.parse_args()

    import torch

    from vlkit.data.shapes import shared_world

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="vlkit-extract-threads-") as work:
        folder = Path(work) / "images"
        folder.mkdir()
        world = shared_world({"name": "shapes", "seed": 0, "num_images": args.images, "image_size": args.size})
        for i in range(args.images):
            world.image(i).save(folder / f"{world.image_id(i)}.png")
        _extract(folder, Path(work) / "warmup.h5", 1)
        seconds: dict[int, list[float]] = {t: [] for t in args.threads}
        for r in range(args.rounds):
            for t in args.threads:
                seconds[t].append(_extract(folder, Path(work) / f"r{r}_t{t}.h5", t))
    load_after = os.getloadavg()[0]
    rows = {str(t): {"images_per_s": args.images / statistics.median(s), "seconds": s} for t, s in seconds.items()}
    results = {"images": args.images, "size": args.size, "rounds": args.rounds, "detector": "shapes",
               "threads": rows, "cpu_count": os.cpu_count(), "load_1min": {"before": load_before, "after": load_after},
               "torch": torch.__version__, "platform": platform.platform(), "processor": platform.processor()}
    print(f"{args.images} shapes-world images of {args.size} px, shapes detector, median of {args.rounds} rounds "
          f"({os.cpu_count()} CPUs, 1-min load {load_before:.1f} before, {load_after:.1f} after)")
    for t, row in rows.items():
        print(f"  threads={t}: {row['images_per_s']:.1f} images/s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(results, indent=1))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
