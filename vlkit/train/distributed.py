"""How a run's data meets its processes: split every global batch across ranks, or give each rank
its own batches from a sharded sampler; and the training loader (dynamic or fixed-size batches)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

from torch.utils.data import DataLoader, Dataset

from vlkit.data.batching import FixedSizeBatchSampler, TokenBucketSampler
from vlkit.types import VLBatch

BATCHING = ("units", "fixed")


def shard_batch(batch: VLBatch, rank: int, world_size: int) -> VLBatch:
    """Rank ``rank``'s contiguous ``1/world_size`` part of a global batch (parts must be equal, so
    that the mean of the per-rank mean losses is the global mean loss)."""
    if world_size == 1:
        return batch
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    size = batch.batch_size
    if size % world_size:
        first = f" (first example {batch.ids[0]!r})" if batch.ids else ""
        raise ValueError(f"a global batch of {size} examples{first} cannot be split equally across {world_size} "
                         "processes; use batch sizes divisible by the number of processes (fixed batches with "
                         "drop_last, or size_multiple divisible by it) or split_batches=false with a sharded sampler")
    part = size // world_size
    return batch.index(range(rank * part, (rank + 1) * part))


@dataclass(frozen=True)
class LoaderConfig:
    """How a training loader batches (the `TrainerConfig` fields of the same names): ``batching="units"``
    packs examples by input units within ``max_units`` padded units (``bucket_size``, ``size_multiple``),
    UNITER's token buckets; ``"fixed"`` gives ``batch_size`` examples per batch (``group_by_length``: batches
    of similar text length, see `FixedSizeBatchSampler`)."""

    batching: str = "fixed"
    batch_size: int = 32
    max_units: int = 10240
    bucket_size: int = 8192
    size_multiple: int = 8
    drop_last: bool = True
    seed: int = 0
    num_workers: int = 0
    group_by_length: int = 0

    @classmethod
    def of(cls, cfg: Any) -> "LoaderConfig":
        """The loader fields of ``cfg`` (a `TrainerConfig`)."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})


def build_train_loader(dataset: Dataset, config: LoaderConfig = LoaderConfig(), collate_fn: Callable | None = None,
                       lengths: Sequence[Any] | None = None, num_replicas: int = 1, rank: int = 0) -> DataLoader:
    """A shuffling `DataLoader` of `VLBatch` batched as ``config`` says, whose order depends only on
    ``config.seed`` and the epoch.

    Input units come from ``lengths`` or ``dataset.lengths()``. ``collate_fn`` defaults to
    ``dataset.collator()``. With ``num_replicas > 1`` each rank gets its own batches. A streamed dataset
    (an `IterableDataset` such as `vlkit.data.stream.StreamedPairs`) gets fixed-size batches, its rank and
    the seed; it splits its shards over ranks and workers and shuffles itself.
    """
    c = config
    batching, batch_size, max_units, bucket_size = c.batching, c.batch_size, c.max_units, c.bucket_size
    size_multiple, drop_last, seed, num_workers, group_by_length = (c.size_multiple, c.drop_last, c.seed,
                                                                     c.num_workers, c.group_by_length)
    from torch.utils.data import IterableDataset

    if collate_fn is None:
        if not hasattr(dataset, "collator"):
            raise TypeError(f"{type(dataset).__name__} has no collator(); pass collate_fn")
        collate_fn = dataset.collator()
    if isinstance(dataset, IterableDataset):  # a stream (vlkit.data.stream): it shards and shuffles itself
        if batching != "fixed" or group_by_length:
            raise ValueError(f"a streamed dataset ({type(dataset).__name__}) takes fixed-size batches: set "
                             "trainer.batching=fixed and trainer.group_by_length=0")
        dataset.batch_size = batch_size
        dataset.shard(num_replicas, rank)
        dataset.seed = seed
        return DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, num_workers=num_workers)
    if lengths is None and (batching == "units" or group_by_length):
        if not hasattr(dataset, "lengths"):
            raise TypeError(f"{type(dataset).__name__} has no lengths(); pass lengths for batching=units or "
                            "group_by_length")
        lengths = dataset.lengths()
    if batching == "units":
        sampler = TokenBucketSampler(lengths, max_units, bucket_size=bucket_size, size_multiple=size_multiple,
                                     seed=seed, shuffle=True, drop_last=drop_last, num_replicas=num_replicas,
                                     rank=rank)
    elif batching == "fixed":
        sampler = FixedSizeBatchSampler(len(dataset), batch_size, seed=seed, shuffle=True, drop_last=drop_last,
                                        num_replicas=num_replicas, rank=rank, group_by_length=group_by_length,
                                        lengths=lengths)
    else:
        raise ValueError(f"unknown batching {batching!r}; choose one of {', '.join(BATCHING)}")
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn, num_workers=num_workers)


def batch_units(batch: VLBatch, patch_size: int | None = None) -> tuple[int, int]:
    """(real, padded) input units of a batch: text tokens plus regions, or plus patches of
    ``patch_size`` (pixel images carry no padding; without a patch size they count nothing)."""
    real = int(batch.attention_mask.sum())
    padded = batch.attention_mask.numel()
    if batch.region_mask is not None:
        real += int(batch.region_mask.sum())
        padded += batch.region_mask.numel()
    elif batch.pixel_values is not None and patch_size:
        h, w = batch.pixel_values.shape[-2:]
        patches = batch.batch_size * (h // patch_size) * (w // patch_size)
        real += patches
        padded += patches
    return real, padded
