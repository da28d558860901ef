"""Every dataset as its publisher ships it: a tiny file in the official schema, written here, read by vlkit's reader
(docs/datasets.md lists the files and the commands)."""
from __future__ import annotations

import json
import pickle

import pytest

from vlkit.data import formats
from vlkit.io import UnsafePickleError
from vlkit.registry import DATASETS


def _write_json(path, value):
    path.write_text(json.dumps(value))
    return path


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


COCO_INFO = {"description": "COCO 2014 Dataset", "version": "1.0", "year": 2014}


def coco_captions_file(path):
    """COCO's own captions_train2014.json: images by integer id, one annotation per caption."""
    return _write_json(path, {
        "info": COCO_INFO, "licenses": [{"url": "http://creativecommons.org/licenses/by-nc-sa/2.0/", "id": 1}],
        "images": [{"license": 5, "file_name": "COCO_train2014_000000057870.jpg", "coco_url": "http://x/57870.jpg",
                    "height": 480, "width": 640, "date_captured": "2013-11-14 16:28:13", "id": 57870},
                   {"license": 5, "file_name": "COCO_train2014_000000384029.jpg", "coco_url": "http://x/384029.jpg",
                    "height": 429, "width": 640, "date_captured": "2013-11-14 16:29:45", "id": 384029}],
        "annotations": [{"image_id": 57870, "id": 787980, "caption": "A restaurant has modern wooden tables and chairs."},
                        {"image_id": 384029, "id": 814056, "caption": "A man preparing desserts in a kitchen."},
                        {"image_id": 57870, "id": 789366, "caption": "A long restaurant table with rattan chairs."}]})


def karpathy_coco_file(path):
    """Karpathy's dataset_coco.json: images with their split and tokenised sentences."""
    def image(imgid, cocoid, split, folder, sents):
        return {"filepath": folder, "sentids": [s for s, _ in sents], "filename": f"COCO_{folder}_{cocoid:012d}.jpg",
                "imgid": imgid, "split": split, "cocoid": cocoid,
                "sentences": [{"tokens": raw.lower().strip(".").split(), "raw": raw, "imgid": imgid, "sentid": s}
                              for s, raw in sents]}

    return _write_json(path, {"dataset": "coco", "images": [
        image(0, 391895, "test", "val2014", [(770337, "A man with a red helmet on a small moped."),
                                             (771687, "Man riding a motor bike on a dirt road.")]),
        image(1, 57870, "restval", "train2014", [(787980, "A restaurant has modern wooden tables and chairs.")]),
        image(2, 384029, "train", "train2014", [(814056, "A man preparing desserts in a kitchen.")])]})


def test_coco_own_captions_file(tmp_path):
    path = coco_captions_file(tmp_path / "captions_train2014.json")
    recs = formats.read_caption_json(path)
    assert [(r["id"], r["image_id"]) for r in recs] == [("787980", "COCO_train2014_000000057870"),
                                                        ("814056", "COCO_train2014_000000384029"),
                                                        ("789366", "COCO_train2014_000000057870")]
    assert recs[1]["caption"] == "A man preparing desserts in a kitchen."
    assert [r["image_id"] for r in formats.read_caption_json(path, image_id="cocoid")] == ["57870", "384029", "57870"]
    with pytest.raises(ValueError, match="'imgid' for COCO's own caption file"):
        formats.read_caption_json(path, image_id="imgid")


def test_coco_caption_of_an_unknown_image_names_the_annotation(tmp_path):
    data = json.loads(coco_captions_file(tmp_path / "c.json").read_text())
    data["annotations"][2]["image_id"] = 5
    path = _write_json(tmp_path / "captions_val2014.json", data)
    with pytest.raises(formats.FormatError, match=r"annotations\[2\]: image_id 5 is not in the file's images"):
        formats.read_caption_json(path)


