"""Pair datasets, image sources, the collator and the registered `data=<name>` entries."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from vlkit.cli import compose
from vlkit.data import (FolderImages, ImageTextPairs, PixelSource, RegionSource, TokenBucketSampler, VLCollator,
                        padding_fraction, shapes_tokenizer)
from vlkit.registry import DATASETS
from vlkit.types import VLBatch


# ---- a tiny feature store in the `vlkit.features.store` layout --------------------------------
def _regions(num_images=6, dim=8, classes=5, seed=0):
    """image id -> (features, boxes, conf (descending), cls_prob, h, w)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(num_images):
        n = 12 + 3 * i
        xy = rng.uniform(0, 50, (n, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(5, 40, (n, 2))], 1).astype(np.float32)
        prob = rng.dirichlet(np.ones(classes), n).astype(np.float32)
        conf = np.sort(rng.uniform(0, 1, n))[::-1].astype(np.float32)
        out[str(i)] = (rng.normal(size=(n, dim)).astype(np.float32), boxes, conf, prob, 90 + i, 120 + i)
    return out


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    from vlkit.features.store import FeatureStoreWriter

    path = tmp_path_factory.mktemp("feats") / "feats.h5"
    with FeatureStoreWriter(path, provenance={"test": "data"}, dtype="float32") as w:
        for image_id, (feats, boxes, conf, prob, h, w_) in _regions().items():
            w.add(image_id, features=feats, boxes=boxes, conf=conf, cls_prob=prob, image_h=h, image_w=w_)
    return path


def _records(n_images=6, per_image=2):
    words = ["red", "circle", "left", "of", "the", "blue", "square", "large"]
    rng = np.random.default_rng(1)
    return [{"id": f"{i}#{k}", "image_id": str(i), "caption": " ".join(rng.choice(words, rng.integers(1, 12)))}
            for i in range(n_images) for k in range(per_image)]


# ---- region source ---------------------------------------------------------------------------
def test_region_source_normalises_boxes_and_chooses_box_counts(store_path):
    feats, boxes, conf, prob, h, w = _regions()["2"]
    src = RegionSource(store_path, conf_th=0.5, min_bb=3, max_bb=15)
    out = src("2")
    n = min(15, max(3, int((conf > 0.5).sum())))
    assert out["region_feats"].shape == (n, 8) and out["region_soft_labels"].shape == (n, 5)
    assert torch.allclose(out["region_boxes"], torch.from_numpy(boxes[:n]) / torch.tensor([w, h, w, h]))
    assert torch.equal(out["region_feats"], torch.from_numpy(feats[:n]))
    assert out["image_size"].tolist() == [h, w] and src.units("2") == n
    assert RegionSource(store_path, num_bb=4)("2")["region_feats"].shape[0] == 4
    assert "region_soft_labels" not in RegionSource(store_path, soft_labels=False)("2")
    with pytest.raises(KeyError, match="'99' not in the store"):
        src("99")
    clone = pickle.loads(pickle.dumps(src))  # what a DataLoader worker gets
    assert torch.equal(clone("3")["region_feats"], src("3")["region_feats"])


def test_pairs_over_regions_collate_to_a_padded_batch(store_path):
    tok = shapes_tokenizer()
    ds = ImageTextPairs(_records(), tok, RegionSource(store_path, conf_th=0.5, min_bb=2), max_len=8)
    examples = [ds[k] for k in (0, 5, 11)]
    batch = ds.collator()(examples)
    assert isinstance(batch, VLBatch) and batch.has_regions and not batch.has_pixels
    assert batch.ids == ["0#0", "2#1", "5#1"] and batch.image_ids == ["0", "2", "5"]
    k = [len(e["region_feats"]) for e in examples]
    assert batch.region_feats.shape == (3, max(k), 8) and batch.region_mask.sum(1).tolist() == k
    assert batch.region_soft_labels.shape == (3, max(k), 5) and batch.image_size.shape == (3, 2)
    for row, e in enumerate(examples):
        t = len(e["input_ids"])
        assert batch.input_ids[row, :t].tolist() == e["input_ids"].tolist()
        assert batch.attention_mask[row].tolist() == [1] * t + [0] * (batch.input_ids.shape[1] - t)
        assert (batch.input_ids[row, t:] == tok.pad_token_id).all()
        assert (batch.region_feats[row, k[row]:] == 0).all()
        assert torch.equal(batch.region_boxes[row, :k[row]], e["region_boxes"])
    assert ds.lengths()[5] == (len(ds[5]["input_ids"]), k[1])


