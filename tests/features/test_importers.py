"""Importers of the feature formats users already hold; every fixture file is written here."""
from __future__ import annotations

import base64
import csv
import os

import numpy as np
import pytest

from vlkit.cli import main as cli
from vlkit.features.importers import import_features
from vlkit.features.store import FeatureStore
from vlkit.io import UnsafePickleError


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def _regions(seed: int, n: int = 12, d: int = 8, c: int = 5) -> dict:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 40, (n, 2))
    return {
        "boxes": np.concatenate([xy, xy + rng.uniform(2, 30, (n, 2))], 1).astype(np.float32),
        "features": rng.normal(size=(n, d)).astype(np.float32),
        "cls_prob": rng.dirichlet(np.ones(c), n).astype(np.float32),
        "objects_id": rng.integers(0, c - 1, n).astype(np.int64), "objects_conf": rng.uniform(0, 1, n).astype(np.float32),
        "attrs_id": rng.integers(0, 3, n).astype(np.int64), "attrs_conf": rng.uniform(0, 1, n).astype(np.float32),
        "h": 80 + seed, "w": 90 + seed,
    }


def _write_tsv(path, rows):
    with open(path, "w", newline="") as f:
        csv.writer(f, delimiter="\t").writerows(rows)


def _order(conf):
    return np.argsort(-conf, kind="stable")


def test_lxmert_tsv(tmp_path):
    regs = {f"COCO_{i}": _regions(i) for i in range(3)}
    _write_tsv(tmp_path / "feats.tsv", [
        [k, r["h"], r["w"], _b64(r["objects_id"]), _b64(r["objects_conf"]), _b64(r["attrs_id"]),
         _b64(r["attrs_conf"]), len(r["boxes"]), _b64(r["boxes"]), _b64(r["features"])] for k, r in regs.items()
    ])
    with pytest.warns(UserWarning, match="no soft object labels"):
        out = import_features(tmp_path / "feats.tsv", "lxmert_tsv", tmp_path / "s.h5", progress=False)
    store = FeatureStore(out)
    assert sorted(store.ids()) == sorted(regs) and not store.has_soft_labels and store.feature_dim == 8
    for k, r in regs.items():
        got, o = store.load(k, num_bb=100), _order(r["objects_conf"])
        np.testing.assert_array_equal(got.features, r["features"][o])
        np.testing.assert_array_equal(got.boxes, r["boxes"][o])
        np.testing.assert_array_equal(got.attrs_id, r["attrs_id"][o])
        np.testing.assert_array_equal(got.conf, r["objects_conf"][o])
        assert (got.image_h, got.image_w) == (r["h"], r["w"])


@pytest.mark.parametrize("with_cls_prob", [False, True])
def test_butd_tsv(tmp_path, with_cls_prob):
    regs = {str(100 + i): _regions(i) for i in range(3)}
    rows = []
    for k, r in regs.items():  # note: image_w before image_h in BUTD TSVs
        row = [k, r["w"], r["h"], len(r["boxes"]), _b64(r["boxes"]), _b64(r["features"])]
        rows.append(row + [_b64(r["cls_prob"])] if with_cls_prob else row)
    (tmp_path / "tsv").mkdir()
    _write_tsv(tmp_path / "tsv" / "part0.tsv", rows)
    out = tmp_path / "s.h5"
    assert cli(["import-features", f"src={tmp_path / 'tsv'}", "format=butd_tsv", f"out={out}", "progress=false"]) == 0
    store = FeatureStore(out)
    assert store.has_soft_labels == with_cls_prob and len(store) == 3
    for k, r in regs.items():
        got = store.load(k, num_bb=100)
        if with_cls_prob:
            o = _order(r["cls_prob"][:, 1:].max(1))
            np.testing.assert_array_equal(got.cls_prob, r["cls_prob"][o])
            np.testing.assert_allclose(got.conf, r["cls_prob"][o, 1:].max(1))
        else:
            o = np.arange(len(r["boxes"]))
            assert got.conf is None
        np.testing.assert_array_equal(got.features, r["features"][o])
        assert (got.image_h, got.image_w) == (r["h"], r["w"])


def test_tsv_errors_name_file_line_and_field(tmp_path):
    r = _regions(0)
    good = ["1", r["w"], r["h"], len(r["boxes"]), _b64(r["boxes"]), _b64(r["features"])]
    _write_tsv(tmp_path / "a.tsv", [good, good[:5]])
    with pytest.raises(ValueError, match=r"a\.tsv:2: 5 tab-separated fields"):
        import_features(tmp_path / "a.tsv", "butd_tsv", tmp_path / "s.h5", progress=False)
    _write_tsv(tmp_path / "b.tsv", [good, ["7"] + good[1:4] + [_b64(r["boxes"][:, :3])] + good[5:]])
    with pytest.raises(ValueError, match=r"b\.tsv:2 \(id '7'\): field boxes"):
        import_features(tmp_path / "b.tsv", "butd_tsv", tmp_path / "s2.h5", progress=False)
    # the completed first image is kept for a resumed run, and nothing was published
    assert not (tmp_path / "s2.h5").exists() and (tmp_path / "s2.h5.parts").exists()
    with pytest.raises(ValueError, match="format"):
        import_features(tmp_path / "b.tsv", "caffe", tmp_path / "s3.h5")


