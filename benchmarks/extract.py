"""Speed of the region path: BUTD R101 extraction at 600x1000 (random weights), the shipped shapes
detector on shapes scenes, and feature-store read throughput through a DataLoader.

    python benchmarks/extract.py [--r101-images 2] [--r101-batch 1] [--given-boxes 36] [--shapes-images 64]
                                 [--store-images 500] [--sections r101 shapes store] [--device cpu|cuda]

The R101 rows time the network as it ran before (conv + frozen BN, NCHW) and now (BN folded into the
convolutions, channels-last) alternately on the same images and report both, with the features' largest
relative difference.

Prints a table and writes benchmarks/results/extract.json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def _plain_network(model):
    """The network as it ran before issue 16: each conv followed by its frozen batch norm, NCHW."""
    from torch import nn

    from vlkit.features.detector.network import ConvNorm

    forward, layout = ConvNorm.forward, model.channels_last
    ConvNorm.forward = lambda self, x: self.norm(nn.Conv2d.forward(self, x))
    model.channels_last = False
    try:
        yield
    finally:
        ConvNorm.forward, model.channels_last = forward, layout


def _r101(device: str):
    from vlkit.features.detector import BottomUpDetector, preset

    torch.manual_seed(0)
    model = BottomUpDetector(preset("butd_r101")).to(device).eval()
    with torch.no_grad():  # non-trivial frozen statistics, so that folding them matters
        for name, t in model.state_dict().items():
            if name.endswith("norm.running_var"):
                t.uniform_(0.5, 2.0)
            elif name.endswith(("norm.running_mean", "norm.bias")):
                t.normal_(0, 0.1)
    return model


def _r101_images(n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (600, 1000, 3), dtype=np.uint8) for _ in range(n)]


def _staged(model, images, device: str, given=None) -> tuple[dict, list]:
    """One batch through the detector, timing its stages; returns (seconds per stage, selected rows)."""
    from vlkit.features.detector import butd_select

    stages = {}
    with torch.inference_mode():
        t = time.perf_counter()
        prep = model.prepare(images)
        feats = model.backbone(model.layout(prep.tensor))
        _sync(device)
        stages["backbone_s"] = time.perf_counter() - t
        t = time.perf_counter()
        if given is None:
            logits, deltas, anchors = model.rpn_outputs(feats)
            rois = model.proposals(prep, logits.sigmoid(), deltas, anchors)
        else:
            rois = [torch.as_tensor(g, device=model.device) * s for g, s in zip(given, prep.scales)]
        _sync(device)
        stages["rpn_s"] = time.perf_counter() - t
        t = time.perf_counter()
        pooled = model.roi_heads.pooled_features(feats, rois)
        cls_logits, _, _ = model.roi_heads.box_predictor(pooled)
        _sync(device)
        stages["roi_head_s"] = time.perf_counter() - t
        t = time.perf_counter()
        out, start = [], 0
        for r in rois:
            probs = cls_logits[start:start + len(r)].softmax(-1)
            keep = butd_select(r, probs)[0] if given is None else torch.arange(len(r))
            out.append(pooled[start:start + len(r)][keep].float().cpu())
            start += len(r)
        _sync(device)
        stages["select_s"] = time.perf_counter() - t
    return stages, out


def bench_r101(n: int, device: str, batch: int = 1, rounds: int = 2, given_boxes: int = 0) -> dict:
    """Images/s of the BUTD ResNet-101 detector on 600x1000 inputs, per stage, the network before issue 16
    (conv + frozen BN, NCHW) and now (BN folded, channels-last) alternately on the same images; the
    features of the two agree (max difference reported). ``given_boxes``: that many given boxes per image
    instead of the RPN's 300 proposals (the official given-box extraction mode)."""
    model = _r101(device)
    images = _r101_images(n)
    given = None
    if given_boxes:
        rng = np.random.default_rng(1)
        xy = rng.uniform(0, 500, (n, given_boxes, 2))
        given = np.concatenate([xy, xy + rng.uniform(40, 400, (n, given_boxes, 2))], -1).clip(0, 999).astype(np.float32)
    _staged(model, images[:batch], device, None if given is None else given[:batch])  # warm-up
    with _plain_network(model):
        _staged(model, images[:batch], device, None if given is None else given[:batch])
    totals = {"plain": [], "fast": []}
    stages = {"plain": {}, "fast": {}}
    feats = {"plain": [], "fast": []}
    for r in range(rounds):
        for mode in (("plain", "fast") if r % 2 == 0 else ("fast", "plain")):
            ctx = _plain_network(model) if mode == "plain" else contextlib.nullcontext()
            with ctx:
                start = time.perf_counter()
                for i in range(0, n, batch):
                    st, out = _staged(model, images[i:i + batch], device, None if given is None else given[i:i + batch])
                    for k, v in st.items():
                        stages[mode][k] = stages[mode].get(k, 0.0) + v
                    if r == 0:
                        feats[mode] += out
                totals[mode].append(time.perf_counter() - start)
    diff = max(float((a - b).abs().max()) / max(float(b.abs().max()), 1e-6) for a, b in zip(feats["fast"], feats["plain"])
               if a.shape == b.shape) if all(a.shape == b.shape for a, b in zip(feats["fast"], feats["plain"])) else None
    row = {"images": n, "batch": batch, "rounds": rounds, "given_boxes": given_boxes or None,
           "proposals": None if given_boxes else model.cfg.rpn_post_nms_topk,
           "feature_max_rel_diff": diff, "same_box_counts": all(a.shape == b.shape for a, b in
                                                                zip(feats["fast"], feats["plain"]))}
    for mode in ("plain", "fast"):
        best = min(totals[mode])
        row[f"{mode}_images_per_s"] = n / best
        row[f"{mode}_s_per_image"] = best / n
        row.update({f"{mode}_{k}": v / (n * rounds) for k, v in stages[mode].items()})
    row["speedup"] = row["fast_images_per_s"] / row["plain_images_per_s"]
    row["roi_head_gflop_per_image"] = _res5_gflop(model) * (given_boxes or model.cfg.rpn_post_nms_topk)
    return row


