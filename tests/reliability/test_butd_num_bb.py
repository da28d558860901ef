"""Issue 43: a BUTD TSV store (no detector confidences) needs ``data.image.num_bb``, and the command says so
once for the store, not once per image."""
from __future__ import annotations

import base64
import csv

import numpy as np
from reliability_helpers import captions, jsonl_data, regions, run_args


def _b64(a) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def _butd_tsv(path, image_ids):
    """The 6-field BUTD TSV (``image_id, image_w, image_h, num_boxes, boxes, features``): no ``cls_prob``."""
    with open(path, "w", newline="") as f:
        rows = csv.writer(f, delimiter="\t")
        for k, image_id in enumerate(image_ids):
            r = regions(k, soft=False)
            boxes, features = _b64(r["boxes"]), _b64(r["features"])
            rows.writerow([image_id, r["image_w"], r["image_h"], len(r["boxes"]), boxes, features])
    return path


def test_a_store_without_confidences_asks_for_num_bb_once(tmp_path, vlkit_console):
    image_ids = [f"img{k}" for k in range(12)]
    store = tmp_path / "butd.h5"
    code, _, _ = vlkit_console("import-features", f"src={_butd_tsv(tmp_path / 'feats.tsv', image_ids)}",
                               "format=butd_tsv", f"out={store}", "progress=false")
    assert code == 0
    data = jsonl_data(captions(tmp_path / "caps.jsonl", image_ids), store)
    out = tmp_path / "run"
    code, stdout, err = vlkit_console("pretrain", "model=uniter", "objectives=uniter_mlm_itm", *data, *run_args(out))
    assert code == 1 and not out.exists()
    said = stdout + err
    assert said.count("num_bb") == 1 and said.count("data.image.num_bb") == 1, said
    assert str(store) in err and "conf" in err
    assert not any(image_id in said.replace(str(tmp_path), "") for image_id in ("'img0'", "'img1'"))  # no image named
    code, stdout, err = vlkit_console("pretrain", "model=uniter", "objectives=uniter_mlm_itm", *data, *run_args(out),
                                      "data.image.num_bb=12")
    assert code == 0, err
    assert "num_bb" not in err