def test_uniter_npz_bit_exact_fp16_and_image_sizes(tmp_path):
    d = tmp_path / "npz"
    d.mkdir()
    regs = {f"nlvr2_dev-{i}-img0": _regions(i, c=7) for i in range(3)}
    for k, r in regs.items():
        w, h = r["w"], r["h"]
        b = r["boxes"]
        norm_bb = np.concatenate([b / [w, h, w, h], (b[:, 2:3] - b[:, 0:1]) / w, (b[:, 3:4] - b[:, 1:2]) / h], 1)
        conf = np.sort(r["cls_prob"][:, 1:].max(1))[::-1]  # generate_npz sorts by max_conf
        np.savez_compressed(d / f"{k}.npz", norm_bb=norm_bb.astype(np.float16), features=r["features"].astype(np.float16),
                            conf=conf.astype(np.float16), soft_labels=r["cls_prob"].astype(np.float16))
    out = import_features(d, "uniter_npz", tmp_path / "s.h5", progress=False)
    store = FeatureStore(out)
    assert store.has_soft_labels and store.num_classes == 7 and store.attrs["dtype"] == "float16"
    assert "normalized" in store.attrs["box_units"]
    for k, r in regs.items():
        got = store.load(k, num_bb=100)
        with np.load(d / f"{k}.npz") as z:
            np.testing.assert_array_equal(got.features, z["features"].astype(np.float32))  # bit-exact
            np.testing.assert_array_equal(got.cls_prob, z["soft_labels"].astype(np.float32))
            np.testing.assert_array_equal(got.boxes, z["norm_bb"][:, :4].astype(np.float32))
        assert (got.image_h, got.image_w) == (1, 1)
    sizes = {k: [r["h"], r["w"]] for k, r in regs.items()}
    out2 = import_features(d, "uniter_npz", tmp_path / "p.h5", image_sizes=sizes, progress=False)
    k, r = next(iter(regs.items()))
    got = FeatureStore(out2).load(k, num_bb=100)
    np.testing.assert_allclose(got.boxes, r["boxes"], rtol=2e-3, atol=0.1)
    assert (got.image_h, got.image_w) == (r["h"], r["w"])
    with pytest.raises(KeyError, match="image_sizes"):
        import_features(d, "uniter_npz", tmp_path / "q.h5", image_sizes={}, progress=False)


def test_bua_npz_info_is_read_without_unpickling_classes(tmp_path):
    d = tmp_path / "bua"
    d.mkdir()
    regs = {f"img{i}": _regions(i) for i in range(2)}
    for k, r in regs.items():
        info = {"image_id": k, "image_h": r["h"], "image_w": r["w"], "num_boxes": len(r["boxes"]),
                "objects_id": r["objects_id"], "objects_conf": r["objects_conf"],
                "attrs_id": r["attrs_id"], "attrs_conf": r["attrs_conf"]}
        np.savez_compressed(d / f"{k}.npz", x=r["features"], bbox=r["boxes"], num_bbox=len(r["boxes"]),
                            image_h=r["h"], image_w=r["w"], info=info)
    with pytest.warns(UserWarning, match="no soft object labels"):
        out = import_features(d, "bua_npz", tmp_path / "s.h5", progress=False)
    store = FeatureStore(out)
    assert not store.has_soft_labels and store.attrs["has_soft_labels"] is False
    assert "no soft labels" in store.attrs["note"]
    for k, r in regs.items():
        got, o = store.load(k, num_bb=100), _order(r["objects_conf"])
        np.testing.assert_array_equal(got.features, r["features"][o])
        np.testing.assert_array_equal(got.objects_id, r["objects_id"][o])
        np.testing.assert_array_equal(got.attrs_conf, r["attrs_conf"][o])

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch pwned",))

    bad = tmp_path / "bad"
    bad.mkdir()
    r = regs["img0"]
    info = np.empty((), dtype=object)
    info[()] = {"objects_conf": r["objects_conf"], "x": Evil()}
    with open(bad / "evil.npz", "wb") as f:
        np.savez(f, x=r["features"], bbox=r["boxes"], info=info)
    with pytest.raises(UnsafePickleError, match="posix.system|os.system"):
        import_features(bad, "bua_npz", tmp_path / "e.h5", progress=False)
    assert not (tmp_path / "pwned").exists() and not os.path.exists("pwned")
    np.savez(bad / "evil.npz", x=r["features"], bbox=r["boxes"])
    with pytest.raises(ValueError, match=r"evil\.npz.*missing \['info'\]"):
        import_features(bad, "bua_npz", tmp_path / "e.h5", resume=False, progress=False)
