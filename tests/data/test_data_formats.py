"""Readers of the official dataset formats: tiny files written here, and the make-shapes outputs."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from vlkit.data import formats
from vlkit.data.formats import FormatError
from vlkit.data.shapes import FILES
from vlkit.io import UnsafePickleError


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


KARPATHY_COCO = {"dataset": "coco", "images": [
    {"filepath": "val2014", "filename": "COCO_val2014_000000391895.jpg", "imgid": 0, "cocoid": 391895, "split": "test",
     "sentids": [0, 1], "sentences": [{"tokens": ["a", "man"], "raw": "A man riding a bike.", "imgid": 0, "sentid": 0},
                                      {"tokens": ["a", "cyclist"], "raw": "A cyclist. ", "imgid": 0, "sentid": 1}]},
    {"filepath": "train2014", "filename": "COCO_train2014_000000000009.jpg", "imgid": 1, "cocoid": 9, "split": "restval",
     "sentids": [2], "sentences": [{"tokens": ["food"], "raw": "Some food.", "imgid": 1, "sentid": 2}]},
    {"filepath": "train2014", "filename": "COCO_train2014_000000000025.jpg", "imgid": 2, "cocoid": 25, "split": "train",
     "sentids": [3], "sentences": [{"tokens": ["giraffe"], "raw": "A giraffe.", "imgid": 2, "sentid": 3}]},
]}


def test_karpathy_per_sentence_and_retrieval(tmp_path):
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(KARPATHY_COCO))
    recs = formats.read_karpathy(path, splits=("train", "restval"))
    assert recs == [
        {"id": "2", "image_id": "COCO_train2014_000000000009", "caption": "Some food.",
         "file": "train2014/COCO_train2014_000000000009.jpg", "split": "restval"},
        {"id": "3", "image_id": "COCO_train2014_000000000025", "caption": "A giraffe.",
         "file": "train2014/COCO_train2014_000000000025.jpg", "split": "train"}]
    assert [r["image_id"] for r in formats.read_karpathy(path, "test", image_id="cocoid")] == ["391895", "391895"]
    assert len(formats.read_karpathy(path)) == 4
    test = formats.read_karpathy_retrieval(path, "test")
    assert test == [{"image_id": "COCO_val2014_000000391895", "file": "val2014/COCO_val2014_000000391895.jpg",
                     "split": "test", "captions": ["A man riding a bike.", "A cyclist."], "caption_ids": ["0", "1"]}]


def test_karpathy_errors_name_the_record(tmp_path):
    bad = json.loads(json.dumps(KARPATHY_COCO))
    del bad["images"][2]["sentences"][0]["raw"]
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(FormatError, match=r"dataset_coco\.json: images\[2\]\.sentences\[0\]: missing key 'raw'"):
        formats.read_karpathy(path)
    path.write_text('{"images": [')
    with pytest.raises(FormatError, match=r"dataset_coco\.json: not valid JSON .*line 1"):
        formats.read_karpathy(path)


def test_cc_tsv_ids_and_errors(tmp_path):
    path = tmp_path / "Train_GCC-training.tsv"
    path.write_text("a dog on a beach\thttp://x/1.jpg\nsunset over the sea\thttp://x/2.jpg\n\n")
    recs = formats.read_cc_tsv(path)
    assert [(r["id"], r["image_id"], r["caption"], r["url"]) for r in recs] == [
        ("0", "0", "a dog on a beach", "http://x/1.jpg"), ("1", "1", "sunset over the sea", "http://x/2.jpg")]
    hashed = formats.read_cc_tsv(path, image_id="hash")
    assert hashed[1]["image_id"] == formats.url_image_id(7, "http://x/2.jpg", "hash") and len(hashed[1]["image_id"]) == 16
    flipped = tmp_path / "cc12m.tsv"
    flipped.write_text("http://x/1.jpg\ta dog\n")
    assert formats.read_cc_tsv(flipped, columns=("url", "caption"))[0]["caption"] == "a dog"
    path.write_text("ok\thttp://x/1.jpg\nno url here\n")
    with pytest.raises(FormatError, match=r"Train_GCC-training\.tsv:2: expected 2 tab-separated fields"):
        formats.read_cc_tsv(path)


def test_sbu_matches_lines(tmp_path):
    caps, urls = tmp_path / "SBU_captioned_photo_dataset_captions.txt", tmp_path / "SBU_captioned_photo_dataset_urls.txt"
    caps.write_text("Man sits on a bench\nOld church\n")
    urls.write_text("http://static.flickr.com/1/11_a.jpg\nhttp://static.flickr.com/2/22_b.jpg\n")
    assert [(r["image_id"], r["caption"]) for r in formats.read_sbu(caps, urls)] == [("0", "Man sits on a bench"),
                                                                                   ("1", "Old church")]
    urls.write_text("http://static.flickr.com/1/11_a.jpg\n")
    with pytest.raises(FormatError, match="2 captions but .*urls.txt has 1 urls"):
        formats.read_sbu(caps, urls)


def test_vg_region_descriptions(tmp_path):
    path = tmp_path / "region_descriptions.json"
    path.write_text(json.dumps([{"id": 1, "regions": [
        {"region_id": 1382, "width": 82, "height": 139, "image_id": 1, "phrase": "the clock is green in colour",
         "y": 57, "x": 421},
        {"region_id": 1383, "width": 10, "height": 20, "phrase": "shade is along the street ", "y": 5, "x": 6}]}]))
    recs = formats.read_vg_regions(path)
    assert recs == [{"id": "1382", "image_id": "1", "caption": "the clock is green in colour",
                     "region_box": [421.0, 57.0, 503.0, 196.0]},
                    {"id": "1383", "image_id": "1", "caption": "shade is along the street",
                     "region_box": [6.0, 5.0, 16.0, 25.0]}]
    path.write_text(json.dumps([{"id": 1, "regions": [{"region_id": 5, "x": 0, "y": 0, "width": 1, "height": 1}]}]))
    with pytest.raises(FormatError, match=r"\[0\]\.regions\[0\]: missing key 'phrase'"):
        formats.read_vg_regions(path)


def test_caption_jsonl(tmp_path):
    path = _write_jsonl(tmp_path / "caps.jsonl", [{"image_id": 7, "caption": "x y"}, {"image_id": 7, "caption": "z"},
                                                 {"image_id": "a", "caption": "w", "id": "mine"}])
    assert [(r["id"], r["image_id"]) for r in formats.read_caption_jsonl(path)] == [("7#0", "7"), ("7#1", "7"),
                                                                                   ("mine", "a")]
    with open(path, "a") as f:
        f.write("{not json}\n")
    with pytest.raises(FormatError, match=r"caps\.jsonl:4: not valid JSON"):
        formats.read_caption_jsonl(path)


def test_vqa_questions_and_annotations(tmp_path):
    q = tmp_path / "v2_OpenEnded_mscoco_val2014_questions.json"
    a = tmp_path / "v2_mscoco_val2014_annotations.json"
    q.write_text(json.dumps({"questions": [{"image_id": 42, "question": "What color is the cat?", "question_id": 420},
                                           {"image_id": 43, "question": "Is it raining?", "question_id": 430}]}))
    answers = [{"answer": "black", "answer_confidence": "yes", "answer_id": k + 1} for k in range(9)]
    answers.append({"answer": "gray", "answer_confidence": "maybe", "answer_id": 10})
    a.write_text(json.dumps({"annotations": [
        {"question_id": 430, "image_id": 43, "answers": [{"answer": "no"}] * 10, "answer_type": "yes/no",
         "question_type": "is it", "multiple_choice_answer": "no"},
        {"question_id": 420, "image_id": 42, "answers": answers, "answer_type": "other",
         "question_type": "what color is the", "multiple_choice_answer": "black"}]}))
    recs = formats.read_vqa(q, a, image_id_format="COCO_val2014_{:012d}")
    assert recs[0] == {"id": "420", "question_id": 420, "image_id": "COCO_val2014_000000000042",
                       "question": "What color is the cat?", "answers": ["black"] * 9 + ["gray"],
                       "answer_type": "other", "question_type": "what color is the", "multiple_choice_answer": "black"}
    assert recs[1]["answers"] == ["no"] * 10
    assert formats.read_vqa(q)[1]["answers"] == [] and formats.read_vqa(q)[1]["image_id"] == "43"
    a.write_text(json.dumps({"annotations": []}))
    with pytest.raises(FormatError, match="annotations.json: no annotation for question_id 420"):
        formats.read_vqa(q, a)


def test_nlvr2(tmp_path):
    path = _write_jsonl(tmp_path / "dev.json", [
        {"validation": {}, "sentence": "One image shows two dogs.", "left_url": "u", "writer": "w", "label": "False",
         "right_url": "v", "synset": "dog", "query": "dogs", "identifier": "dev-850-0-0", "extra_validations": {}},
        {"identifier": "test1-1-2-3", "sentence": "Unlabelled."}])
    recs = formats.read_nlvr2(path)
    assert recs[0] == {"id": "dev-850-0-0", "left_image": "dev-850-0-img0", "right_image": "dev-850-0-img1",
                       "sentence": "One image shows two dogs.", "label": False}
    assert recs[1]["label"] is None
    _write_jsonl(path, [{"identifier": "dev-1-0-0", "sentence": "s", "label": "maybe"}])
    with pytest.raises(FormatError, match=r"dev\.json:1: label must be 'True' or 'False'"):
        formats.read_nlvr2(path)


def test_snli_ve(tmp_path):
    path = _write_jsonl(tmp_path / "snli_ve_dev.jsonl", [
        {"Flickr30K_ID": "3416050480", "gold_label": "neutral", "sentence1": "A man.", "sentence2": "A tall man.",
         "pairID": "3416050480.jpg#4r1n", "captionID": "3416050480.jpg#4", "annotator_labels": ["neutral"]}])
    assert formats.read_snli_ve(path) == [{"id": "3416050480.jpg#4r1n", "image_id": "3416050480",
                                           "premise": "A man.", "hypothesis": "A tall man.", "label": "neutral"}]
    _write_jsonl(path, [{"Flickr30K_ID": "1", "gold_label": "-", "sentence2": "x", "pairID": "p"}])
    with pytest.raises(FormatError, match=r"snli_ve_dev\.jsonl:1: gold_label must be one of"):
        formats.read_snli_ve(path)


def _refcoco_files(tmp_path):
    refs = [{"sent_ids": [0, 1], "file_name": "COCO_train2014_000000581857_16.jpg", "ann_id": 1719310, "ref_id": 0,
             "image_id": 581857, "split": "testA", "category_id": 1,
             "sentences": [{"tokens": ["lady"], "raw": "Lady", "sent_id": 0, "sent": "lady"},
                           {"tokens": ["woman"], "raw": "woman in white", "sent_id": 1, "sent": "woman in white"}]},
            {"sent_ids": [2], "file_name": "x.jpg", "ann_id": 7, "ref_id": 1, "image_id": 581857, "split": "train",
             "category_id": 3, "sentences": [{"tokens": ["car"], "raw": "car", "sent_id": 2, "sent": "car"}]}]
    instances = {"images": [{"id": 581857, "file_name": "COCO_train2014_000000581857.jpg", "height": 480, "width": 640}],
                 "annotations": [{"id": 1719310, "image_id": 581857, "bbox": [103.93, 299.99, 134.22, 177.81],
                                  "category_id": 1, "area": 1, "iscrowd": 0},
                                 {"id": 7, "image_id": 581857, "bbox": [0, 0, 10, 20], "category_id": 3}],
                 "categories": [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}]}
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    return refs, tmp_path / "instances.json"


def test_refs_pickle_and_json(tmp_path):
    refs, instances = _refcoco_files(tmp_path)
    with open(tmp_path / "refs(unc).p", "wb") as f:
        pickle.dump(refs, f, protocol=2)
    (tmp_path / "refs(unc).json").write_text(json.dumps(refs))
    from_pickle = formats.read_refs(tmp_path / "refs(unc).p", instances, splits=("testA",))
    assert from_pickle == formats.read_refs(tmp_path / "refs(unc).json", instances, splits="testA")
    rec = from_pickle[0]
    assert rec["id"] == "0" and rec["image_id"] == "581857" and rec["sentences"] == ["lady", "woman in white"]
    assert rec["sent_ids"] == [0, 1] and rec["image_size"] == [480, 640] and rec["category_id"] == 1
    assert np.allclose(rec["bbox"], [103.93, 299.99, 238.15, 477.8])
    assert len(formats.read_refs(tmp_path / "refs(unc).json", instances)) == 2


def test_refs_refuses_unsafe_pickles_and_dangling_ids(tmp_path):
    refs, instances = _refcoco_files(tmp_path)
    with open(tmp_path / "evil.p", "wb") as f:
        pickle.dump([{"ref": np.random.default_rng(0)}], f)
    with pytest.raises(UnsafePickleError, match="evil.p"):
        formats.read_refs(tmp_path / "evil.p", instances)
    refs[1]["ann_id"] = 999
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    with pytest.raises(FormatError, match=r"refs\.json: \[1\]: ann_id 999 is not in .*instances\.json"):
        formats.read_refs(tmp_path / "refs.json", instances)


# ---- the make-shapes outputs load through the same readers ----------------------------------
def test_shapes_files_load_through_the_readers(shapes_dir, world):
    d = shapes_dir
    train = formats.read_karpathy(d / FILES["karpathy"], "train")
    assert len(train) == 5 * len(world.indices("train"))
    assert [r["caption"] for r in train if r["image_id"] == "3"] == world.captions(3)
    assert train[0]["file"] == "images/0.png" and (d / train[0]["file"]).is_file()
    test = formats.read_karpathy_retrieval(d / FILES["karpathy"], "test")
    assert [r["image_id"] for r in test] == [str(i) for i in world.indices("test")]
    assert all(len(r["captions"]) == 5 for r in test)
    jsonl = formats.read_caption_jsonl(d / FILES["captions"])
    assert [(r["image_id"], r["caption"]) for r in jsonl[:5]] == [("0", c) for c in world.captions(0)]

    for split in ("train", "val", "test"):
        vqa = formats.read_vqa(d / FILES["vqa_questions"].format(split=split),
                               d / FILES["vqa_annotations"].format(split=split))
        expected = [q for i in world.indices(split) for q in world.vqa(i)]
        assert [(r["question_id"], r["image_id"], r["question"], r["answers"]) for r in vqa] == [
            (q["question_id"], str(q["image_id"]), q["question"], [a["answer"] for a in q["answers"]]) for q in expected]
        nlvr2 = formats.read_nlvr2(d / FILES["nlvr2"].format(split=split))
        assert [(r["left_image"], r["right_image"], r["label"]) for r in nlvr2] == [
            (r["left_image"], r["right_image"], r["label"] == "True") for i in world.indices(split) for r in world.nlvr2(i)]
        ve = formats.read_snli_ve(d / FILES["snli_ve"].format(split=split))
        assert [(r["image_id"], r["hypothesis"], r["label"]) for r in ve] == [
            (h["Flickr30K_ID"], h["sentence2"], h["gold_label"]) for i in world.indices(split) for h in world.snli_ve(i)]

    refs = formats.read_refs(d / FILES["refs"], d / FILES["instances"])
    expected = [r for i in range(len(world)) for r in world.refexps(i)]
    assert len(refs) == len(expected)
    for rec, ref in zip(refs, expected):
        scene = world.scene(int(rec["image_id"]))
        assert tuple(rec["bbox"]) == scene.objects[ref["object_index"]].box
        assert rec["sentences"] == [s["sent"] for s in ref["sentences"]] and rec["image_size"] == [128, 128]
