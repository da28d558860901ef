"""Image-text pairs streamed from Parquet shards (`vlkit.data.shards`) without loading them into memory.

`StreamedPairs` is a `torch.utils.data.IterableDataset` over the row groups of the shards (pyarrow):

- **Disjoint shards per rank and data-loader worker.** The ``world_size * num_workers`` readers ("slots")
  split the shards: each epoch the shard order is a permutation drawn from ``(seed, epoch)`` and slot ``s``
  reads shards ``s, s + slots, ...`` of it. Every slot yields the same number of examples (the smallest
  slot's rows, rounded down to whole batches; the rest of an epoch is dropped), so every rank takes the
  same number of steps and a `DataLoader`'s round-robin over its workers never changes.
- **Deterministic shuffling**: shard order, then a shuffle buffer of ``buffer_size`` rows per slot, drawn
  from ``(seed, epoch, slot)``. The buffer holds row positions; rows are read by row group (a few
  cached), so memory holds ``buffer_size`` integers and a few row groups, whatever the data's size.
- **Exact resume mid-epoch**: ``seek(batches)`` before iterating continues after ``batches`` batches of
  the epoch: each worker skips its share of row positions without reading them, and the workers' roles
  rotate so that the loader's next batch comes from the worker whose turn it is. The `Trainer` seeks to
  the position stored in its checkpoint (``epoch``, ``batches_in_epoch``; the stream's layout rides along
  as ``stream`` and is checked when resuming).

Examples are those of `vlkit.data.pairs.ImageTextPairs` (``id``, ``image_id``, ``input_ids`` and the image
fields): the image comes from ``image_source(image_id)`` (a `RegionSource` over a feature store), or, when
the shards carry image bytes and ``image_source`` is None, from the bytes through ``transform``.
"""
from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from vlkit.data.collate import VLCollator
from vlkit.data.images import IMAGE_ERRORS, _to_tensor, build_image_source
from vlkit.data.shards import ShardError, open_parquet, read_manifest
from vlkit.data.tokenizers import build_tokenizer
from vlkit.registry import register_dataset
from vlkit.validate import SkipLog, check_on_error, decode_image


def shuffled(positions: Iterator[Any], buffer_size: int, rng: np.random.Generator) -> Iterator[Any]:
    """``positions`` through a shuffle buffer of ``buffer_size`` (each new item takes the place of a random
    buffered one, which is yielded; the rest come out shuffled at the end)."""
    buffer: list[Any] = []
    for item in positions:
        if len(buffer) < buffer_size:
            buffer.append(item)
            continue
        k = int(rng.integers(buffer_size))
        yield buffer[k]
        buffer[k] = item
    rng.shuffle(buffer)
    yield from buffer


