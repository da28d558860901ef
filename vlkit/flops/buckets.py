"""What a step of UNITER's dynamic batching holds, without the data: its official token-bucket sampler
(``TokenBucketSampler`` in the official data/sampler.py) run on lengths drawn from a stated distribution.

The official sampler shuffles the examples, cuts them into buckets of ``bucket_size``, sorts each bucket longest
first and fills batches ``size_multiple`` examples at a time while ``longest x examples`` stays within the budget.
The longest length is set by the bucket's first examples and never reset, so every batch of a bucket holds as many
examples as fit at the bucket's longest, however short its own are: batches fill well under their budget
(vlkit's own sampler, `vlkit.data.batching.TokenBucketSampler`, starts each batch afresh). A training run drops
each bucket's last batch. An example's units are its tokens plus its regions; a batch's model input is padded to
its longest example.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Spread:
    """A stated distribution of a length: a normal of ``mean`` and ``sd`` kept to ``[low, high]`` and rounded."""

    mean: float
    sd: float
    low: int
    high: int

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        out = np.empty(0)
        while len(out) < n:  # rejection: the normal kept inside [low, high]
            x = np.rint(rng.normal(self.mean, self.sd, 2 * n))
            out = np.concatenate([out, x[(x >= self.low) & (x <= self.high)]])
        return out[:n].astype(np.int64)


@dataclass(frozen=True)
class BucketStep:
    """One data set's batches under the official sampler: examples per batch, and per example the padded text
    tokens and padded total units (tokens + regions) a batch feeds the model, weighted by examples; ``fill``: the
    units the examples really hold over the budget, ``padded_fill``: the padded units over the budget."""

    examples: float
    text_len: float
    units: float
    fill: float
    padded_fill: float


def official_buckets(text: np.ndarray, regions: np.ndarray, max_units: int, bucket_size: int = 8192,
                     size_multiple: int = 8, rng: np.random.Generator | None = None) -> BucketStep:
    """The official sampler's training batches (``droplast``) over examples of ``text`` tokens and ``regions``."""
    rng = rng or np.random.default_rng(0)
    total = text + regions
    order = rng.permutation(len(total))
    counts, texts, units, real = [], [], [], []
    for start in range(0, len(order), bucket_size):
        bucket = order[start:start + bucket_size]
        bucket = bucket[np.argsort(-total[bucket], kind="stable")]
        per_batch = (max_units // int(total[bucket[0]])) // size_multiple * size_multiple
        if per_batch < 1:
            raise ValueError(f"an example of {int(total[bucket[0]])} units does not fit max_units={max_units} "
                             f"{size_multiple} at a time")
        for first in range(0, len(bucket) - per_batch, per_batch):  # the bucket's last batch is dropped
            batch = bucket[first:first + per_batch]
            counts.append(len(batch))
            texts.append(text[batch].max())
            units.append(total[batch].max())
            real.append(total[batch].sum())
    if not counts:
        raise ValueError(f"no full batch: {len(total)} examples, buckets of {bucket_size}")
    n = np.asarray(counts, dtype=float)
    budget = max_units * len(n)
    return BucketStep(examples=float(n.mean()), text_len=float((n * texts).sum() / n.sum()),
                      units=float((n * units).sum() / n.sum()), fill=float(np.sum(real) / budget),
                      padded_fill=float((n * units).sum() / budget))


def stated_buckets(text: Spread, regions: Spread, max_units: int, bucket_size: int = 8192, size_multiple: int = 8,
                   buckets: int = 16, seed: int = 0) -> BucketStep:
    """`official_buckets` over ``buckets`` buckets of examples drawn from the stated spreads (seeded)."""
    rng = np.random.default_rng(seed)
    n = buckets * bucket_size
    return official_buckets(text.draw(rng, n), regions.draw(rng, n), max_units, bucket_size, size_multiple, rng)


__all__ = ["BucketStep", "Spread", "official_buckets", "stated_buckets"]
