"""Probes of a trained model besides its tasks' metrics: the held-out matching accuracy of a pre-training
(`itm_accuracy`), its zero-shot retrieval (`zero_shot_retrieval`) and the inference latency of a fine-tuned
model (`inference_latency`). `vlkit compare` reports them beside each run's task metrics."""
from __future__ import annotations

import time
from typing import Any

import torch

from vlkit.registry import TASKS

TEXT_SIDE = ("id", "input_ids", "attention_mask", "targets")  # the keys of an example that are not its image


@torch.no_grad()
def inference_latency(model: Any, dataset: Any, n: int = 64, batch_size: int = 32) -> float:
    """Milliseconds per example of a forward pass over ``n`` examples of ``dataset`` in eval mode."""
    collate = dataset.collator()
    examples = [dataset[i] for i in range(min(n, len(dataset)))]
    batches = [collate(examples[i:i + batch_size]) for i in range(0, len(examples), batch_size)]
    was_training = model.training
    model.eval()
    model(batches[0])  # warm-up
    start = time.perf_counter()
    for batch in batches:
        model(batch)
    model.train(was_training)
    return 1000 * (time.perf_counter() - start) / len(examples)


@torch.no_grad()
def itm_accuracy(pre: Any, pairs: Any, limit: int = 2000, batch_size: int = 128, seed: int = 0) -> float:
    """Held-out image-text matching accuracy of a pre-training's ITM head: each of the first ``limit``
    captions of ``pairs`` with its own image and with the image of another caption (a seeded draw among
    the other images), so chance is 0.5; P(matched) > 0.5 counts as "matched"."""
    itm = pre.scorer()
    n = min(limit, len(pairs))
    generator = torch.Generator().manual_seed(seed)
    image_of = [str(i) for i in pairs.data["image_id"]]
    if len(set(image_of)) < 2:
        raise ValueError("itm_accuracy: the held-out pairs show a single image; negatives need two")
    negatives = []
    for i in range(n):
        j = int(torch.randint(len(pairs), (1,), generator=generator))
        while image_of[j] == image_of[i]:
            j = int(torch.randint(len(pairs), (1,), generator=generator))
        negatives.append(j)
    collate = pairs.collator()
    was_training = pre.training
    pre.eval()
    correct = 0
    try:
        for start in range(0, n, batch_size):
            rows = range(start, min(n, start + batch_size))
            positive = [pairs[i] for i in rows]
            negative = [{**{k: v for k, v in pairs[j].items() if k not in TEXT_SIDE},
                         **{k: v for k, v in ex.items() if k in TEXT_SIDE}} for ex, j in zip(positive, negatives[start:])]
            for examples, matched in ((positive, True), (negative, False)):
                score = itm.match_score(pre.model(collate(examples).to(pre.model.device), pooled_only=True))
                correct += int(((score > 0.5) == matched).sum())
    finally:
        pre.train(was_training)
    return correct / (2 * n)


def zero_shot_retrieval(pre: Any, task_cfg: dict[str, Any], data: Any, split: str) -> dict[str, float]:
    """Zero-shot retrieval metrics (``zs_<metric>``) of a pre-training on ``split`` of the retrieval task's
    ``data``, scored by the objective of its mix that offers a matching score (ITM)."""
    options = {k: v for k, v in (task_cfg.get("options") or {}).items() if k in ("eval_mode", "rerank_k", "prerank_ridge")}
    task = TASKS.get("retrieval").zero_shot(pre, **options, **data.options)
    raw = task.evaluate(data.eval[split], batch_size=task_cfg.get("eval_batch_size", 64))
    return {f"zs_{k}": float(v) for k, v in raw.items()}