class StreamedPairs(torch.utils.data.IterableDataset):
    """Pairs of a shard directory as a stream (see the module docstring). ``batch_size``: the loader's
    batch size (an epoch is cut to whole batches per slot); ``shard(world_size, rank)`` and
    ``set_epoch`` / ``seek`` are called by `vlkit.train` before each iteration."""

    def __init__(self, path: str | os.PathLike, tokenizer: Any, image_source: Any = None, batch_size: int = 32,
                 max_len: int = 62, seed: int = 0, buffer_size: int = 1000, transform: Callable | None = None,
                 patch_size: int = 16, on_error: str | None = None, cache_row_groups: int | None = None):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.files = [self.path / s["file"] for s in self.manifest["shards"]]
        self.rows = [int(s["rows"]) for s in self.manifest["shards"]]
        if image_source is None and "image" not in self.manifest["columns"]:
            raise ShardError(f"{self.path}: the shards carry no image bytes; give an image source (a feature store: "
                             "data.image.source=features data.image.path=...) or write them with images")
        self.tokenizer, self.image_source, self.max_len = tokenizer, image_source, max_len
        self.batch_size, self.seed, self.buffer_size = int(batch_size), int(seed), int(buffer_size)
        self.transform, self.patch_size = transform or _to_tensor, patch_size
        self.on_error = check_on_error(on_error or getattr(image_source, "on_error", None) or "raise")
        self.skips = getattr(image_source, "skips", None) or SkipLog()
        self.world_size, self.rank, self.epoch, self.start_batch = 1, 0, 0, 0
        self.cache_row_groups = cache_row_groups
        self._groups: list[list[int]] | None = None  # per shard: first row of each row group

    # -- layout ------------------------------------------------------------------------------------
    def shard(self, world_size: int, rank: int) -> "StreamedPairs":
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.world_size, self.rank = int(world_size), int(rank)
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def seek(self, batches: int) -> None:
        """The next iteration starts after ``batches`` batches of this rank's epoch."""
        self.start_batch = int(batches)

    def _workers(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def slot_shards(self, epoch: int, slot: int, slots: int) -> list[int]:
        """The shards slot ``slot`` of ``slots`` reads in ``epoch``, in order."""
        if len(self.files) < slots:
            raise ShardError(f"{self.path}: {len(self.files)} shards cannot feed {slots} readers "
                             f"({self.world_size} processes x data-loader workers); write more, smaller shards "
                             "(make-shards shard_size=...) or use fewer workers")
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.files))
        return [int(k) for k in order[slot::slots]]

    def examples_per_slot(self, epoch: int, slots: int) -> int:
        """Examples every slot yields in ``epoch``: the smallest slot's rows, cut to whole batches."""
        least = min(sum(self.rows[k] for k in self.slot_shards(epoch, s, slots)) for s in range(slots))
        return least // self.batch_size * self.batch_size

    def batches_per_epoch(self, num_workers: int = 0) -> int:
        """Batches one rank's loader gives per epoch (``num_workers`` as given to its `DataLoader`)."""
        workers = max(1, num_workers)
        return workers * self.examples_per_slot(self.epoch, self.world_size * workers) // self.batch_size

    def state(self, batches: int, num_workers: int = 0) -> dict[str, Any]:
        """The stream's position and layout for a checkpoint: ``batches`` into ``epoch``."""
        return {"epoch": self.epoch, "batches": int(batches), "seed": self.seed, "batch_size": self.batch_size,
                "buffer_size": self.buffer_size, "world_size": self.world_size, "num_workers": int(num_workers),
                "shards": len(self.files), "rows": int(sum(self.rows))}

    def check_state(self, saved: dict[str, Any], num_workers: int = 0, where: str = "the checkpoint") -> None:
        """Refuse to resume a stream whose layout differs (the position would point elsewhere)."""
        now = self.state(saved.get("batches", 0), num_workers)
        diff = [k for k in ("seed", "batch_size", "buffer_size", "world_size", "num_workers", "shards", "rows")
                if k in saved and saved[k] != now[k]]
        if diff:
            raise ValueError(f"{where} was written by a stream with another layout ("
                             + ", ".join(f"{k} {saved[k]} -> {now[k]}" for k in diff)
                             + f"); {self.path} cannot resume at the same example. Use the same settings")

    # -- positions and rows ------------------------------------------------------------------------
    def positions(self, epoch: int, slot: int, slots: int) -> Iterator[tuple[int, int]]:
        """(shard, row) positions slot ``slot`` yields in ``epoch``: its shards in order, shuffled by the buffer,
        cut to `examples_per_slot`. Nothing is read."""
        def ordered() -> Iterator[tuple[int, int]]:
            for k in self.slot_shards(epoch, slot, slots):
                for row in range(self.rows[k]):
                    yield k, row

        count = self.examples_per_slot(epoch, slots)
        rng = np.random.default_rng([self.seed, epoch, slot, 1])
        for n, pos in enumerate(shuffled(ordered(), self.buffer_size, rng)):
            if n >= count:
                return
            yield pos

    def _row_group_starts(self, shard: int) -> list[int]:
        if self._groups is None:
            self._groups = [[] for _ in self.files]
        if not self._groups[shard]:
            meta = open_parquet(self.files[shard]).metadata
            starts, n = [], 0
            for g in range(meta.num_row_groups):
                starts.append(n)
                n += meta.row_group(g).num_rows
            self._groups[shard] = starts
        return self._groups[shard]

    def _reader(self) -> Callable[[int, int], dict[str, Any]]:
        """``read(shard, row)`` -> the row's columns, reading whole row groups through a small LRU cache."""
        cache: OrderedDict[tuple[int, int], dict[str, list]] = OrderedDict()
        files: dict[int, Any] = {}
        capacity = self.cache_row_groups

        def read(shard: int, row: int) -> dict[str, Any]:
            nonlocal capacity
            starts = self._row_group_starts(shard)
            g = bisect.bisect_right(starts, row) - 1
            key = (shard, g)
            if key not in cache:
                if shard not in files:
                    files[shard] = open_parquet(self.files[shard])
                try:
                    cache[key] = files[shard].read_row_group(g).to_pydict()
                except OSError as e:
                    raise ShardError(f"{self.files[shard]}: row group {g} is unreadable ({e})") from e
                if capacity is None:
                    per_group = max(1, len(cache[key]["id"]))
                    capacity = self.buffer_size // per_group + 2
                while len(cache) > capacity:
                    cache.popitem(last=False)
            else:
                cache.move_to_end(key)
            columns = cache[key]
            return {name: values[row - starts[g]] for name, values in columns.items()}

        return read

    def example(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The example of one shard row (None when ``on_error=skip`` leaves its image out)."""
        ids = self.tokenizer(row["caption"], truncation=True, max_length=self.max_len)["input_ids"]
        try:
            if self.image_source is not None:
                fields = self.image_source(row["image_id"])
            else:
                fields = {"pixel_values": self.transform(decode_image(row["image"], row["image_id"]))}
        except IMAGE_ERRORS as err:
            if self.on_error == "raise":
                raise
            self.skips.add("example", row["id"], str(err), image_id=row["image_id"])
            return None
        return {"id": row["id"], "image_id": row["image_id"], "input_ids": torch.tensor(ids, dtype=torch.long),
                **fields}

    def __iter__(self) -> Iterator[dict[str, Any] | None]:
        worker, workers = self._workers()
        done = self.start_batch
        # the loader asks its workers in turn, starting at worker 0: worker w plays role (w + done) % workers,
        # the worker whose turn it is after ``done`` batches, and skips the batches that role already gave
        role = (worker + done) % workers
        skip = (done // workers + (1 if role < done % workers else 0)) * self.batch_size
        slots = self.world_size * workers
        read = self._reader()
        for n, (shard, row) in enumerate(self.positions(self.epoch, self.rank * workers + role, slots)):
            if n >= skip:
                yield self.example(read(shard, row))

    def collator(self, **kwargs: Any) -> VLCollator:
        return VLCollator(pad_token_id=self.tokenizer.pad_token_id or 0, **kwargs)


@register_dataset("shards")
def shards_pairs(cfg: Any) -> StreamedPairs:
    """``data=shards``: the pairs of a `vlkit make-shards` directory (``cfg.path``) as a stream; images from its
    bytes (``image.source=shards``, pixel families) or from a feature store (``image.source=features``)."""
    source = build_image_source(cfg.get("image", {}), None, cfg.get("on_error") or "raise")
    regions = cfg.get("image", {}).get("source") == "features"
    return StreamedPairs(cfg["path"], build_tokenizer(cfg.get("tokenizer", "shapes")), source if regions else None,
                         max_len=cfg.get("max_len", 62), buffer_size=cfg.get("buffer_size", 1000),
                         transform=None if regions else source.transform,
                         patch_size=getattr(source, "patch_size", 16), on_error=cfg.get("on_error") or "raise")


__all__ = ["StreamedPairs", "shards_pairs", "shuffled"]
