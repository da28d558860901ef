"""The h5 feature store: round trip, load-time box selection, atomic + resumable writes, clear errors."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import torch

from vlkit.features.store import FeatureStore, FeatureStoreError, FeatureStoreWriter, num_boxes

PROV = {"detector": "test", "weights_sha256": "abc", "conf_th": 0.2}


def _image(seed: int, n: int = 20, d: int = 16, c: int = 6, a: int = 4) -> dict:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 50, (n, 2))
    return {
        "features": rng.normal(size=(n, d)).astype(np.float32),
        "boxes": np.concatenate([xy, xy + rng.uniform(1, 40, (n, 2))], 1).astype(np.float32),
        "image_h": 100, "image_w": 120,
        "cls_prob": rng.dirichlet(np.ones(c), n).astype(np.float32),
        "attr_prob": rng.dirichlet(np.ones(a), n).astype(np.float32),
        "conf": rng.uniform(0, 1, n).astype(np.float32),
        "objects_id": rng.integers(0, c - 1, n), "objects_conf": rng.uniform(0, 1, n).astype(np.float32),
    }


def _write(path, ids, **kw):
    with FeatureStoreWriter(path, provenance=PROV, **kw) as w:
        for i in ids:
            w.add(i, **_image(sum(map(ord, i))))
    return path


def test_round_trip_sorted_by_conf_and_metadata(tmp_path):
    path = tmp_path / "f.h5"
    images = {f"img{i}": _image(i) for i in range(3)}
    images["a/b%c"] = _image(9)  # ids with '/' and '%' survive
    with FeatureStoreWriter(path, provenance=PROV, dtype="float32") as w:
        for k, v in images.items():
            w.add(k, **v)
    store = FeatureStore(path)
    assert sorted(store.ids()) == sorted(images) and len(store) == 4 and "a/b%c" in store and "nope" not in store
    assert store.feature_dim == 16 and store.num_classes == 6 and store.has_soft_labels
    assert store.attrs["weights_sha256"] == "abc" and store.attrs["box_order"] == "descending conf"
    assert store.attrs["vlkit_version"]
    for k, v in images.items():
        r = store.load(k, num_bb=100)
        order = np.argsort(-v["conf"], kind="stable")
        np.testing.assert_array_equal(r.features, v["features"][order])
        np.testing.assert_array_equal(r.boxes, v["boxes"][order])
        np.testing.assert_array_equal(r.cls_prob, v["cls_prob"][order])
        np.testing.assert_array_equal(r.objects_id, v["objects_id"][order])
        assert (r.image_h, r.image_w) == (100, 120) and r.attrs_id is None
        assert r.features.dtype == np.float32 and np.all(np.diff(r.conf) <= 0)


def test_float16_storage_rounds_through_fp16(tmp_path):
    path = tmp_path / "f.h5"
    img = _image(0)
    with FeatureStoreWriter(path, provenance=PROV) as w:
        w.add("x", **img)
    r = FeatureStore(path).load("x", num_bb=100)
    order = np.argsort(-img["conf"], kind="stable")
    np.testing.assert_array_equal(r.features, img["features"][order].astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(r.boxes, img["boxes"][order])  # boxes stay float32


@pytest.mark.parametrize("n_above,expected", [(15, 15), (3, 10), (150, 100), (0, 10)])
def test_load_time_box_selection_uniter_rule(tmp_path, n_above, expected):
    n = 160
    conf = np.where(np.arange(n) < n_above, 0.9, 0.1).astype(np.float32)
    conf[n_above] = 0.2  # UNITER counts conf > conf_th: 0.2 itself does not count
    img = {**_image(0, n=n), "conf": conf}
    path = tmp_path / "f.h5"
    with FeatureStoreWriter(path, provenance=PROV) as w:
        w.add("x", **img)
    store = FeatureStore(path)
    assert len(store.load("x")) == expected == num_boxes(conf)
    assert len(store.load("x", num_bb=36)) == 36
    assert len(store.load("x", conf_th=0.05, max_bb=200)) == n
    small = {**_image(1, n=5)}
    with FeatureStoreWriter(path, provenance=PROV) as w:
        w.add("few", **small)
    assert len(FeatureStore(path).load("few", num_bb=36)) == 5  # fewer rows than asked: all of them


def test_resume_after_simulated_kill(tmp_path):
    path = tmp_path / "f.h5"
    script = textwrap.dedent(f"""
        import os, signal, numpy as np
        from vlkit.features.store import FeatureStoreWriter
        w = FeatureStoreWriter({str(path)!r}, provenance={PROV!r}, flush_every=4)
        for i in range(10):
            w.add(f"img{{i}}", features=np.full((3, 8), i, np.float32), boxes=np.zeros((3, 4), np.float32),
                  image_h=10, image_w=10, conf=np.array([0.5, 0.4, 0.3], np.float32))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=str(tmp_path))
    assert proc.returncode != 0
    assert not path.exists()  # nothing half-written is published
    with FeatureStoreWriter(path, provenance=PROV, flush_every=4) as w:
        assert w.done_ids == {f"img{i}" for i in range(8)}  # two full shards survived, the buffer is lost
        for i in range(8, 12):
            if f"img{i}" not in w.done_ids:
                w.add(f"img{i}", features=np.full((3, 8), i, np.float32), boxes=np.zeros((3, 4), np.float32),
                      image_h=10, image_w=10, conf=np.array([0.5, 0.4, 0.3], np.float32))
    store = FeatureStore(path)
    assert sorted(store.ids(), key=lambda s: int(s[3:])) == [f"img{i}" for i in range(12)]
    assert all(store.load(f"img{i}", num_bb=3).features[0, 0] == i for i in range(12))
    assert not path.with_name("f.h5.parts").exists()