# ---- text ------------------------------------------------------------------------------------
def test_truncation_by_default_and_uniter_filtering_as_option(store_path):
    tok = shapes_tokenizer()
    recs = [{"id": "a", "image_id": "0", "caption": "the red circle is to the left of the blue square"},
            {"id": "b", "image_id": "1", "caption": "a red circle"}]
    src = RegionSource(store_path, num_bb=3)
    truncated = ImageTextPairs(recs, tok, src, max_len=6)
    ids = truncated[0]["input_ids"].tolist()
    assert len(ids) == 6 and ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.decode(ids[1:-1]) == "the red circle is"
    filtered = ImageTextPairs(recs, tok, src, max_len=6, filter_long=True)
    assert len(filtered) == 1 and filtered[0]["id"] == "b" and len(filtered[0]["input_ids"]) == 5
    with pytest.raises(ValueError, match="every caption is longer"):
        ImageTextPairs(recs[:1], tok, src, max_len=6, filter_long=True)
    with pytest.raises(KeyError, match="records lack caption"):
        ImageTextPairs([{"id": "x", "image_id": "0", "text": "a"}], tok, src)


def test_any_hf_tokenizer_and_its_pad_id(tmp_path, store_path):
    from transformers import AutoTokenizer, BertTokenizerFast

    words = ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "red", "circle", "a", "[PAD]"]
    BertTokenizerFast(vocab={w: k for k, w in enumerate(words)}).save_pretrained(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert tok.pad_token_id == 7
    ds = ImageTextPairs([{"id": "a", "image_id": "0", "caption": "a red circle"},
                         {"id": "b", "image_id": "1", "caption": "circle"}], tok, RegionSource(store_path, num_bb=2))
    batch = ds.collator()([ds[0], ds[1]])
    assert batch.input_ids.tolist() == [[1, 6, 4, 5, 2], [1, 5, 2, 7, 7]]


# ---- pixels ----------------------------------------------------------------------------------
def test_folder_images_and_pixel_source(tmp_path):
    (tmp_path / "imgs" / "sub").mkdir(parents=True)
    Image.new("RGB", (40, 30), (255, 0, 0)).save(tmp_path / "imgs" / "a.png")
    Image.new("RGB", (20, 50), (0, 0, 255)).save(tmp_path / "imgs" / "sub" / "b.jpg")
    from vlkit.data.images import build_transform

    src = PixelSource(FolderImages(tmp_path / "imgs"), build_transform(32), patch_size=8)
    out = src("b")["pixel_values"]
    assert out.shape == (3, 32, 32) and out[2].mean() > 0.9 and out[0].mean() < 0.1
    assert src.units("a") == 16
    with pytest.raises(KeyError, match="'c' is not in"):
        src("c")
    Image.new("RGB", (5, 5)).save(tmp_path / "imgs" / "sub" / "a.jpg")
    with pytest.raises(ValueError, match="two images are named 'a'"):
        PixelSource(FolderImages(tmp_path / "imgs"))("a")


def test_shapes_dataset_from_config_renders_on_the_fly():
    cfg = compose("data/shapes", ["data.num_images=30", "data.split=val", "data.image.size=64"]).data
    ds = DATASETS.get(cfg.name)(cfg)
    assert len(ds) == 5 * 3  # 3 val images, 5 captions each
    from vlkit.data.shapes import ShapesWorld

    world = ShapesWorld(0, 30)
    ex = ds[7]
    assert ex["id"] == "25#2" and ex["image_id"] == "25"
    assert shapes_tokenizer().decode(ex["input_ids"][1:-1]) == world.captions(25)[2].lower()
    assert ex["pixel_values"].shape == (3, 64, 64) and -1 <= ex["pixel_values"].min() < ex["pixel_values"].max() <= 1
    batch = ds.collator()([ds[k] for k in range(4)])
    assert batch.pixel_values.shape == (4, 3, 64, 64) and batch.input_ids.shape[0] == 4
    assert ds.lengths()[0] == (len(ds[0]["input_ids"]), 16)
    assert pickle.loads(pickle.dumps(ds))[3]["id"] == ds[3]["id"]


def test_registered_file_datasets(tmp_path, store_path):
    img_dir = tmp_path / "images"
    img_dir.mkdir()
    for name in ("COCO_val2014_000000000001", "COCO_val2014_000000000002", "0", "1"):
        Image.new("RGB", (16, 16)).save(img_dir / f"{name}.jpg")
    karpathy = {"images": [{"filepath": "val2014", "filename": f"COCO_val2014_00000000000{i}.jpg", "imgid": i,
                            "cocoid": i, "split": "train", "sentences": [{"raw": "a red circle", "sentid": 10 + i}]}
                           for i in (1, 2)]}
    (tmp_path / "k.json").write_text(json.dumps(karpathy))
    (tmp_path / "c.jsonl").write_text('{"image_id": "0", "caption": "red"}\n{"image_id": "1", "caption": "blue"}\n')
    (tmp_path / "c.tsv").write_text("red circle\thttp://a\nblue\thttp://b\n")
    (tmp_path / "sbu_caps.txt").write_text("red circle\nblue\n")
    (tmp_path / "sbu_urls.txt").write_text("http://a\nhttp://b\n")
    (tmp_path / "vg.json").write_text(json.dumps([{"id": 0, "regions": [
        {"region_id": 5, "image_id": 0, "phrase": "red", "x": 1, "y": 2, "width": 3, "height": 4},
        {"region_id": 6, "image_id": 1, "phrase": "a circle", "x": 1, "y": 2, "width": 3, "height": 4}]}]))
    shapes_tokenizer().save_pretrained(tmp_path / "tok")
    common = [f"data.tokenizer={tmp_path / 'tok'}", "data.image.source=folder", f"data.image.path={img_dir}",
              "data.image.size=32"]
    files = {"coco": {"path": "k.json"}, "flickr30k": {"path": "k.json"}, "jsonl": {"path": "c.jsonl"},
             "cc": {"path": "c.tsv"}, "vg": {"path": "vg.json"}, "sbu": {"captions": "sbu_caps.txt", "urls": "sbu_urls.txt"}}
    for name, keys in files.items():
        overrides = [f"data.{k}={tmp_path / f}" for k, f in keys.items()] + common
        cfg = compose(f"data/{name}", overrides + (["data.split=train"] if name == "coco" else [])).data
        ds = DATASETS.get(cfg.name)(cfg)
        assert len(ds) == 2 and ds[1]["pixel_values"].shape == (3, 32, 32), name
    from omegaconf import OmegaConf

    coco = compose("data/coco", [f"data.path={tmp_path / 'k.json'}", *common]).data
    plain = {**OmegaConf.to_container(coco), "split": "train"}  # a plain dict works too
    assert DATASETS.get("coco")(plain)[0]["image_id"] == "COCO_val2014_000000000001"
    regions = compose("data/jsonl", [f"data.path={tmp_path / 'c.jsonl'}", f"data.tokenizer={tmp_path / 'tok'}",
                                      f"data.image.path={store_path}", "data.image.num_bb=5"]).data
    batch = (ds := DATASETS.get("jsonl")(regions)).collator()([ds[0], ds[1]])
    assert batch.region_feats.shape == (2, 5, 8) and batch.region_soft_labels.shape == (2, 5, 5)
    assert {"shapes", "coco", "flickr30k", "cc", "sbu", "vg", "jsonl"} <= set(DATASETS.names())


# ---- collator --------------------------------------------------------------------------------
def test_collator_targets_and_errors():
    base = {"input_ids": torch.tensor([2, 5, 3]), "pixel_values": torch.zeros(3, 4, 4)}
    examples = [dict(base, id="a", image_id="0", targets={"label": 1, "scores": torch.tensor([0.5, 1.0]),
                                                           "boxes": torch.ones(2, 4), "answer": "red"}),
                dict(base, id="b", image_id="1", targets={"label": 0, "scores": torch.tensor([0.0, 0.3]),
                                                           "boxes": torch.ones(3, 4), "answer": "blue"})]
    batch = VLCollator(target_pad_values={"boxes": -1})(examples)
    t = batch.targets
    assert t["label"].tolist() == [1, 0] and t["scores"].shape == (2, 2) and t["answer"] == ["red", "blue"]
    assert t["boxes"].shape == (2, 3, 4) and (t["boxes"][0, 2] == -1).all() and (t["boxes"][1] == 1).all()
    assert batch.index([1]).targets["answer"] == ["blue"]
    bad = dict(examples[1], targets={"label": 0})
    with pytest.raises(KeyError, match="example 'b' has targets"):
        VLCollator()([examples[0], bad])
    with pytest.raises(ValueError, match="pixel_values of different sizes.*b: \\(3, 8, 8\\)"):
        VLCollator()([examples[0], dict(examples[1], pixel_values=torch.zeros(3, 8, 8))])
    with pytest.raises(KeyError, match="example 'b' has fields"):
        VLCollator()([examples[0], {k: v for k, v in examples[1].items() if k != "pixel_values"}])


@pytest.mark.parametrize("shapes, dtype, value", [
    ([(3,), (5,), (1,)], torch.long, 0),                # token ids: the length differs
    ([(3, 4), (5, 4), (2, 4)], torch.float32, -1.5),    # region features (the fast path)
    ([(2,), (4,)], torch.bool, True),
    ([(3, 4), (5, 2)], torch.float32, -1.0),            # every dimension differs: padded in both
    ([(), ()], torch.float32, 0),                       # scalars are stacked
])
def test_pad_stack_pads_every_dimension_with_the_value(shapes, dtype, value):
    from vlkit.data.collate import pad_stack

    tensors = [(torch.rand(s) * 10).to(dtype) for s in shapes]
    out = pad_stack(tensors, value)
    size = [max(s[d] for s in shapes) for d in range(len(shapes[0]))]
    assert out.dtype == dtype and tuple(out.shape) == (len(shapes), *size)
    for k, t in enumerate(tensors):
        inside = (k, *(slice(0, n) for n in t.shape))
        assert torch.equal(out[inside], t)
        padding = out[k].clone()
        padding[tuple(slice(0, n) for n in t.shape)] = value
        assert (padding == value).all()  # everything outside the tensor is the padding value


def test_dataloader_with_dynamic_batches(store_path):
    ds = ImageTextPairs(_records(6, 8), shapes_tokenizer(), RegionSource(store_path, conf_th=0.5, min_bb=2))
    lengths = ds.lengths()
    sampler = TokenBucketSampler(lengths, max_units=200, size_multiple=4, seed=3)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=ds.collator(), num_workers=2)
    seen = []
    for batch in loader:
        units = batch.input_ids.numel() + batch.region_mask.numel()
        assert units <= 200
        seen += batch.ids
    assert sorted(seen) == sorted(r["id"] for r in _records(6, 8))
    assert 0 <= padding_fraction(list(sampler), lengths) < 1


def test_cached_source_loads_each_image_once_and_hands_out_copies(store_path):
    from vlkit.data.images import build_image_source

    source = build_image_source({"source": "features", "path": str(store_path), "num_bb": 4, "cache": True})
    image_id = source.store.ids()[0]
    clone = pickle.loads(pickle.dumps(source))  # DataLoader workers and spawned compare workers get a copy
    assert torch.equal(clone(image_id)["region_feats"], source(image_id)["region_feats"])
    source = build_image_source({"source": "features", "path": str(store_path), "num_bb": 4, "cache": True})
    calls = []
    load = source.source.store.load
    source.source.store.load = lambda *a, **k: calls.append(a[0]) or load(*a, **k)
    first = source(image_id)
    first["region_feats"] = None  # a consumer replacing a field must not reach the cache
    second = source(image_id)
    assert calls == [image_id] and second["region_feats"].shape == (4, source.store.feature_dim)
    assert source.units(image_id) == 4  # delegated to the wrapped RegionSource
    plain = build_image_source({"source": "features", "path": str(store_path), "num_bb": 4})
    assert isinstance(plain, RegionSource) and torch.equal(plain(image_id)["region_feats"], second["region_feats"])
