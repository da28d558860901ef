"""Catalogue: regions on their way into and out of a feature store (writer, importers, reader)."""
from __future__ import annotations

import base64
import json

import h5py
import numpy as np
import pytest
from reliability_helpers import CLASSES, FEAT, raw_store, regions

from vlkit.features.importers import import_features
from vlkit.features.store import FeatureStore, FeatureStoreError, FeatureStoreWriter, InvalidRegionsError, skipped_path


def _write(path, image_id="bad", **changes):
    fields = {**regions(0), **changes}
    with FeatureStoreWriter(path, provenance={"test": 1}) as w:
        w.add("good", **regions(1))
        w.add(image_id, **fields)


@pytest.mark.parametrize("change,message", [
    (dict(features=np.zeros((0, FEAT), np.float32), boxes=np.zeros((0, 4), np.float32), conf=np.zeros(0, np.float32),
          cls_prob=np.zeros((0, CLASSES), np.float32)), "no boxes"),
    (dict(boxes=np.tile(np.array([[500, 500, 900, 900]], np.float32), (12, 1))), r"box 0 \[500, 500, 900, 900\] lies outside the 120x100 px image"),
    (dict(boxes=np.tile(np.array([[50, 10, 20, 40]], np.float32), (12, 1))), r"box 0 \[50, 10, 20, 40\] is not ordered"),
    (dict(features=np.full((12, FEAT), np.nan, np.float32)), "features hold NaN or inf"),
    (dict(cls_prob=np.full((12, CLASSES), np.inf, np.float32)), "cls_prob holds NaN or inf"),
])
def test_writer_refuses_bad_regions_and_keeps_the_rest(tmp_path, change, message):
    path = tmp_path / "f.h5"
    with pytest.raises(InvalidRegionsError, match=rf"f\.h5: image 'bad': .*{message}"):
        _write(path, **change)
    with FeatureStoreWriter(path, provenance={"test": 1}) as w:  # nothing already written is lost
        assert w.done_ids == {"good"}
    assert FeatureStore(path).ids() == ["good"]


def test_reader_validates_regions_of_a_store_written_by_another_tool(tmp_path):
    images = {"ok": regions(0), "nan": regions(1), "out": regions(2), "empty": regions(3)}
    images["nan"]["features"][3, 2] = np.nan
    images["out"]["boxes"][0] = [0, 0, 500, 50]
    images["empty"] = {k: (v[:0] if isinstance(v, np.ndarray) else v) for k, v in images["empty"].items()}
    store = FeatureStore(raw_store(tmp_path / "old.h5", images))
    assert len(store.load("ok", num_bb=100)) == 12
    for image_id, message in (("nan", r"features hold NaN or inf \(rows 3\)"), ("out", "lies outside"),
                              ("empty", "no boxes")):
        with pytest.raises(InvalidRegionsError, match=rf"old\.h5: image '{image_id}': .*{message}"):
            store.load(image_id, num_bb=100)


def _b64(a) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def _lxmert_row(image_id: str, n: int, h: int = 100, w: int = 120) -> str:
    """A row whose boxes lie in a 120x100 px image, declared ``w`` x ``h``."""
    r = regions(7, n=max(n, 1))
    ids, conf = np.zeros(n, np.int64), r["conf"][:n]
    return "\t".join([image_id, str(h), str(w), _b64(ids), _b64(conf), _b64(ids), _b64(conf), str(n),
                      _b64(r["boxes"][:n]), _b64(r["features"][:n])])


def test_lxmert_tsv_first_row_without_boxes_blames_that_row(tmp_path):
    tsv = tmp_path / "feats.tsv"
    tsv.write_text(_lxmert_row("empty_img", 0) + "\n" + _lxmert_row("good_img", 5) + "\n")
    with pytest.raises(InvalidRegionsError, match=r"feats\.tsv:1 \(id 'empty_img'\).*no boxes") as err:
        import_features(tsv, "lxmert_tsv", tmp_path / "o.h5", progress=False)
    assert "good_img" not in str(err.value)
    import_features(tsv, "lxmert_tsv", tmp_path / "o.h5", progress=False, on_error="skip")
    store = FeatureStore(tmp_path / "o.h5")
    assert store.ids() == ["good_img"] and store.feature_dim == FEAT  # the empty row fixed nothing
    assert json.loads(skipped_path(tmp_path / "o.h5").read_text())["id"] == "empty_img"


def test_importer_refuses_boxes_outside_the_image_with_file_and_line(tmp_path):
    tsv = tmp_path / "feats.tsv"
    tsv.write_text(_lxmert_row("a", 5) + "\n" + _lxmert_row("small", 5, h=10, w=10) + "\n")
    with pytest.raises(InvalidRegionsError, match=r"feats\.tsv:2 \(id 'small'\).*lies outside the 10x10 px image"):
        import_features(tsv, "lxmert_tsv", tmp_path / "o.h5", progress=False)
    shards = sorted((tmp_path / "o.h5.parts").glob("shard-*.h5"))  # 'a' was kept in a committed shard
    assert [k for s in shards for k in h5py.File(s, "r")] == ["a"]
    import_features(tsv, "lxmert_tsv", tmp_path / "o.h5", progress=False, on_error="skip")
    assert FeatureStore(tmp_path / "o.h5").ids() == ["a"]


def test_foreign_h5_with_only_the_format_attribute(tmp_path):
    path = tmp_path / "foreign.h5"
    with h5py.File(path, "w") as f:
        f.attrs["vlkit_format"] = "vlkit-features"
    with pytest.raises(FeatureStoreError, match=r"foreign\.h5: .*lacks the file attribute\(s\) provenance, schema, dtype"):
        FeatureStore(path)


def test_h5_of_a_foreign_schema_and_a_truncated_h5(tmp_path):
    foreign = tmp_path / "butd.h5"
    with h5py.File(foreign, "w") as f:
        f.create_dataset("image_features", data=np.zeros((3, 36, FEAT), np.float32))
        f.create_dataset("image_bb", data=np.zeros((3, 36, 4), np.float32))
    with pytest.raises(FeatureStoreError, match=r"butd\.h5: not a vlkit feature store"):
        FeatureStore(foreign)
    good = raw_store(tmp_path / "good.h5", {"a": regions(0)})
    cut = tmp_path / "cut.h5"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    with pytest.raises(FeatureStoreError, match=r"cut\.h5: cannot open as HDF5.*truncated"):
        FeatureStore(cut)
