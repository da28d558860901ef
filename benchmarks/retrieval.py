"""Retrieval evaluation over 1k images x 5k captions with tiny models: naive full forward vs cached
encodings vs pre-ranking + top-k rerank, per family. Time ratios and R@1 differences.

    python benchmarks/retrieval.py                                   # 1000 images x 5000 captions
    python benchmarks/retrieval.py --families meter --images 200 --ks 16 64 --naive-pairs 20000

Setup. The shapes world (seed 0, 10,000 images): the evaluation set is the first ``--images`` test
images with their 5 captions each; each family's ``tiny`` preset (dropout off) is trained for a few
hundred steps (``TRAINING``) with its own recipe on the first ``--train-images`` training images, so
that R@1 carries signal (weights cached in benchmarks/results/cache/). ViLBERT and UNITER read
features of the shipped shapes detector (extracted once into benchmarks/results/cache/, UNITER's box
rule: conf > 0.2, 10 to 36 boxes); METER renders 64-px images cut into 16-px patches.

Timings (images are loaded into memory first, and that load is reported on its own):
- cached: encode every caption and image once, then fuse all N x M pairs (measured in full);
- naive: a full forward per pair, timed on ``--naive-pairs`` random pairs and extrapolated to N x M;
- naive-pooled: the same forwards with ``pooled_only=True`` (the last layers computed only at the pooled
  positions, which cached fusion also does): separates that saving from the cache's;
- rerank@k: encodings + fitting the pre-ranking on the training images + pre-scores + fusing each
  caption's top-k images and each image's top 5k captions (measured in full).
R@1 differences are against the scores of every pair (the cached scores, equal to the full forward's
to 1e-5). Prints a table and writes benchmarks/results/retrieval.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = RESULTS / "cache"
WORLD_SEED, WORLD_IMAGES = 0, 10_000
NO_DROPOUT = {"vilbert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, v_hidden_dropout_prob=0.0,
                              v_attention_probs_dropout_prob=0.0),
              "uniter": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
              "meter": dict(drop_rate=0.0, patch_size=16)}
RECIPE_OPTIONS = {"vilbert": {}, "uniter": dict(negative_size=31, hard_size=4), "meter": dict(num_negatives=7)}
# quick training: steps and AdamW lr per family (ViLBERT's ReLU poolers die at 1e-3; METER learns pixels slowest)
TRAINING = {"vilbert": dict(steps=600, lr=2e-4), "uniter": dict(steps=600, lr=3e-4), "meter": dict(steps=1500, lr=3e-4)}


def image_sources(world, eval_ids: list[str], train_ids: list[str]) -> dict:
    """Region features of the shapes detector (extracted once, resumable) and a 64-px pixel source."""
    from vlkit.data.images import PixelSource, RegionSource, build_transform
    from vlkit.features.detector import extract_features

    store = CACHE / f"shapes-s{WORLD_SEED}-n{WORLD_IMAGES}.h5"
    ids = eval_ids + train_ids
    if store.exists():
        from vlkit.features.store import FeatureStore

        with FeatureStore(store) as existing:
            done = set(existing.ids())
        ids = [i for i in ids if i not in done]
    if ids:
        extract_features(((i, world.load_image(i)) for i in ids), store, total=len(ids))
    regions = RegionSource(store, conf_th=0.2, min_bb=10, max_bb=36)
    return {"regions": regions, "pixels": PixelSource(world.load_image, build_transform(64, [0.5] * 3, [0.5] * 3), 16)}


def trained_task(family: str, train_pairs, args):
    """The family's tiny model with its retrieval head, trained with its own recipe (cached)."""
    import torch
    from safetensors.torch import load_model, save_model

    import vlkit
    from vlkit.tasks.retrieval import Retrieval

    torch.manual_seed(args.seed)
    model = vlkit.build_model(family, preset="tiny", **NO_DROPOUT[family])
    task = Retrieval(model, **RECIPE_OPTIONS[family])
    steps, lr = args.train_steps or TRAINING[family]["steps"], args.lr or TRAINING[family]["lr"]
    path = CACHE / (f"retrieval-{family}-steps{steps}-lr{lr:g}-bs{args.train_batch}-"
                    f"img{args.train_images}-seed{args.seed}.safetensors")
    if path.exists() and not args.retrain:
        load_model(task, str(path))
        return task.eval(), 0.0
    loader = torch.utils.data.DataLoader(train_pairs, batch_size=args.train_batch, shuffle=True, drop_last=True,
                                         collate_fn=train_pairs.collator(),
                                         generator=torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.AdamW(task.parameters(), lr=lr)
    task.train()
    start, step = time.perf_counter(), 0
    while step < steps:
        for batch in loader:
            loss = task(batch, step).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 100 == 0:
                print(f"  {family} step {step}/{steps} loss {loss.item():.4f}", flush=True)
            if step == steps:
                break
    seconds = time.perf_counter() - start
    save_model(task, str(path))
    return task.eval(), seconds


def run_family(family: str, world, sources: dict, eval_ids: list[str], train_ids: list[str], args) -> list[dict]:
    import torch

    from vlkit.data.pairs import ImageTextPairs
    from vlkit.data.shapes import shapes_tokenizer
    from vlkit.tasks.retrieval import RetrievalSet, recall

    tok = shapes_tokenizer()
    source = sources["pixels" if family == "meter" else "regions"]

    def records(ids):
        return [{"image_id": i, "captions": world.captions(world.index_of(i))} for i in ids]

    train_set = RetrievalSet.from_records(records(train_ids), tok, source, max_len=args.max_len, cache_images=False)
    train_pairs = ImageTextPairs([{"id": f"{i}#{k}", "image_id": i, "caption": c} for i in train_ids
                                  for k, c in enumerate(world.captions(world.index_of(i)))], tok, source,
                                 max_len=args.max_len)
    task, train_s = trained_task(family, train_pairs, args)
    data = RetrievalSet.from_records(records(eval_ids), tok, source, max_len=args.max_len)
    n_img, n_txt = data.num_images, data.num_texts
    total = n_img * n_txt
    bs = args.batch_size

    start = time.perf_counter()
    for i in range(n_img):
        data.image_fields(i)
    load_s = time.perf_counter() - start

    # cached: every pair, measured in full
    start = time.perf_counter()
    text, image = task.encode_texts(data, bs), task.encode_images(data, bs)
    encode_s = time.perf_counter() - start
    img_idx, txt_idx = torch.meshgrid(torch.arange(n_img), torch.arange(n_txt), indexing="ij")
    scores = task.score_pairs(data, img_idx.reshape(-1), txt_idx.reshape(-1), "cached", bs, text, image)
    cached_s = time.perf_counter() - start
    full = scores.view(n_img, n_txt)
    reference = recall(full, full, data.txt2img)

    # naive: a full forward per pair, on a random subset of pairs
    g = torch.Generator().manual_seed(args.seed)
    subset = torch.randperm(total, generator=g)[:args.naive_pairs]
    start = time.perf_counter()
    naive_scores = task.score_pairs(data, subset // n_txt, subset % n_txt, "full", bs)
    naive_sub_s = time.perf_counter() - start
    naive_s = naive_sub_s * total / len(subset)
    parity = (naive_scores - scores[subset]).abs().max().item()
    # the same full forwards with pooled_only (last layers at the pooled positions only): how much of the
    # cached speed-up is the pruned last layer rather than the cache
    order = torch.sort(data.text_lengths[subset % n_txt], stable=True).indices  # score_pairs' batching
    start = time.perf_counter()
    with torch.no_grad():
        for s in range(0, len(subset), bs):
            pairs = subset[order[s:s + bs]]
            task.score(task.model(data.pair_batch((pairs // n_txt).tolist(), (pairs % n_txt).tolist()),
                                  pooled_only=True))
    naive_pooled_s = (time.perf_counter() - start) * total / len(subset)

    def row(mode: str, seconds: float, pairs: int, metrics: dict, **extra) -> dict:
        return {"family": family, "mode": mode, "seconds": seconds, "pairs_fused": pairs,
                "speedup_vs_naive": naive_s / seconds, "ir_r1": 100 * metrics["ir_r1"], "tr_r1": 100 * metrics["tr_r1"],
                "r_mean": 100 * metrics["r_mean"],
                "d_ir_r1": 100 * (metrics["ir_r1"] - reference["ir_r1"]),
                "d_tr_r1": 100 * (metrics["tr_r1"] - reference["tr_r1"]), **extra}

    rows = [row("naive", naive_s, total, reference, extrapolated_from_pairs=len(subset), measured_s=naive_sub_s,
                max_abs_diff_vs_cached=parity),
            row("naive-pooled", naive_pooled_s, total, reference, extrapolated_from_pairs=len(subset)),
            row("cached", cached_s, total, reference, encode_s=encode_s,
                speedup_vs_naive_pooled=naive_pooled_s / cached_s)]
    start = time.perf_counter()
    task.fit_prerank(train_set, bs)
    fit_s = time.perf_counter() - start
    for k in args.ks:
        start = time.perf_counter()
        i2t, t2i = task.score_matrices(data, "rerank", k=k, batch_size=bs)
        seconds = time.perf_counter() - start + fit_s
        pairs = int(((i2t > float("-inf")) | (t2i > float("-inf"))).sum())
        rows.append(row(f"rerank@{k}", seconds, pairs, recall(i2t, t2i, data.txt2img), prerank_fit_s=fit_s))
    for r in rows:
        r.update(images=n_img, captions=n_txt, load_images_s=load_s, train_s=train_s)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["vilbert", "uniter", "meter"])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--train-images", type=int, default=1500)
    parser.add_argument("--train-steps", type=int, default=None, help="default: per family (TRAINING)")
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=None, help="default: per family (TRAINING)")
    parser.add_argument("--max-len", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=500, help="pairs per forward / fuse, items per encode")
    parser.add_argument("--naive-pairs", type=int, default=100_000)
    parser.add_argument("--ks", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--retrain", action="store_true", help="ignore cached trained weights")
    parser.add_argument("--out", default=str(RESULTS / "retrieval.json"))
    args = parser.parse_args()

    import torch

    from vlkit.data.shapes import ShapesWorld
    from vlkit.io import atomic_write_text

    if args.threads:
        torch.set_num_threads(args.threads)
    CACHE.mkdir(parents=True, exist_ok=True)
    world = ShapesWorld(WORLD_SEED, WORLD_IMAGES)
    eval_ids = [world.image_id(i) for i in list(world.indices("test"))[:args.images]]
    train_ids = [world.image_id(i) for i in list(world.indices("train"))[:args.train_images]]
    sources = image_sources(world, eval_ids, train_ids)
    rows = []
    for family in args.families:
        print(f"== {family}", flush=True)
        rows += run_family(family, world, sources, eval_ids, train_ids, args)
    header = (f"{'family':8} {'mode':11} {'seconds':>9} {'pairs fused':>12} {'x naive':>8} {'IR R@1':>7} "
              f"{'TR R@1':>7} {'dIR R@1':>8} {'dTR R@1':>8}")
    print(header)
    for r in rows:
        note = f"  (extrapolated from {r['extrapolated_from_pairs']} pairs)" if r["mode"].startswith("naive") else ""
        print(f"{r['family']:8} {r['mode']:11} {r['seconds']:9.1f} {r['pairs_fused']:12d} "
              f"{r['speedup_vs_naive']:8.2f} {r['ir_r1']:7.2f} {r['tr_r1']:7.2f} {r['d_ir_r1']:+8.2f} "
              f"{r['d_tr_r1']:+8.2f}{note}")
    goals = {}
    for family in args.families:
        mine = {r["mode"]: r for r in rows if r["family"] == family}
        reranks = [r for m, r in mine.items() if m.startswith("rerank")]
        goals[family] = {
            "cached_ge_3x_naive": mine["cached"]["speedup_vs_naive"] >= 3,
            "rerank_ge_10x_with_r1_within_0.5": [r["mode"] for r in reranks if r["speedup_vs_naive"] >= 10
                                                 and abs(r["d_ir_r1"]) <= 0.5 and abs(r["d_tr_r1"]) <= 0.5],
        }
    print(json.dumps(goals, indent=1))
    result = {"benchmark": "retrieval", "config": vars(args), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "machine": platform.platform(), "processor": platform.processor(),
              "world": {"seed": WORLD_SEED, "num_images": WORLD_IMAGES}, "region_features": "shapes detector",
              "naive_extrapolated": True, "rows": rows, "goals": goals}
    atomic_write_text(Path(args.out), json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