def test_karpathy_coco_and_the_same_image_ids_as_coco_own_file(tmp_path):
    path = karpathy_coco_file(tmp_path / "dataset_coco.json")
    recs = formats.read_caption_json(path, ["train", "restval"])
    assert [(r["id"], r["image_id"], r["file"]) for r in recs] == [
        ("787980", "COCO_train2014_000000057870", "train2014/COCO_train2014_000000057870.jpg"),
        ("814056", "COCO_train2014_000000384029", "train2014/COCO_train2014_000000384029.jpg")]
    own = formats.read_caption_json(coco_captions_file(tmp_path / "captions_train2014.json"))
    assert {r["image_id"] for r in recs} == {r["image_id"] for r in own}  # one feature store serves both files
    assert [r["image_id"] for r in formats.read_caption_json(path, "test", "cocoid")] == ["391895", "391895"]


def test_a_json_of_neither_kind_is_named(tmp_path):
    path = _write_json(tmp_path / "other.json", {"questions": []})
    with pytest.raises(formats.FormatError, match="neither COCO's captions_.*json.*nor a Karpathy json"):
        formats.read_caption_json(path)


def test_flickr30k_karpathy(tmp_path):
    path = _write_json(tmp_path / "dataset_flickr30k.json", {"dataset": "flickr30k", "images": [
        {"sentids": [0, 1], "imgid": 0, "split": "train", "filename": "1000092795.jpg", "sentences": [
            {"tokens": ["two", "young", "guys"], "raw": "Two young guys with shaggy hair.", "imgid": 0, "sentid": 0},
            {"tokens": ["two", "men"], "raw": "Two young, White males are outside.", "imgid": 0, "sentid": 1}]},
        {"sentids": [5], "imgid": 1, "split": "test", "filename": "10002456.jpg", "sentences": [
            {"tokens": ["workers"], "raw": "Several men in hard hats.", "imgid": 1, "sentid": 5}]}]})
    recs = formats.read_caption_json(path, "train")
    assert [(r["id"], r["image_id"], r["caption"]) for r in recs] == [
        ("0", "1000092795", "Two young guys with shaggy hair."), ("1", "1000092795", "Two young, White males are outside.")]
    gallery = formats.read_karpathy_retrieval(path, "test")
    assert gallery == [{"image_id": "10002456", "file": "10002456.jpg", "split": "test",
                        "captions": ["Several men in hard hats."], "caption_ids": ["5"]}]


def test_visual_genome_region_descriptions(tmp_path):
    path = _write_json(tmp_path / "region_descriptions.json", [
        {"id": 1, "regions": [{"region_id": 1382, "width": 82, "height": 139, "image_id": 1,
                               "phrase": "the clock is green in colour", "y": 57, "x": 421},
                              {"region_id": 1383, "width": 182, "height": 109, "image_id": 1,
                               "phrase": "shade is along the street ", "y": 372, "x": 194}]},
        {"id": 2, "regions": []}])
    recs = formats.read_vg_regions(path)
    assert [(r["id"], r["image_id"], r["caption"]) for r in recs] == [
        ("1382", "1", "the clock is green in colour"), ("1383", "1", "shade is along the street")]
    assert recs[0]["region_box"] == [421.0, 57.0, 503.0, 196.0]


CC_ROWS = ["a very typical bus station\thttp://lh6.ggpht.com/-IvRtNLNcG8o/TpFyrudaT6I/AAAAAAAAM6o/_11MuAAKalQ/IMG_3422.JPG",
           "sierra looked stunning in this top and this skirt\thttp://78.media.tumblr.com/3b133294bdc7c7784b7e55a4a0a5fc71/tumblr_o7w2.jpg"]


@pytest.mark.parametrize("header", ["", "caption\turl\n"])
def test_conceptual_captions_tsv_with_or_without_a_header(tmp_path, header):
    path = tmp_path / "Train_GCC-training.tsv"
    path.write_text(header + "\n".join(CC_ROWS) + "\n")
    recs = formats.read_cc_tsv(path)
    assert [(r["id"], r["caption"]) for r in recs] == [("0", "a very typical bus station"),
                                                       ("1", "sierra looked stunning in this top and this skirt")]
    assert recs[0]["url"].endswith("IMG_3422.JPG")


def test_conceptual_captions_header_gives_the_column_order(tmp_path):
    path = tmp_path / "cc12m.tsv"
    path.write_text("url\tcaption\n" + "\n".join("\t".join(reversed(r.split("\t"))) for r in CC_ROWS) + "\n")
    recs = formats.read_cc_tsv(path)
    assert recs[0]["caption"] == "a very typical bus station" and recs[0]["url"].startswith("http://lh6")


