"""The GPU figures of issue 16 in one short run (about 5 minutes on one H200): bf16 training throughput
and MFU of METER-base and UNITER-base, BUTD R101 extraction images/s at 600x1000, retrieval evaluation
time at 1k images x 5k captions, and batched IPOT against a per-pair POT loop.

    bash benchmarks/gpu.sh OUT_DIR                    # the GPU run (writes OUT_DIR/gpu.json)
    python benchmarks/gpu.py --out OUT_DIR --device cpu --dry-run    # every code path, tiny sizes, on CPU

Random weights throughout (speed does not depend on them); nothing is downloaded. Each section records
its own error instead of stopping the run, and a section is skipped when the time budget is spent.

- train: the family's pre-training step (METER: MLM pass + ITM pass; UNITER: MLM pass + ITM pass with WRA)
  under bf16 autocast, backward, the official AdamW rule (fused); samples/s, and MFU = model FLOPs of a
  step (``torch.utils.flop_counter``: matmuls, convolutions, attention) / step time / the GPU's dense bf16
  peak (``--peak-tflops``, by default from the device name); eager, then with the blocks compiled.
- extract: ``BottomUpDetector.extract`` (300 proposals, the BUTD selection rule) on batches of 600x1000
  images, fp32 (TF32 convolutions, torch's default) and bf16 autocast, with the features' relative
  difference between the two.
- retrieval: encode 5k captions and 1k images once, then the cached pooled-only fusion + ITM head of
  ``Retrieval.score_pairs`` over sampled pairs, extrapolated to all 5M pairs, and the pairs of a top-16
  re-ranking measured in full (bf16).
- ipot: vlkit's batched IPOT on the GPU against POT's exact ``emd2`` one pair at a time on the CPU.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/ot.py would shadow POT
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def autocast(device: str, enabled: bool = True):
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=enabled)


def peak_memory_mb(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None


# ------------------------------------------------------------------------------------------ train
def _train_case(family: str, args) -> dict:
    import vlkit
    from vlkit.objectives import build_pretraining
    from vlkit.train.optim import build_optimizer

    dry = args.dry_run
    preset = "tiny" if dry else ("clip16-roberta" if family == "meter" else "base")
    overrides = {"image_size": 224} if family == "meter" and not dry else {}
    torch.manual_seed(0)
    model = vlkit.build_model(family, preset=preset, **overrides).to(args.device)
    batch_size = 4 if dry else {"meter": args.meter_batch, "uniter": args.uniter_batch}[family]
    mix = "meter" if family == "meter" else {
        "sampling": "sum", "masking": "conditional",
        "text_masking": {"prob": 0.15, "policy": "bernoulli", "force_one": True},
        "objectives": {"mlm": {}, "itm": {"negatives": "image", "wra": {"weight": 0.1}}}}
    pre = build_pretraining(model, mix).to(args.device).train()
    batch = model.example_batch(batch_size=batch_size, text_len=40, num_regions=36)
    batch = batch.replace(attention_mask=torch.ones_like(batch.attention_mask),
                          image_ids=[str(i) for i in range(batch_size)])
    if batch.region_mask is not None:
        batch = batch.replace(region_mask=torch.ones_like(batch.region_mask))
    optimizer = build_optimizer(pre, 1e-4, rule="hf", impl="fused")

    def step():
        with autocast(args.device):
            loss = pre(batch, step=0).loss
        loss.backward()
        optimizer.step()
        pre.zero_grad(set_to_none=True)

    from torch.utils.flop_counter import FlopCounterMode

    step()
    counter = FlopCounterMode(display=False)
    with counter:
        with autocast(args.device):
            loss = pre(batch, step=0).loss
        loss.backward()
    pre.zero_grad(set_to_none=True)
    flops = counter.get_total_flops()
    row = {"family": family, "preset": preset, "batch_size": batch_size, "params": sum(p.numel() for p in model.parameters()),
           "gflop_per_step": flops / 1e9, "dtype": "bf16 autocast", "optimizer": "HFAdamW fused (official rule)"}
    for mode in ("eager", "compiled"):
        if mode == "compiled":
            if args.no_compile or time.perf_counter() - args.t0 > args.budget_s * 0.5:
                row["compiled"] = "skipped (--no-compile or time budget)"
                break
            model.compile_blocks(**({"backend": "eager"} if dry else {}))
            t = time.perf_counter()
            step()
            step()
            sync(args.device)
            row["compile_s"] = time.perf_counter() - t
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        step()
        sync(args.device)
        times = []
        for _ in range(2 if dry else args.steps):
            t = time.perf_counter()
            step()
            sync(args.device)
            times.append(time.perf_counter() - t)
        s = statistics.median(times)
        row[mode] = {"step_s": s, "samples_per_s": batch_size / s, "tflops": flops / s / 1e12,
                     "peak_mem_mb": peak_memory_mb(args.device)}
        if args.peak_tflops:
            row[mode]["mfu"] = flops / s / (args.peak_tflops * 1e12)
    return row


def section_train(args) -> list[dict]:
    rows = []
    for family in ("meter", "uniter"):
        rows.append(_guard(lambda family=family: _train_case(family, args), f"train {family}"))
        torch.cuda.empty_cache() if args.device.startswith("cuda") else None
    return rows


# ------------------------------------------------------------------------------------------ extraction
def section_extract(args) -> list[dict]:
    from vlkit.features.detector import BottomUpDetector, DetectorConfig, preset

    torch.manual_seed(0)
    if args.dry_run:
        cfg = DetectorConfig(name="tiny", stage_blocks=(1, 1, 1, 1), stem_channels=8, res2_channels=8,
                             res2_bottleneck=4, rpn_channels=16, num_classes=7, num_attributes=5, attr_embed_dim=4,
                             attr_hidden=8, pooler_resolution=4, min_size=96, max_size=160)
        size, n, batch = (96, 160), 4, 2
    else:
        cfg, size, n, batch = preset("butd_r101"), (600, 1000), args.extract_images, args.extract_batch
    model = BottomUpDetector(cfg).to(args.device).eval()
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(n)]
    rows, feats = [], {}
    for name, bf16 in (("fp32 (TF32 convolutions)", False), ("bf16 autocast", True)):
        with autocast(args.device, bf16):
            model.extract(images[:batch])  # warm-up
            sync(args.device)
            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter()
            outs = []
            for i in range(0, n, batch):
                outs += model.extract(images[i:i + batch])
            sync(args.device)
            seconds = time.perf_counter() - t
        feats[bf16] = outs
        rows.append({"precision": name, "images": n, "batch": batch, "image_size": list(size),
                     "proposals": cfg.rpn_post_nms_topk, "images_per_s": n / seconds,
                     "boxes_kept_mean": float(np.mean([len(o["boxes"]) for o in outs])),
                     "peak_mem_mb": peak_memory_mb(args.device)})
    same = [a["features"].shape == b["features"].shape for a, b in zip(feats[False], feats[True])]
    if all(same):
        rows[1]["feature_rel_diff_vs_fp32"] = max(
            float(np.abs(a["features"] - b["features"]).max() / max(np.abs(a["features"]).max(), 1e-6))
            for a, b in zip(feats[False], feats[True]))
    rows[1]["same_boxes_as_fp32"] = float(np.mean(same))
    return rows


# ------------------------------------------------------------------------------------------ retrieval
def _retrieval_case(family: str, args) -> dict:
    import vlkit
    from vlkit.tasks.retrieval import _cat_encoded, _trim

    dry = args.dry_run
    n_img, n_txt = (20, 100) if dry else (1000, 5000)
    preset = "tiny" if dry else ("clip16-roberta" if family == "meter" else "base")
    overrides = {"image_size": 224} if family == "meter" and not dry else {}
    torch.manual_seed(0)
    model = vlkit.build_model(family, preset=preset, **overrides).to(args.device).eval()
    head = torch.nn.Linear(model.joint_size, 1).to(args.device)
    chunk = 64 if dry else 256
    row = {"family": family, "preset": preset, "images": n_img, "captions": n_txt, "dtype": "bf16 autocast"}
    with torch.no_grad(), autocast(args.device):
        sync(args.device)
        t = time.perf_counter()
        texts, images = [], []
        for s in range(0, n_txt, chunk):
            b = model.example_batch(batch_size=min(chunk, n_txt - s), seed=s, text_len=20, num_regions=36)
            texts.append(model.encode_text(b))
        for s in range(0, n_img, chunk):
            b = model.example_batch(batch_size=min(chunk, n_img - s), seed=10**6 + s, text_len=20, num_regions=36)
            images.append(model.encode_image(b))
        text, image = _cat_encoded(texts), _cat_encoded(images)
        sync(args.device)
        row["encode_s"] = time.perf_counter() - t

        def score(img_idx, txt_idx, batch_size):
            for s in range(0, len(img_idx), batch_size):
                t_i, i_i = txt_idx[s:s + batch_size], img_idx[s:s + batch_size]
                out = model.fuse(_trim(text.index(t_i)), _trim(image.index(i_i)), pooled_only=True)
                head(out.joint).float()

        g = torch.Generator().manual_seed(0)
        pairs = 2000 if dry else args.retrieval_pairs
        img_idx, txt_idx = torch.randint(n_img, (pairs,), generator=g), torch.randint(n_txt, (pairs,), generator=g)
        bs = 256 if dry else args.retrieval_batch
        score(img_idx[:bs], txt_idx[:bs], bs)  # warm-up
        sync(args.device)
        t = time.perf_counter()
        score(img_idx, txt_idx, bs)
        sync(args.device)
        per_pair = (time.perf_counter() - t) / pairs
        row.update(pair_batch=bs, sampled_pairs=pairs, pairs_per_s=1 / per_pair,
                   cached_full_s=row["encode_s"] + per_pair * n_img * n_txt)
        k = 16
        rerank_pairs = n_img * 5 * k + n_txt * k  # each image's top 5k captions, each caption's top-k images
        row.update(rerank_k=k, rerank_pairs=rerank_pairs, rerank_s=row["encode_s"] + per_pair * rerank_pairs)
    return row


def section_retrieval(args) -> list[dict]:
    rows = []
    for family in ("uniter", "meter"):
        rows.append(_guard(lambda family=family: _retrieval_case(family, args), f"retrieval {family}"))
    return rows


# ------------------------------------------------------------------------------------------ ipot
def section_ipot(args) -> list[dict]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("vlkit_bench_ot", HERE / "ot.py")  # not `ot`: that is POT
    ot_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ot_bench)
    rows = []
    shapes = ((8, 10, 6),) if args.dry_run else ((64, 40, 36), (64, 60, 100), (512, 40, 36))
    for shape in shapes:
        problem = ot_bench.make_problem(*shape, "aligned")
        pot_ms, exact = ot_bench.timed(ot_bench.pot_emd_loop, problem, 3, "cpu")
        ipot_ms, dist = ot_bench.timed(ot_bench.vlkit_ipot(50, args.device), problem, 10, args.device)
        rows.append({"shape": "x".join(map(str, shape)), "pot_emd2_loop_cpu_ms": pot_ms[1],
                     f"vlkit_ipot_{args.device}_ms": ipot_ms[1], "speedup": pot_ms[1] / ipot_ms[1],
                     "max_rel_err_vs_exact": float(np.max(np.abs(dist - exact) / exact))})
    return rows


# ------------------------------------------------------------------------------------------ driver
def _guard(fn, name: str) -> dict:
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - recorded, the run goes on
        traceback.print_exc()
        return {"section": name, "error": f"{type(err).__name__}: {err}"}


SECTIONS = {"train": section_train, "extract": section_extract, "retrieval": section_retrieval, "ipot": section_ipot}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="output folder (gpu.json)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dry-run", action="store_true", help="tiny models and inputs (any device): checks the code paths")
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    p.add_argument("--budget-s", type=float, default=420.0, help="skip what would start after this many seconds")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak (default: from the device name)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--meter-batch", type=int, default=128)
    p.add_argument("--uniter-batch", type=int, default=256)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--extract-images", type=int, default=64)
    p.add_argument("--extract-batch", type=int, default=8)
    p.add_argument("--retrieval-pairs", type=int, default=200_000)
    p.add_argument("--retrieval-batch", type=int, default=2048)
    args = p.parse_args()
    args.t0 = time.perf_counter()
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    if args.peak_tflops is None:
        args.peak_tflops = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 matmuls stay fp32; bf16 autocast is the fast path
    report = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "device": name, "torch": torch.__version__,
                       "cuda": torch.version.cuda, "peak_bf16_tflops": args.peak_tflops, "dry_run": args.dry_run,
                       "command": " ".join(sys.argv)}, "sections": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for section in args.sections:
        if time.perf_counter() - args.t0 > args.budget_s:
            report["sections"][section] = {"skipped": "time budget spent"}
            continue
        t = time.perf_counter()
        report["sections"][section] = _guard(lambda section=section: SECTIONS[section](args), section)
        print(f"[{section}] {time.perf_counter() - t:.1f} s: {json.dumps(report['sections'][section], default=str)}",
              flush=True)
        (args.out / "gpu.json").write_text(json.dumps(report, indent=1, default=str))
    report["meta"]["total_s"] = time.perf_counter() - args.t0
    (args.out / "gpu.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {args.out / 'gpu.json'} ({report['meta']['total_s']:.0f} s)")


if __name__ == "__main__":
    main()
