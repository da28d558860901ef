"""Streamed pairs: make-shards writes Parquet pair shards (jsonl, CC, SBU, the shapes world with pixels);
`StreamedPairs` reads them as a seeded stream, disjoint per rank and worker, and resumes mid-epoch exactly."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from vlkit.cli import main as cli
from vlkit.data.shapes import ShapesWorld, shapes_tokenizer
from vlkit.data.shards import ShardError, read_manifest, shapes_records, write_shards
from vlkit.data.stream import StreamedPairs, shuffled


@pytest.fixture(scope="module")
def small_world():
    return ShapesWorld(seed=3, num_images=10, image_size=64, val_images=0, test_images=0)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, small_world):
    """50 pairs (10 images x 5 captions) with PNG bytes, in 7 shards of 8 rows (the last 2), row groups of 3."""
    out = tmp_path_factory.mktemp("pairs")
    return write_shards(shapes_records(small_world), out, shard_size=8, row_group_size=3,
                        image_bytes=lambda i: small_world.png_bytes(small_world.index_of(i)), source="shapes")


_TOKENIZER = []


def _stream(path, **kw):
    if not _TOKENIZER:  # built once: a tokenizer takes seconds to build on a busy machine
        _TOKENIZER.append(shapes_tokenizer())
    return StreamedPairs(path, _TOKENIZER[0], **{"batch_size": 2, "buffer_size": 5, "seed": 1, **kw})


def _ids(loader):
    return [i for batch in loader for i in batch.ids]


def test_write_shards_layout_and_errors(shards, small_world, tmp_path):
    manifest = read_manifest(shards)
    assert manifest["rows"] == 50 and [s["rows"] for s in manifest["shards"]] == [8] * 6 + [2]
    assert manifest["columns"] == ["id", "image_id", "caption", "image"]
    f = pq.ParquetFile(shards / "pairs-00000.parquet")
    assert f.metadata.num_row_groups == 3
    row = f.read_row_group(0).to_pylist()[0]
    assert row["id"] == "0#0" and row["caption"] == small_world.captions(0)[0]
    assert row["image"] == small_world.png_bytes(0)
    with pytest.raises(ShardError, match="record 0 .* lacks 'caption'"):
        write_shards([{"id": "a", "image_id": "a"}], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # a failed write leaves nothing
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "pairs-00000.parquet").write_bytes(b"")
    with pytest.raises(ShardError, match="shards.json is missing: .* not a finished pair-shard directory"):
        read_manifest(tmp_path / "bad")


def test_make_shards_from_jsonl_cc_sbu(tmp_path, capsys):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"image_id": f"i{k % 3}", "caption": f"cap {k}"}) + "\n"
                                              for k in range(5)))
    assert cli(["make-shards", "source=jsonl", f"path={tmp_path / 'c.jsonl'}", f"out={tmp_path / 'j'}",
                "shard_size=2"]) == 0
    assert "5 pairs in 3 shards" in capsys.readouterr().out
    (tmp_path / "cc.tsv").write_text("a dog\thttp://x/1.jpg\na cat\thttp://x/2.jpg\n")
    assert cli(["make-shards", "source=cc", f"path={tmp_path / 'cc.tsv'}", f"out={tmp_path / 'cc'}"]) == 0
    rows = pq.read_table(tmp_path / "cc" / "pairs-00000.parquet").to_pylist()
    assert [(r["image_id"], r["caption"]) for r in rows] == [("0", "a dog"), ("1", "a cat")]
    (tmp_path / "caps.txt").write_text("red sky\nblue sea\n")
    (tmp_path / "urls.txt").write_text("http://y/1\nhttp://y/2\n")
    assert cli(["make-shards", "source=sbu", f"captions={tmp_path / 'caps.txt'}", f"urls={tmp_path / 'urls.txt'}",
                f"out={tmp_path / 'sbu'}"]) == 0
    assert read_manifest(tmp_path / "sbu")["rows"] == 2
    assert cli(["make-shards", "source=shapes", "num_images=10", "image_size=64", f"out={tmp_path / 's'}"]) == 0
    manifest = read_manifest(tmp_path / "s")
    assert "image" in manifest["columns"] and manifest["rows"] == 8 * 5  # the train split of 10 images


def test_shuffle_buffer_is_a_seeded_permutation():
    a = list(shuffled(iter(range(20)), 5, np.random.default_rng(0)))
    assert sorted(a) == list(range(20)) and a != list(range(20))
    assert a == list(shuffled(iter(range(20)), 5, np.random.default_rng(0)))
    assert max(abs(v - k) for k, v in enumerate(a)) < 20  # local: a buffer of 5, not a global shuffle


def test_disjoint_shards_per_rank_and_worker(shards):
    slots = 4  # 2 ranks x 2 workers
    s = _stream(shards)
    per_slot = [list(s.positions(0, k, slots)) for k in range(slots)]
    shard_sets = [set(s.slot_shards(0, k, slots)) for k in range(slots)]
    assert all(a.isdisjoint(b) for i, a in enumerate(shard_sets) for b in shard_sets[i + 1:])
    assert set().union(*shard_sets) == set(range(7))
    assert len({len(p) for p in per_slot}) == 1 and len(per_slot[0]) % 2 == 0  # equal whole batches per slot
    assert all({k for k, _ in p} <= shard_sets[i] for i, p in enumerate(per_slot))
    # the real loaders: rank 0 with two workers, rank 1 with two workers, see disjoint examples, as predicted
    seen = []
    for rank in range(2):
        loader = torch.utils.data.DataLoader(_stream(shards).shard(2, rank), batch_size=2, num_workers=2,
                                             collate_fn=s.collator())
        seen.append(_ids(loader))
    assert set(seen[0]).isdisjoint(seen[1]) and len(seen[0]) == len(seen[1]) == 2 * len(per_slot[0])
    rows = {(k, r): i for k, f in enumerate(s.files) for r, i in enumerate(pq.read_table(f, columns=["id"])["id"].to_pylist())}
    first_batches = [rows[p] for p in per_slot[2][:2]] + [rows[p] for p in per_slot[3][:2]]
    assert seen[1][:4] == first_batches  # rank 1's workers read slots 2 and 3, in turn
    batch = next(iter(torch.utils.data.DataLoader(_stream(shards), batch_size=2, collate_fn=s.collator())))
    assert batch.pixel_values.shape == (2, 3, 64, 64) and batch.input_ids.shape[0] == 2


def test_seeded_order_changes_with_epoch_and_seed(shards):
    def order(**kw):
        s = _stream(shards, **kw)
        s.set_epoch(kw.pop("epoch", 0) if "epoch" in kw else 0)
        return [r for r in s.positions(s.epoch, 0, 1)]

    first = order()
    assert first == order() and len(first) == 50
    s = _stream(shards)
    assert list(s.positions(1, 0, 1)) != first and sorted(s.positions(1, 0, 1)) == sorted(first)
    assert list(_stream(shards, seed=2).positions(0, 0, 1)) != first


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_mid_epoch(shards, workers):
    s = _stream(shards)
    s.set_epoch(1)
    loader = torch.utils.data.DataLoader(s, batch_size=2, num_workers=workers, collate_fn=s.collator())
    full = [b.ids for b in loader]
    assert len(full) == s.batches_per_epoch(workers) and len({i for b in full for i in b}) == 2 * len(full)
    for done in (1, 3, len(full) - 1):
        s.seek(done)
        assert [b.ids for b in loader] == full[done:]
        s.seek(0)
    resumed = _stream(shards)
    resumed.set_epoch(1)
    resumed.seek(3)
    second = torch.utils.data.DataLoader(resumed, batch_size=2, num_workers=workers, collate_fn=s.collator())
    batch = next(iter(second))
    assert batch.ids == full[3]
    ref = next(b for k, b in enumerate(loader) if k == 0)  # pixels equal too, not only the ids
    assert ref.ids == full[0]


def test_layout_change_refuses_resume(shards):
    s = _stream(shards)
    state = s.state(5, num_workers=2)
    s.check_state(state, num_workers=2)
    with pytest.raises(ValueError, match=r"num_workers 2 -> 1.*cannot resume at the same example"):
        s.check_state(state, num_workers=1)
    with pytest.raises(ShardError, match="7 shards cannot feed 8 readers"):
        list(s.shard(4, 0).positions(0, 0, 8))
