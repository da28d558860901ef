"""Catalogue, class "writers": a writer builds the new thing beside the old one and swaps it in only when
complete; nothing existing is deleted or replaced unless ``overwrite=true``."""
from __future__ import annotations

import json

from PIL import Image
from reliability_helpers import regions

from vlkit.data.shards import read_manifest


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _images_and_captions(tmp_path, n: int, missing_at: int | None = None):
    images = tmp_path / "images"
    images.mkdir(exist_ok=True)
    lines = []
    for k in range(n):
        if k != missing_at:
            Image.new("RGB", (16, 16), (k * 7 % 255, 0, 0)).save(images / f"im{k}.png")
        lines.append(json.dumps({"image_id": f"im{k}", "caption": f"a red square {k}"}))
    caps = tmp_path / f"caps{n}_{missing_at}.jsonl"
    caps.write_text("\n".join(lines) + "\n")
    return images, caps


def _make_shards(vlkit_console, caps, images, out, *extra):
    return vlkit_console("make-shards", "source=jsonl", f"path={caps}", f"images={images}", f"out={out}",
                         "shard_size=10", *extra)


def test_make_shards_over_existing_shards_fails_half_way_and_keeps_them(tmp_path, vlkit_console):
    images, caps = _images_and_captions(tmp_path, 40)
    out = tmp_path / "shards"
    assert _make_shards(vlkit_console, caps, images, out)[0] == 0
    good = _snapshot(out)
    other = tmp_path / "other"
    other.mkdir()
    bad_images, bad_caps = _images_and_captions(other, 40, missing_at=30)
    code, _, err = _make_shards(vlkit_console, bad_caps, bad_images, out, "overwrite=true")
    assert code == 1 and "'im30'" in err  # the missing image on line 31 is named ...
    assert _snapshot(out) == good and read_manifest(out)["rows"] == 40  # ... and the good data set is whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".shards")] == []  # no temporary left


def test_make_shards_from_an_empty_source_keeps_the_existing_shards(tmp_path, vlkit_console):
    images, caps = _images_and_captions(tmp_path, 12)
    out = tmp_path / "shards"
    assert _make_shards(vlkit_console, caps, images, out)[0] == 0
    good = _snapshot(out)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = vlkit_console("make-shards", "source=jsonl", f"path={empty}", f"out={out}", "overwrite=true")
    assert code == 1 and "no records to write" in err and "existing shards are kept" in err
    assert _snapshot(out) == good


def test_make_shards_refuses_an_existing_folder_unless_overwrite(tmp_path, vlkit_console):
    images, caps = _images_and_captions(tmp_path, 12)
    out = tmp_path / "shards"
    assert _make_shards(vlkit_console, caps, images, out)[0] == 0
    good = _snapshot(out)
    code, _, err = _make_shards(vlkit_console, caps, images, out, "shard_size=4")
    assert code == 1 and f"out={out} is a folder that is not empty" in err and "overwrite=true" in err
    assert _snapshot(out) == good
    assert _make_shards(vlkit_console, caps, images, out, "shard_size=4", "overwrite=true")[0] == 0
    assert len(read_manifest(out)["shards"]) == 3  # replaced by the complete new set
    (tmp_path / "a_file").write_text("keep me")
    code, _, err = _make_shards(vlkit_console, caps, images, tmp_path / "a_file")
    assert code == 1 and "is a file" in err and (tmp_path / "a_file").read_text() == "keep me"


def test_merge_features_refuses_an_existing_store_unless_overwrite(tmp_path, vlkit_console):
    from vlkit.features.shards import build_index, shard_name, shard_of
    from vlkit.features.store import FeatureStore, FeatureStoreWriter

    src = tmp_path / "many"
    src.mkdir()
    ids = [f"img{k}" for k in range(6)]
    for rank in range(2):
        with FeatureStoreWriter(src / shard_name(rank, 2), provenance={"detector": "t"}, dtype="float32") as w:
            for image_id in ids:
                if shard_of(image_id, 2) == rank:
                    w.add(image_id, **regions(int(image_id[3:])))
    build_index(src)
    out = tmp_path / "store.h5"
    out.write_bytes(b"an existing store")
    code, _, err = vlkit_console("merge-features", f"src={src}", f"out={out}")
    assert code == 1 and f"out={out} is a file" in err and "overwrite=true" in err
    assert out.read_bytes() == b"an existing store"
    assert vlkit_console("merge-features", f"src={src}", f"out={out}", "overwrite=true")[0] == 0
    assert len(FeatureStore(out)) == 6