def test_conceptual_captions_bad_line_is_named_after_a_header(tmp_path):
    path = tmp_path / "Validation_GCC-1.1.0-Validation.tsv"
    path.write_text("caption\turl\n" + CC_ROWS[0] + "\nno url on this line\n")
    with pytest.raises(formats.FormatError, match=r"Validation\.tsv:3: expected 2 tab-separated fields"):
        formats.read_cc_tsv(path)


def test_sbu_captions_and_urls(tmp_path):
    caps = tmp_path / "SBU_captioned_photo_dataset_captions.txt"
    urls = tmp_path / "SBU_captioned_photo_dataset_urls.txt"
    caps.write_text("Man sits in a rusted car buried in the sand on Waitarere beach\nInterior design of modern white\n")
    urls.write_text("http://static.flickr.com/2723/4385058960_b0f291553e.jpg\n"
                    "http://static.flickr.com/3368/3425213012_f1cdf6a1d1.jpg\n")
    recs = formats.read_sbu(caps, urls, "hash")
    assert [r["caption"] for r in recs][1] == "Interior design of modern white"
    assert recs[0]["image_id"] == formats.url_image_id(0, "http://static.flickr.com/2723/4385058960_b0f291553e.jpg", "hash")


def test_vqa_v2_questions_and_annotations(tmp_path):
    questions = _write_json(tmp_path / "v2_OpenEnded_mscoco_train2014_questions.json", {
        "info": COCO_INFO, "task_type": "Open-Ended", "data_type": "mscoco", "data_subtype": "train2014",
        "license": {"url": "http://creativecommons.org/licenses/by/4.0/", "name": "CC BY 4.0"},
        "questions": [{"image_id": 458752, "question": "What is this photo taken looking through?",
                       "question_id": 458752000},
                      {"image_id": 458752, "question": "What position is this man playing?", "question_id": 458752001}]})
    answers = [{"answer": a, "answer_confidence": "yes", "answer_id": k + 1}
               for k, a in enumerate(["net"] * 8 + ["netting", "mesh"])]
    annotations = _write_json(tmp_path / "v2_mscoco_train2014_annotations.json", {
        "info": COCO_INFO, "data_type": "mscoco", "data_subtype": "train2014", "license": {},
        "annotations": [{"question_type": "what is this", "multiple_choice_answer": "net", "answers": answers,
                         "image_id": 458752, "answer_type": "other", "question_id": 458752000},
                        {"question_type": "what", "multiple_choice_answer": "pitcher",
                         "answers": [{"answer": "pitcher", "answer_confidence": "yes", "answer_id": j + 1}
                                     for j in range(10)],
                         "image_id": 458752, "answer_type": "other", "question_id": 458752001}]})
    recs = formats.read_vqa(questions, annotations, "COCO_train2014_{:012d}")
    assert recs[0]["image_id"] == "COCO_train2014_000000458752" and recs[0]["answers"].count("net") == 8
    assert recs[1]["multiple_choice_answer"] == "pitcher" and recs[1]["question_id"] == 458752001
    assert formats.read_vqa(questions)[0]["answers"] == []  # test-dev questions: no annotations


def _instances(path):
    return _write_json(path, {
        "info": COCO_INFO, "licenses": [], "categories": [{"supercategory": "person", "id": 1, "name": "person"}],
        "images": [{"license": 1, "file_name": "COCO_train2014_000000581857.jpg", "height": 640, "width": 427,
                    "id": 581857}],
        "annotations": [{"segmentation": [[103.9, 300.0, 238.2, 300.0, 238.2, 477.4]], "area": 14267.2, "iscrowd": 0,
                         "image_id": 581857, "bbox": [103.93, 299.99, 134.22, 177.42], "category_id": 1,
                         "id": 1719310}]})


REF = {"sent_ids": [0, 1], "file_name": "COCO_train2014_000000581857_16.jpg", "ann_id": 1719310, "ref_id": 0,
       "image_id": 581857, "split": "train", "category_id": 1,
       "sentences": [{"tokens": ["the", "lady", "with", "the", "blue", "shirt"], "raw": "THE LADY WITH THE BLUE SHIRT",
                      "sent_id": 0, "sent": "the lady with the blue shirt"},
                     {"tokens": ["lady", "with", "back", "to", "us"], "raw": "lady w back to us", "sent_id": 1,
                      "sent": "lady with back to us"}]}