def test_exception_keeps_completed_work_and_resume_appends_to_existing(tmp_path):
    path = tmp_path / "f.h5"
    _write(path, ["a", "b"])
    with pytest.raises(RuntimeError, match="boom"):
        with FeatureStoreWriter(path, provenance=PROV) as w:
            assert w.done_ids == {"a", "b"}
            w.add("c", **_image(3))
            raise RuntimeError("boom")
    assert sorted(FeatureStore(path).ids()) == ["a", "b"]  # the published store is untouched
    with FeatureStoreWriter(path, provenance=PROV) as w:
        assert w.done_ids == {"a", "b", "c"}
        w.add("d", **_image(4))
    assert sorted(FeatureStore(path).ids()) == ["a", "b", "c", "d"]
    with FeatureStoreWriter(path, provenance=PROV, resume=False) as w:
        w.add("z", **_image(5))
    assert FeatureStore(path).ids() == ["z"]


def test_resume_refuses_different_provenance_and_schema(tmp_path):
    path = _write(tmp_path / "f.h5", ["a"])
    with pytest.raises(FeatureStoreError, match="conf_th"):
        FeatureStoreWriter(path, provenance={**PROV, "conf_th": 0.3})
    with FeatureStoreWriter(path, provenance=PROV) as w:
        with pytest.raises(FeatureStoreError, match="'b'"):
            w.add("b", **{**_image(1), "features": np.zeros((20, 32), np.float32)})
        with pytest.raises(FeatureStoreError, match="already"):
            w.add("a", **_image(1))
        with pytest.raises(ValueError, match="'c'.*cls_prob"):
            w.add("c", **{**_image(1), "cls_prob": np.zeros((19, 6), np.float32)})
        with pytest.raises(ValueError, match="NaN"):
            w.add("d", **{**_image(1), "features": np.full((20, 16), np.nan, np.float32)})


def test_truncated_foreign_and_missing(tmp_path):
    path = _write(tmp_path / "f.h5", ["a", "b"])
    with pytest.raises(KeyError, match=r"f\.h5.*'zzz'"):
        FeatureStore(path).load("zzz")
    truncated = tmp_path / "t.h5"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    with pytest.raises(FeatureStoreError, match=r"t\.h5.*truncated"):
        FeatureStore(truncated)
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f.create_dataset("x", data=np.zeros(3))
    with pytest.raises(FeatureStoreError, match=r"foreign\.h5.*not a vlkit feature store"):
        FeatureStore(foreign)
    with pytest.raises(FileNotFoundError, match="missing.h5"):
        FeatureStore(tmp_path / "missing.h5")
    # an image whose datasets disagree is reported with its id
    with h5py.File(path, "r+") as f:
        del f["b"]["boxes"]
        f["b"].create_dataset("boxes", data=np.zeros((2, 4), np.float32))
    with pytest.raises(FeatureStoreError, match="'b'"):
        FeatureStore(path).load("b", num_bb=100)


def test_no_conf_needs_fixed_count(tmp_path):
    path = tmp_path / "f.h5"
    with FeatureStoreWriter(path, provenance=PROV) as w:
        w.add("a", features=np.ones((4, 8)), boxes=np.zeros((4, 4)), image_h=5, image_w=5)
    store = FeatureStore(path)
    assert not store.has_soft_labels and store.num_classes is None and store.attrs["box_order"] == "as written"
    assert len(store.load("a", num_bb=2)) == 2
    with pytest.raises(FeatureStoreError, match="num_bb"):
        store.load("a")


class _Regions(torch.utils.data.Dataset):
    def __init__(self, store, ids):
        self.store, self.ids = store, ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return torch.from_numpy(self.store.load(self.ids[i], num_bb=10).features)


def test_store_works_in_dataloader_workers(tmp_path):
    ids = [f"i{k}" for k in range(8)]
    store = FeatureStore(_write(tmp_path / "f.h5", ids))
    store.load("i0")  # opened in the parent first; workers must reopen their own handle
    loader = torch.utils.data.DataLoader(_Regions(store, ids), batch_size=4, num_workers=2)
    batches = list(loader)
    assert [b.shape for b in batches] == [(4, 10, 16)] * 2


def test_empty_store_then_resume(tmp_path):
    path = tmp_path / "f.h5"
    FeatureStoreWriter(path, provenance=PROV).close()
    assert len(FeatureStore(path)) == 0 and FeatureStore(path).feature_dim == 0
    _write(path, ["a"])
    assert FeatureStore(path).ids() == ["a"]
    with pytest.raises(FeatureStoreError, match="dtype"):
        FeatureStoreWriter(path, provenance=PROV, dtype="float32")
