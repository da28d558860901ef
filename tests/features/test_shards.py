"""Sharded feature stores: a directory of shards + index reads exactly like the one-file store; shards are
checked against each other (errors name the shard file); merge-features joins them."""
from __future__ import annotations

import json

import numpy as np
import pytest

from vlkit.cli import main as cli
from vlkit.features.shards import INDEX, build_index, merge_shards, read_index, shard_name, shard_of
from vlkit.features.store import FeatureStore, FeatureStoreError, FeatureStoreWriter

from test_store import PROV, _image  # tests/features is on sys.path (rootdir-less test modules)

IDS = [f"img{i}" for i in range(9)] + ["a/b%c"]


def _write(path, ids, provenance=PROV, **kw):
    with FeatureStoreWriter(path, provenance=provenance, dtype="float32", **kw) as w:
        for i in ids:
            w.add(i, **_image(sum(map(ord, i))))
    return path


def _sharded(directory, n=3, ids=IDS):
    directory.mkdir()
    for rank in range(n):
        _write(directory / shard_name(rank, n), [i for i in ids if shard_of(i, n) == rank])
    build_index(directory)
    return directory


def test_shard_of_is_stable_and_spreads():
    assert [shard_of(f"img{i}", 4) for i in range(8)] == [shard_of(f"img{i}", 4) for i in range(8)]
    assert shard_of("img0", 4) == 3 and shard_of("a/b%c", 3) == 2  # fixed values: a hash that changed breaks resume
    counts = np.bincount([shard_of(str(i), 4) for i in range(4000)], minlength=4)
    assert counts.min() > 900
    with pytest.raises(ValueError):
        shard_of("x", 0)


def test_sharded_store_reads_like_one_file(tmp_path):
    one = FeatureStore(_write(tmp_path / "one.h5", IDS))
    many = FeatureStore(_sharded(tmp_path / "many"))
    assert len(read_index(tmp_path / "many")["shards"]) == 3
    assert sorted(many.ids()) == sorted(one.ids()) and len(many) == len(one) == 10
    assert "a/b%c" in many and "nope" not in many
    assert many.schema == one.schema and many.feature_dim == 16 and many.num_classes == 6 and many.has_soft_labels
    assert many.attrs["weights_sha256"] == "abc" and many.attrs["box_order"] == "descending conf"
    for i in IDS:
        for kw in ({"num_bb": 100}, {"num_bb": 3}, {}):
            a, b = one.load(i, **kw), many.load(i, **kw)
            for field in ("features", "boxes", "conf", "cls_prob", "attr_prob", "objects_id"):
                np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
            assert (a.image_h, a.image_w) == (b.image_h, b.image_w)
    with pytest.raises(KeyError, match="'nope' not in the store"):
        many.load("nope")
    merged = FeatureStore(merge_shards(tmp_path / "many", tmp_path / "merged.h5"))
    assert sorted(merged.ids()) == sorted(IDS)
    np.testing.assert_array_equal(merged.load("img3", num_bb=100).features, one.load("img3", num_bb=100).features)


def test_sharded_store_in_dataloader_workers(tmp_path):
    import torch

    store = FeatureStore(_sharded(tmp_path / "many"))

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return len(IDS)

        def __getitem__(self, k):
            return torch.from_numpy(store.load(IDS[k], num_bb=4).features)

    got = list(torch.utils.data.DataLoader(DS(), batch_size=5, num_workers=2))
    np.testing.assert_array_equal(got[1][0].numpy(), store.load(IDS[5], num_bb=4).features)


def test_shards_are_checked_against_each_other(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    _write(d / shard_name(0, 2), ["a", "b"])
    _write(d / shard_name(1, 2), ["c"], provenance={**PROV, "conf_th": 0.3})
    with pytest.raises(FeatureStoreError, match=r"shard-00001-of-00002.h5: written with different settings .*conf_th"):
        build_index(d)
    _write(d / shard_name(1, 2), ["b"], resume=False)
    with pytest.raises(FeatureStoreError, match=r"shard-00001-of-00002.h5: image 'b' is also in shard-00000-of-00002"):
        build_index(d)
    _write(d / shard_name(1, 2), ["c"], resume=False)
    with pytest.raises(FeatureStoreError, match="no index of the sharded feature store"):
        FeatureStore(d)
    build_index(d)
    assert sorted(FeatureStore(d).ids()) == ["a", "b", "c"]
    _write(d / shard_name(1, 2), ["c", "d"], resume=False)  # changed after the index was built
    with pytest.raises(FeatureStoreError, match=r"shard-00001-of-00002.h5: changed since .*index.json was built"):
        FeatureStore(d)
    (d / shard_name(1, 2)).with_name(shard_name(1, 2) + ".parts").mkdir()
    with pytest.raises(FeatureStoreError, match="unfinished shard"):
        build_index(d)


def test_merge_features_cli(tmp_path, capsys):
    d = _sharded(tmp_path / "many")
    (d / INDEX).unlink()
    assert cli(["merge-features", f"src={d}"]) == 0
    assert "10 images in 3 shards" in capsys.readouterr().out
    index = json.loads((d / INDEX).read_text())
    assert sum(s["num_images"] for s in index["shards"]) == 10
    assert cli(["merge-features", f"src={d}", f"out={tmp_path / 'all.h5'}"]) == 0
    assert len(FeatureStore(tmp_path / "all.h5")) == 10
