"""Catalogue, class "inputs read partly": every file of an input folder is read or reported with a count per
reason, the two image-folder readers agree, duplicate ids are refused or reported, referred boxes are validated."""
from __future__ import annotations

import json
import logging

import pytest
from PIL import Image
from reliability_helpers import captions, jsonl_data, run_args
from test_regions import _lxmert_row

from vlkit.validate import DataError


def _folder(tmp_path):
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    Image.new("RGB", (64, 48), (200, 30, 30)).save(folder / "top.jpg")
    Image.new("RGB", (64, 48), (30, 200, 30)).save(folder / "sub" / "nested.png")
    Image.new("RGB", (64, 48), (30, 30, 200)).save(folder / "anim.gif")
    Image.new("RGB", (64, 48), (90, 90, 90)).save(folder / "scan.tiff")
    (folder / "IMG_0001.HEIC").write_bytes(b"\x00\x00\x00\x18ftypheic")  # a phone photo Pillow cannot read
    (folder / ".DS_Store").write_bytes(b"\x00")
    return folder


def test_extract_features_reads_subfolders_and_counts_every_file_it_does_not_read(tmp_path, caplog):
    from vlkit.features.commands import image_files

    folder = _folder(tmp_path)
    with caplog.at_level(logging.WARNING):
        files = image_files(folder)
    assert [i for i, _ in files] == ["anim", "nested", "scan", "top"]  # subfolders, GIF and TIFF included
    report = caplog.text
    assert f"2 file(s) of {folder} not read" in report
    assert "1 hidden ('.DS_Store')" in report and "1 with suffix .heic" in report and "'IMG_0001.HEIC'" in report


def test_the_pixel_folder_source_reads_what_extraction_reads(tmp_path, caplog):
    from vlkit.data.images import FolderImages

    images = FolderImages(_folder(tmp_path))
    with caplog.at_level(logging.WARNING):
        assert images.ids() == {"anim", "nested", "scan", "top"}  # GIF / TIFF no longer "missing"
    assert images("anim").size == (64, 48) and images("scan").mode == "RGB"
    assert "1 with suffix .heic" in caplog.text


def test_the_same_image_id_twice_in_an_import_is_refused_or_recorded(tmp_path):
    from vlkit.features.importers import import_features
    from vlkit.features.store import FeatureStore, skipped_path

    tsv = tmp_path / "feats.tsv"
    tsv.write_text(_lxmert_row("a", 5) + "\n" + _lxmert_row("b", 5) + "\n" + _lxmert_row("a", 6) + "\n")
    with pytest.raises(DataError, match=r"feats\.tsv:3 \(id 'a'\): image 'a' appears again \(first at .*feats\.tsv:1 "):
        import_features(tsv, "lxmert_tsv", tmp_path / "o.h5", progress=False)
    out = tmp_path / "skip.h5"
    import_features(tsv, "lxmert_tsv", out, progress=False, on_error="skip")
    assert sorted(FeatureStore(out).ids()) == ["a", "b"]
    skipped = [json.loads(line) for line in skipped_path(out).read_text().splitlines()]
    assert [(r["id"], "appears again" in r["reason"]) for r in skipped] == [("a", True)]


def test_duplicate_example_ids_are_refused_not_dropped_together(tmp_path, data, vlkit_console):
    store, _, ids = data()
    lines = [{"id": "dup", "image_id": ids[k % len(ids)], "caption": "a red circle"} for k in range(14)]
    lines[3]["image_id"] = "ghost_img"  # one bad caption among 14 sharing one id
    caps = tmp_path / "dups.jsonl"
    caps.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "run"
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), "data.on_error=skip",
                                 *run_args(out))
    assert code == 1 and "1 example id(s) appear more than once: 'dup' (14 times)" in err
    assert not (out / "metrics.jsonl").exists()
    fixed = captions(tmp_path / "fixed.jsonl", ids)  # ids of their own: the skip drops only the bad one
    assert vlkit_console("pretrain", "model=uniter", *jsonl_data(fixed, store), "data.on_error=skip",
                         *run_args(out))[0] == 0


def test_refcoco_boxes_outside_their_image_are_refused_by_the_task_reader(tmp_path):
    from vlkit.tasks.refexp import RefExp

    refs = [{"ref_id": 7, "ann_id": 70, "image_id": 5, "split": "train", "sentences": [{"sent_id": 71, "sent": "man"}]},
            {"ref_id": 8, "ann_id": 80, "image_id": 5, "split": "train", "sentences": [{"sent_id": 81, "sent": "dog"}]}]
    instances = {"images": [{"id": 5, "height": 100, "width": 120}],
                 "annotations": [{"id": 70, "image_id": 5, "bbox": [10.0, 20.0, 50.0, 30.0], "category_id": 1},
                                 {"id": 80, "image_id": 5, "bbox": [100.0, 80.0, 60.0, 40.0], "category_id": 1}]}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    cfg = {"source": "files", "refs": str(tmp_path / "refs.json"), "instances": str(tmp_path / "instances.json"),
           "eval_splits": []}
    with pytest.raises(DataError, match=r"refs\.json: 1 referred box\(es\) do not fit their image: ref '8' \(image '5'\): "
                                        r"box 0 \[100, 80, 160, 120\] lies outside the 120x100 px image"):
        RefExp.build_data(cfg, None, lambda image_id: {})
