"""Speed of the data room: shapes world generation and writing, pair loading and collation, and
dynamic batching (build time, padding fraction against fixed-size batches).

    python benchmarks/data_pipeline.py [--images 500] [--examples 100000]

Runs single-threaded (like a DataLoader worker). Prints a table and writes
benchmarks/results/data_pipeline.json.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def _timed(fn, repeat: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def bench_world(n: int) -> dict:
    from vlkit.data.shapes import ShapesWorld, write_shapes

    w = ShapesWorld(seed=0, num_images=n)
    out = {"scene_ms": 1e3 * _timed(lambda: [w.scene(i) for i in range(n)]) / n,
           "png_ms": 1e3 * _timed(lambda: [w.png_bytes(i) for i in range(n)]) / n,
           "text_ms": 1e3 * _timed(lambda: [(w.captions(i), w.vqa(i), w.refexps(i), w.nlvr2(i), w.snli_ve(i))
                                            for i in range(n)]) / n}
    with tempfile.TemporaryDirectory() as d:
        out["write_s"] = _timed(lambda: write_shapes(ShapesWorld(seed=0, num_images=n), d))
        out["rewrite_s"] = _timed(lambda: write_shapes(ShapesWorld(seed=0, num_images=n), d))
    return out


def bench_pairs(n: int) -> dict:
    from vlkit.cli import compose
    from vlkit.registry import DATASETS

    cfg = compose("data/shapes", [f"data.num_images={n}"]).data
    start = time.perf_counter()
    ds = DATASETS.get("shapes")(cfg)
    build = time.perf_counter() - start
    k = min(len(ds), 1000)
    examples = []
    get = _timed(lambda: examples.extend(ds[i] for i in range(k))) / k
    collate = ds.collator()
    return {"captions": len(ds), "build_s": build, "getitem_ms": 1e3 * get,
            "collate_64_ms": 1e3 * _timed(lambda: collate(examples[:64]), repeat=20)}


def bench_batching(n: int) -> list[dict]:
    from vlkit.data.batching import FixedSizeBatchSampler, TokenBucketSampler, padding_fraction
    from vlkit.data.shapes import ShapesWorld, shapes_tokenizer

    w, tok = ShapesWorld(seed=0, num_images=2000), shapes_tokenizer()
    caption_lens = [len(ids) for i in range(2000) for ids in tok(w.captions(i))["input_ids"]]
    rng = np.random.default_rng(0)
    tokens = rng.choice(caption_lens, n)
    regions = rng.integers(10, 101, n)  # UNITER's min(100, max(10, #conf > 0.2))
    rows = []
    for name, lengths in (("tokens+regions summed (UNITER packing)", (tokens + regions).tolist()),
                          ("(tokens, regions) padded separately", np.stack([tokens, regions], 1).tolist())):
        for max_units in (4096, 10240):
            sampler = TokenBucketSampler(lengths, max_units=max_units, seed=0)
            build = _timed(lambda: sampler.global_batches(epoch=1))
            batches = sampler.global_batches(epoch=1)
            fixed = list(FixedSizeBatchSampler(n, batch_size=max(1, round(n / len(batches))), seed=0))
            rows.append({"lengths": name, "max_units": max_units, "examples": n, "batches": len(batches),
                         "build_s": build, "padding_dynamic": padding_fraction(batches, lengths),
                         "padding_fixed_same_mean_size": padding_fraction(fixed, lengths)})
    return rows


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--examples", type=int, default=100_000)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in DataLoader workers; tiny tensors only lose to intra-op threads
    results = {"world": bench_world(args.images), "pairs": bench_pairs(args.images),
               "batching": bench_batching(args.examples)}
    print(f"shapes world, {args.images} images:")
    for k, v in results["world"].items():
        print(f"  {k:<14} {v:10.3f}")
    print("shapes pairs (pixels rendered on the fly, 128 px):")
    for k, v in results["pairs"].items():
        print(f"  {k:<14} {v:10.3f}")
    print(f"\n{'lengths':<40} {'max_units':>9} {'batches':>8} {'build s':>8} {'pad dyn':>8} {'pad fixed':>9}")
    for r in results["batching"]:
        print(f"{r['lengths']:<40} {r['max_units']:>9} {r['batches']:>8} {r['build_s']:>8.3f} "
              f"{r['padding_dynamic']:>8.3f} {r['padding_fixed_same_mean_size']:>9.3f}")
    out = Path(__file__).resolve().parent / "results" / "data_pipeline.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