def _res5_gflop(model) -> float:
    """GFLOP (2 x multiply-adds) of res5 on one 14x14 RoI: the RoI head's cost per proposal."""
    total = 0
    for m in model.roi_heads.res5.modules():
        if isinstance(m, torch.nn.Conv2d):
            total += 2 * m.in_channels * m.out_channels * m.kernel_size[0] * m.kernel_size[1] * 14 * 14
    return total / 1e9


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
    p.add_argument("--r101-batch", type=int, default=1)
    p.add_argument("--r101-rounds", type=int, default=2)
    p.add_argument("--given-boxes", type=int, default=36, help="also time given-box extraction (0: skip)")
    p.add_argument("--shapes-images", type=int, default=64)
    p.add_argument("--shapes-batch", type=int, default=8)
    p.add_argument("--store-images", type=int, default=500)
    p.add_argument("--sections", nargs="+", default=["r101", "shapes", "store"], choices=["r101", "shapes", "store"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "extract.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    results = {"device": args.device, "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(sys.argv)}
    if args.device.startswith("cuda"):
        results["gpu"] = torch.cuda.get_device_name()
    table = []
    if "r101" in args.sections:
        results["butd_r101_600x1000_random_weights"] = r101 = bench_r101(args.r101_images, args.device, args.r101_batch,
                                                                          args.r101_rounds)
        table += [(f"BUTD R101 600x1000 ({r101['proposals']} proposals), images/s: before -> now",
                   f"{r101['plain_images_per_s']:.3f} -> {r101['fast_images_per_s']:.3f}")]
        table += [(f"  s/image in {k[5:-2]}", f"{r101['plain_' + k[5:]]:.2f} -> {r101[k]:.2f}")
                  for k in ("fast_backbone_s", "fast_rpn_s", "fast_roi_head_s", "fast_select_s")]
        table.append(("  feature max relative difference", f"{r101['feature_max_rel_diff']:.1e}"))
        if args.given_boxes:
            g = bench_r101(args.r101_images, args.device, args.r101_batch, args.r101_rounds, args.given_boxes)
            results["butd_r101_600x1000_given_boxes"] = g
            table.append((f"BUTD R101 600x1000, {args.given_boxes} given boxes, images/s: before -> now",
                          f"{g['plain_images_per_s']:.3f} -> {g['fast_images_per_s']:.3f}"))
    if "shapes" in args.sections:
        results["shapes_detector"] = shapes = bench_shapes(args.shapes_images, args.device, args.shapes_batch)
        table.append((f"shapes detector, images/s (batch {shapes['batch_size']})", f"{shapes['images_per_s']:.1f}"))
    if "store" in args.sections:
        results["store_read"] = store = bench_store(args.store_images)
        table += [(f"store read, samples/s ({row['workers']} workers, {row['selection']})", f"{row['samples_per_s']:.0f}")
                  for row in store[:-1]]
        table.append(("store write, images/s", f"{store[-1]['write_images_per_s']:.0f}"))
    width = max(len(label) for label, _ in table) + 2
    print(f"\n{'benchmark':<{width}}{'value':>16}")
    for label, value in table:
        print(f"{label:<{width}}{value:>16}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
