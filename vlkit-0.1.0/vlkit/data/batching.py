"""Batch samplers: dynamic batching by input units (UNITER's token buckets) and fixed-size batches.

An example's length is an int (e.g. tokens + regions) or a tuple with one entry per padded part
(e.g. ``(tokens, regions)``, as `ImageTextPairs.lengths` gives). A batch costs
``len(batch) * sum(per-part max)`` units, i.e. the size of its padded tensors. Shuffling uses an
explicit seed and the epoch (`set_epoch`), never the global RNG. With ``num_replicas > 1`` every
rank builds the same global batch list and takes every ``num_replicas``-th batch; the list is first
made divisible by splitting its largest batches, so the shards are disjoint, cover every example
and hold the same number of batches.
"""
from __future__ import annotations

import abc
from typing import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

Lengths = Sequence[int] | Sequence[Sequence[int]]


def _as_array(lengths: Lengths) -> np.ndarray:
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or (arr < 0).any():
        raise ValueError(f"lengths must be non-negative ints or equal-length tuples of them, got shape {arr.shape}")
    return arr


def padded_units(batch: Sequence[int], lengths: Lengths | np.ndarray) -> int:
    """Units of ``batch`` counted with padding: ``len(batch) * sum(max length of each part)``."""
    arr = lengths if isinstance(lengths, np.ndarray) and lengths.ndim == 2 else _as_array(lengths)
    return int(len(batch) * arr[list(batch)].max(0).sum()) if len(batch) else 0


def padding_fraction(batches: Sequence[Sequence[int]], lengths: Lengths) -> float:
    """Fraction of the padded units of ``batches`` that are padding."""
    arr = _as_array(lengths)
    padded = sum(padded_units(b, arr) for b in batches)
    real = sum(int(arr[list(b)].sum()) for b in batches)
    return 1.0 - real / padded if padded else 0.0


