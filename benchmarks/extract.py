"""Speed of the region path: BUTD R101 extraction at 600x1000 (random weights), the shipped shapes
detector on shapes scenes, and feature-store read throughput through a DataLoader.

    python benchmarks/extract.py [--r101-images 2] [--shapes-images 64] [--store-images 500] [--device cpu]

Prints a table and writes benchmarks/results/extract.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_r101(n: int, device: str) -> dict:
    """Images/s of the BUTD ResNet-101 detector on 600x1000 inputs (per stage too)."""
    from vlkit.features.detector import BottomUpDetector, butd_select, preset

    torch.manual_seed(0)
    model = BottomUpDetector(preset("butd_r101")).to(device).eval()
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (600, 1000, 3), dtype=np.uint8) for _ in range(n)]
    model.extract(images[:1])  # warm-up (allocator, kernels)
    stages = {"backbone_s": 0.0, "rpn_s": 0.0, "roi_head_s": 0.0, "select_s": 0.0}
    boxes = []
    start = time.perf_counter()
    with torch.no_grad():
        for img in images:
            t = time.perf_counter()
            prep = model.prepare([img])
            feats = model.backbone(prep.tensor)
            _sync(device)
            stages["backbone_s"] += time.perf_counter() - t
            t = time.perf_counter()
            logits, deltas, anchors = model.rpn_outputs(feats)
            rois = model.proposals(prep, logits.sigmoid(), deltas, anchors)
            _sync(device)
            stages["rpn_s"] += time.perf_counter() - t
            t = time.perf_counter()
            pooled = model.roi_heads.pooled_features(feats, rois)
            cls_logits, _, _ = model.roi_heads.box_predictor(pooled)
            _sync(device)
            stages["roi_head_s"] += time.perf_counter() - t
            t = time.perf_counter()
            keep, _ = butd_select(rois[0], cls_logits.softmax(-1))
            _sync(device)
            stages["select_s"] += time.perf_counter() - t
            boxes.append(len(keep))
    total = time.perf_counter() - start
    return {"images": n, "images_per_s": n / total, "s_per_image": total / n, "proposals": int(len(rois[0])),
            "boxes_kept_mean": float(np.mean(boxes)), **{k: v / n for k, v in stages.items()}}


def bench_shapes(n: int, device: str, batch_size: int) -> dict:
    """Images/s of the shipped shapes detector (extraction incl. selection) on 128 px scenes."""
    from vlkit.data.shapes import ShapesWorld
    from vlkit.features.detector import load_detector

    model = load_detector("shapes", device=device)
    world = ShapesWorld(seed=7, num_images=n)
    images = [np.asarray(world.image(i)) for i in range(n)]
    model.extract(images[:batch_size])
    start = time.perf_counter()
    kept = []
    for i in range(0, n, batch_size):
        kept += [len(o["boxes"]) for o in model.extract(images[i:i + batch_size])]
    _sync(device)
    total = time.perf_counter() - start
    return {"images": n, "batch_size": batch_size, "images_per_s": n / total, "boxes_kept_mean": float(np.mean(kept))}


class _Loads(torch.utils.data.Dataset):
    def __init__(self, store, ids, kwargs):
        self.store, self.ids, self.kwargs = store, ids, kwargs

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        r = self.store.load(self.ids[i], **self.kwargs)
        return torch.from_numpy(r.features), torch.from_numpy(r.boxes)


def bench_store(n: int, dim: int = 2048, classes: int = 1601) -> list[dict]:
    """Write a BUTD-sized store (10-100 boxes, fp16 features and soft labels) and read it back."""
    from vlkit.features.store import FeatureStore, FeatureStoreWriter

    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "feats.h5"
        start = time.perf_counter()
        with FeatureStoreWriter(path, provenance={"bench": "extract"}) as w:
            for i in range(n):
                k = int(rng.integers(10, 101))
                prob = rng.random((k, classes), dtype=np.float32)
                w.add(str(i), features=rng.random((k, dim), dtype=np.float32), boxes=rng.random((k, 4), dtype=np.float32) * 500,
                      image_h=600, image_w=800, conf=rng.random(k, dtype=np.float32), cls_prob=prob / prob.sum(1, keepdims=True))
        write_s = time.perf_counter() - start
        size_mb = path.stat().st_size / 2**20
        store = FeatureStore(path)
        ids = store.ids()
        order = [ids[j] for j in rng.permutation(len(ids))]
        for workers in (0, 2):
            for label, kwargs in (("adaptive (UNITER rule)", {}), ("fixed 36", {"num_bb": 36})):
                loader = torch.utils.data.DataLoader(_Loads(store, order, kwargs), batch_size=None, num_workers=workers)
                start = time.perf_counter()
                count = sum(1 for _ in loader)
                secs = time.perf_counter() - start
                rows.append({"workers": workers, "selection": label, "samples_per_s": count / secs})
        rows.append({"write_images_per_s": n / write_s, "file_mb": size_mb, "images": n})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--r101-images", type=int, default=2)
    p.add_argument("--shapes-images", type=int, default=64)
    p.add_argument("--shapes-batch", type=int, default=8)
    p.add_argument("--store-images", type=int, default=500)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "extract.json")
    args = p.parse_args()

    results = {"device": args.device, "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
               "torch": torch.__version__}
    if args.device.startswith("cuda"):
        results["gpu"] = torch.cuda.get_device_name()
    results["butd_r101_600x1000_random_weights"] = r101 = bench_r101(args.r101_images, args.device)
    results["shapes_detector"] = shapes = bench_shapes(args.shapes_images, args.device, args.shapes_batch)
    results["store_read"] = store = bench_store(args.store_images)

    table = [("BUTD R101 600x1000, images/s", f"{r101['images_per_s']:.3f}")]
    table += [(f"  s/image in {k[:-2]}", f"{r101[k]:.3f}") for k in ("backbone_s", "rpn_s", "roi_head_s", "select_s")]
    table.append((f"shapes detector, images/s (batch {shapes['batch_size']})", f"{shapes['images_per_s']:.1f}"))
    table += [(f"store read, samples/s ({row['workers']} workers, {row['selection']})", f"{row['samples_per_s']:.0f}")
              for row in store[:-1]]
    table.append(("store write, images/s", f"{store[-1]['write_images_per_s']:.0f}"))
    width = max(len(label) for label, _ in table) + 2
    print(f"\n{'benchmark':<{width}}{'value':>10}")
    for label, value in table:
        print(f"{label:<{width}}{value:>10}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