@pytest.mark.parametrize("name", ["refs(unc).p", "refs(umd).p"])
def test_refcoco_pickle_and_instances(tmp_path, name):
    refs = tmp_path / name
    refs.write_bytes(pickle.dumps([REF], protocol=2))  # the released files are Python 2 pickles
    recs = formats.read_refs(refs, _instances(tmp_path / "instances.json"), "train", "COCO_train2014_{:012d}")
    assert len(recs) == 1 and recs[0]["sentences"] == ["the lady with the blue shirt", "lady with back to us"]
    assert recs[0]["image_id"] == "COCO_train2014_000000581857" and recs[0]["image_size"] == [640, 427]
    assert recs[0]["bbox"] == pytest.approx([103.93, 299.99, 238.15, 477.41])


class _Exploit:
    def __reduce__(self):
        return (print, ("this pickle runs code",))


def test_refcoco_pickle_that_runs_code_is_refused(tmp_path, capsys):
    refs = tmp_path / "refs(unc).p"
    refs.write_bytes(pickle.dumps([REF, _Exploit()], protocol=2))
    with pytest.raises(UnsafePickleError, match="print"):
        formats.read_refs(refs, _instances(tmp_path / "instances.json"))
    assert "this pickle runs code" not in capsys.readouterr().out


def test_nlvr2_jsonl_image_ids_from_the_identifier(tmp_path):
    path = _write_jsonl(tmp_path / "train.json", [
        {"validation": {"9": "True"}, "sentence": "An image shows one leather pencil case, displayed open with writing "
         "implements tucked inside.", "left_url": "https://example.org/a.jpg", "writer": "103", "label": "False",
         "right_url": "https://example.org/b.jpg", "synset": "pencil case", "query": "leather pencil case48",
         "identifier": "train-10171-0-0", "extra_validations": {}},
        {"validation": {}, "sentence": "One image shows exactly two brown acorns.", "left_url": "", "writer": "48",
         "label": "True", "right_url": "", "synset": "acorn", "query": "acorn16", "identifier": "train-8582-1-2",
         "extra_validations": {}}])
    recs = formats.read_nlvr2(path)
    assert [(r["id"], r["left_image"], r["right_image"], r["label"]) for r in recs] == [
        ("train-10171-0-0", "train-10171-0-img0", "train-10171-0-img1", False),
        ("train-8582-1-2", "train-8582-1-img0", "train-8582-1-img1", True)]


def test_snli_ve_jsonl(tmp_path):
    path = _write_jsonl(tmp_path / "snli_ve_train.jsonl", [
        {"sentence1": "Two women are embracing while holding to go packages.", "sentence2": "The sisters are hugging "
         "goodbye while holding to go packages after just eating lunch.", "gold_label": "neutral",
         "Flickr30K_ID": "4705552913", "pairID": "4705552913.jpg#2r1n", "captionID": "4705552913.jpg#2",
         "annotator_labels": ["neutral"], "sentence1_parse": "(ROOT)", "sentence2_parse": "(ROOT)"},
        {"sentence1": "Two women are embracing.", "sentence2": "Two woman are holding packages.",
         "gold_label": "entailment", "Flickr30K_ID": "4705552913", "pairID": "4705552913.jpg#2r1e",
         "captionID": "4705552913.jpg#2", "annotator_labels": ["entailment"]}])
    recs = formats.read_snli_ve(path)
    assert [(r["id"], r["image_id"], r["label"]) for r in recs] == [("4705552913.jpg#2r1n", "4705552913", "neutral"),
                                                                    ("4705552913.jpg#2r1e", "4705552913", "entailment")]
    assert recs[1]["hypothesis"] == "Two woman are holding packages."


@pytest.mark.parametrize("name", ["coco", "flickr30k", "cc", "sbu", "vg", "jsonl"])
def test_every_caption_dataset_is_registered(name):
    assert callable(DATASETS.get(name))
