"""Dynamic batching by input units and fixed-size batching."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from vlkit.data.batching import FixedSizeBatchSampler, TokenBucketSampler, padded_units, padding_fraction


def _spread_lengths(n=600, seed=0):
    rng = np.random.default_rng(seed)
    return [(int(t), int(r)) for t, r in zip(rng.integers(5, 60, n), rng.integers(10, 100, n))]


def _flat(batches):
    return [i for b in batches for i in b]


def test_every_example_once_and_within_budget():
    lengths = _spread_lengths()
    sampler = TokenBucketSampler(lengths, max_units=2000, bucket_size=128, seed=1)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert sorted(_flat(batches)) == list(range(len(lengths)))
        assert max(padded_units(b, lengths) for b in batches) <= 2000
        assert len(sampler) == len(batches)
        sizes = [len(b) for b in batches]
        assert sum(s % 8 == 0 for s in sizes) >= len(sizes) - len(lengths) // 128 - 1  # all but bucket tails


def test_units_count_each_padded_part():
    lengths = [(10, 1), (1, 10)]
    assert padded_units([0, 1], lengths) == 2 * (10 + 10)  # text and regions are padded separately
    assert padded_units([0, 1], [11, 11]) == 22
    assert padding_fraction([[0, 1]], lengths) == pytest.approx(1 - 22 / 40)
    assert padding_fraction([[0], [1]], lengths) == 0.0


def test_less_padding_than_random_fixed_batches():
    lengths = _spread_lengths(2000, seed=4)
    dynamic = list(TokenBucketSampler(lengths, max_units=4000, seed=0))
    mean_size = len(lengths) / len(dynamic)
    fixed = list(FixedSizeBatchSampler(len(lengths), batch_size=int(round(mean_size)), seed=0))
    assert padding_fraction(dynamic, lengths) < 0.5 * padding_fraction(fixed, lengths)


def test_deterministic_from_seed_and_epoch_only():
    lengths = _spread_lengths()
    a = TokenBucketSampler(lengths, max_units=1500, bucket_size=64, seed=7)
    b = TokenBucketSampler(lengths, max_units=1500, bucket_size=64, seed=7)
    np.random.seed(123)  # the global RNGs play no part
    import random

    random.seed(99)
    assert list(a) == list(b)
    a.set_epoch(1)
    assert list(a) != list(b)
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(TokenBucketSampler(lengths, max_units=1500, bucket_size=64, seed=8)) != list(b)
    assert a.global_batches(epoch=0) == TokenBucketSampler(lengths, max_units=1500, bucket_size=64, seed=7).global_batches()


def test_rank_shards_disjoint_equal_and_complete():
    lengths = _spread_lengths(301)
    for world in (2, 3, 5, 8):
        shards = [list(TokenBucketSampler(lengths, max_units=1200, bucket_size=50, seed=2, num_replicas=world, rank=r))
                  for r in range(world)]
        assert len({len(s) for s in shards}) == 1, f"unequal batch counts for {world} ranks"
        flat = [_flat(s) for s in shards]
        assert sorted(sum(flat, [])) == list(range(len(lengths)))  # disjoint and complete
        for s in shards:
            assert all(padded_units(b, lengths) <= 1200 for b in s)


def test_unsorted_order_and_drop_last():
    lengths = [5] * 20
    batches = list(TokenBucketSampler(lengths, max_units=40, shuffle=False, size_multiple=4))
    assert batches == [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15], [16, 17, 18, 19]]
    dropped = list(TokenBucketSampler(lengths, max_units=40, shuffle=False, size_multiple=4, drop_last=True))
    assert dropped == batches[:2]


def test_tight_budget_and_errors():
    lengths = [30, 30, 30, 5]
    batches = list(TokenBucketSampler(lengths, max_units=60, shuffle=False))
    assert sorted(_flat(batches)) == [0, 1, 2, 3] and all(padded_units(b, lengths) <= 60 for b in batches)
    with pytest.raises(ValueError, match="example 1 has 70 input units, more than max_units=60"):
        TokenBucketSampler([10, 70], max_units=60)
    with pytest.raises(ValueError, match="cannot be shared by 4 ranks"):
        TokenBucketSampler([1, 2, 3], max_units=60, num_replicas=4)
    with pytest.raises(ValueError, match="no two fit in one batch"):
        list(TokenBucketSampler([40, 40, 40, 40], max_units=60, num_replicas=3))
    merged = [list(TokenBucketSampler([40, 0, 40, 40], max_units=80, num_replicas=3, rank=r)) for r in range(3)]
    # six single-example batches over four ranks: two merges (never a split that undoes a merge)
    shards = [list(TokenBucketSampler([10] * 6, max_units=100, bucket_size=1, num_replicas=4, rank=r)) for r in range(4)]
    assert sorted(_flat(sum(shards, []))) == list(range(6)) and [len(s) for s in shards] == [1, 1, 1, 1]
    assert sorted(_flat(sum(merged, []))) == [0, 1, 2, 3] and [len(m) for m in merged] == [1, 1, 1]
    with pytest.raises(ValueError, match="rank 2 is not in"):
        FixedSizeBatchSampler(10, 2, num_replicas=2, rank=2)


def test_fixed_size_batches():
    s = FixedSizeBatchSampler(10, batch_size=4, seed=0)
    batches = list(s)
    assert [len(b) for b in batches] == [4, 4, 2] and sorted(_flat(batches)) == list(range(10))
    assert [len(b) for b in FixedSizeBatchSampler(10, batch_size=4, drop_last=True)] == [4, 4]
    assert list(FixedSizeBatchSampler(10, 4, shuffle=False)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    shards = [list(FixedSizeBatchSampler(10, 4, seed=0, num_replicas=2, rank=r)) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) and sorted(_flat(shards[0] + shards[1])) == list(range(10))


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=120),
       max_units=st.integers(160, 600), bucket=st.integers(1, 64), mult=st.integers(1, 8),
       world=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_property_cover_once_within_budget(lengths, max_units, bucket, mult, world, seed):
    """Any two examples fit in one batch here, so equal shards always exist."""
    world = min(world, len(lengths))
    shards = [list(TokenBucketSampler(lengths, max_units, bucket, mult, seed=seed, num_replicas=world, rank=r))
              for r in range(world)]
    assert sorted(sum((_flat(s) for s in shards), [])) == list(range(len(lengths)))
    assert len({len(s) for s in shards}) == 1
    assert all(padded_units(b, lengths) <= max_units and b for s in shards for b in s)