class _EpochBatchSampler(Sampler[list[int]], abc.ABC):
    """Deterministic per-(seed, epoch) global batches, sharded evenly across ranks."""

    def __init__(self, num_examples: int, seed: int, shuffle: bool, drop_last: bool, size_multiple: int,
                 num_replicas: int, rank: int):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, num_replicas={num_replicas})")
        if num_examples < num_replicas:
            raise ValueError(f"{num_examples} examples cannot be shared by {num_replicas} ranks")
        self.num_examples, self.seed, self.shuffle, self.drop_last = num_examples, seed, shuffle, drop_last
        self.size_multiple, self.num_replicas, self.rank = size_multiple, num_replicas, rank
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    @abc.abstractmethod
    def _make_batches(self, rng: np.random.Generator) -> list[list[int]]:
        """The global batch list of one epoch, drawing randomness only from ``rng``."""

    def _order(self, rng: np.random.Generator) -> np.ndarray:
        return rng.permutation(self.num_examples) if self.shuffle else np.arange(self.num_examples)

    def global_batches(self, epoch: int | None = None) -> list[list[int]]:
        """Every rank's batches of ``epoch`` (default: the current one), divisible by ``num_replicas``."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self._cache is None or self._cache[0] != epoch:
            batches = self._make_batches(np.random.default_rng((self.seed, epoch)))
            self._cache = (epoch, self._balance(batches))
        return self._cache[1]

    def _balance(self, batches: list[list[int]]) -> list[list[int]]:
        """Make the batch count a multiple of ``num_replicas``: split the largest batch while one has
        two examples or more; once every batch is a single example, merge the smallest that fit."""
        batches = list(batches)
        while len(batches) % self.num_replicas and max(map(len, batches)) >= 2:
            k = max(range(len(batches)), key=lambda j: len(batches[j]))
            b = batches[k]
            half = len(b) // 2
            cut = half - half % self.size_multiple if half >= self.size_multiple else half
            batches[k:k + 1] = [b[:cut], b[cut:]]
        while len(batches) % self.num_replicas:
            by_size = sorted(range(len(batches)), key=lambda j: self._units(batches[j]))
            pair = next(((a, c) for a, c in zip(by_size, by_size[1:])
                         if self._units(batches[a] + batches[c]) <= self.budget), None)
            if pair is None:
                raise ValueError(f"cannot give {self.num_replicas} ranks equal batch counts: {len(batches)} "
                                 "batches and no two fit in one batch")
            merged = batches[pair[0]] + batches[pair[1]]
            batches = [x for j, x in enumerate(batches) if j not in pair] + [merged]
        return batches

    @abc.abstractmethod
    def _units(self, batch: list[int]) -> int:
        """The cost of ``batch``, at most ``self.budget`` for every batch."""

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.global_batches()[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return len(self.global_batches()) // self.num_replicas


class TokenBucketSampler(_EpochBatchSampler):
    """UNITER's dynamic batching: shuffle, cut into buckets of ``bucket_size`` examples, sort each
    bucket by length (longest first; multi-part lengths: see `_sort_bucket`), fill batches
    ``size_multiple`` examples at a time while the padded units stay within ``max_units``, then
    shuffle the batches.

    ``drop_last`` drops the last batch of every bucket, as UNITER's ``droplast`` does. Batches are
    multiples of ``size_multiple`` except the last of a bucket, or where ``max_units`` is too small
    for ``size_multiple`` examples of that length.
    """

    def __init__(self, lengths: Lengths, max_units: int, bucket_size: int = 8192, size_multiple: int = 8,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = False, num_replicas: int = 1, rank: int = 0):
        self.lengths = _as_array(lengths)
        super().__init__(len(self.lengths), seed, shuffle, drop_last, size_multiple, num_replicas, rank)
        if size_multiple < 1 or bucket_size < 1:
            raise ValueError(f"size_multiple ({size_multiple}) and bucket_size ({bucket_size}) must be >= 1")
        totals = self.lengths.sum(1)
        if len(totals) and totals.max() > max_units:
            k = int(totals.argmax())
            raise ValueError(f"example {k} has {int(totals[k])} input units, more than max_units={max_units}")
        self.max_units = self.budget = int(max_units)
        self.bucket_size = int(bucket_size)

    def _units(self, batch: list[int]) -> int:
        return padded_units(batch, self.lengths)

    def _fill(self, bucket: np.ndarray) -> list[list[int]]:
        """Batches of one length-sorted bucket."""
        batches: list[list[int]] = []
        current: list[int] = []
        peak = np.zeros(self.lengths.shape[1], dtype=np.int64)
        for start in range(0, len(bucket), self.size_multiple):
            chunk = bucket[start:start + self.size_multiple].tolist()
            new_peak = np.maximum(peak, self.lengths[chunk].max(0))
            if (len(current) + len(chunk)) * new_peak.sum() <= self.max_units:
                current, peak = current + chunk, new_peak
                continue
            if current:  # flush, then start afresh with this chunk
                batches.append(current)
            current, peak = [], np.zeros_like(peak)
            for i in chunk:  # one at a time: a whole chunk may not fit when max_units is tight
                new_peak = np.maximum(peak, self.lengths[i])
                if (len(current) + 1) * new_peak.sum() > self.max_units:
                    batches.append(current)
                    current, new_peak = [], self.lengths[i].copy()
                current, peak = current + [i], new_peak
        if current:
            batches.append(current)
        return batches[:-1] if self.drop_last else batches

    def _sort_bucket(self, bucket: np.ndarray) -> np.ndarray:
        """Longest first. With several parts, sort by the most spread part, cut that order into
        about sqrt(#batches) strata and sort each by the other parts (alternating direction), so
        that every part pads little, not just their sum."""
        lens = self.lengths[bucket]
        primary = int(lens.std(0).argmax())
        order = np.argsort(-lens[:, primary], kind="stable")
        if lens.shape[1] == 1:
            return bucket[order]
        est_batches = len(bucket) * max(1.0, float(lens.mean(0).sum())) / self.max_units
        rest = lens.sum(1) - lens[:, primary]
        strata = np.array_split(order, max(1, int(round(np.sqrt(est_batches)))))
        return bucket[np.concatenate([s[np.argsort(rest[s] if k % 2 else -rest[s], kind="stable")]
                                      for k, s in enumerate(strata)])]

    def _make_batches(self, rng: np.random.Generator) -> list[list[int]]:
        order = self._order(rng)
        batches = []
        for start in range(0, len(order), self.bucket_size):
            batches += self._fill(self._sort_bucket(order[start:start + self.bucket_size]))
        if self.shuffle:
            batches = [batches[k] for k in rng.permutation(len(batches))]
        return batches


class FixedSizeBatchSampler(_EpochBatchSampler):
    """Batches of ``batch_size`` examples in (seeded) random order; ``drop_last`` drops a short last batch.

    ``group_by_length=G`` (with ``lengths``) cuts the shuffled order into groups of ``G`` batches,
    sorts each group by its examples' first length part (the text, identical for every family) and
    shuffles the resulting batches: the same examples per epoch, far less text padding.
    """

    def __init__(self, num_examples: int, batch_size: int, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False, num_replicas: int = 1, rank: int = 0, group_by_length: int = 0,
                 lengths: Lengths | None = None):
        super().__init__(num_examples, seed, shuffle, drop_last, 1, num_replicas, rank)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if group_by_length < 0:
            raise ValueError(f"group_by_length must be >= 0, got {group_by_length}")
        if group_by_length and lengths is None:
            raise ValueError("group_by_length needs the examples' lengths")
        self.batch_size = self.budget = int(batch_size)
        self.group_by_length = int(group_by_length)
        self.sort_key = _as_array(lengths)[:, 0] if group_by_length else None
        if self.sort_key is not None and len(self.sort_key) != num_examples:
            raise ValueError(f"{len(self.sort_key)} lengths for {num_examples} examples")

    def _units(self, batch: list[int]) -> int:
        return len(batch)

    def _make_batches(self, rng: np.random.Generator) -> list[list[int]]:
        order = self._order(rng)
        if self.group_by_length:
            group = self.group_by_length * self.batch_size
            order = np.concatenate([g[np.argsort(-self.sort_key[g], kind="stable")]
                                    for g in np.split(order, range(group, len(order), group))])
        order = order.tolist()
        batches = [order[k:k + self.batch_size] for k in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        if self.group_by_length and self.shuffle:
            batches = [batches[k] for k in rng.permutation(len(batches))]
        return batches
