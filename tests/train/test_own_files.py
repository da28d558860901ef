"""Issue 43: a fine-tuning on a task's own files (``task.source=files``) takes its images and tokenizer from
``data.image.*`` / ``data.tokenizer`` alone (``data=images``, chosen for it), its run.json records only keys
that were given, and the preflight refuses a tokenizer that does not know the words of the text
(``data.max_unk_rate``)."""
import json
import shutil

import pytest
from PIL import Image

import vlkit
from vlkit.cli import compose, main
from vlkit.validate import DataError

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
COLOURS = ["teal", "maroon", "olive", "navy"]


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """Four images of one colour each, VQA v2 files asking their colour, and a bare vocab.txt."""
    root = tmp_path_factory.mktemp("own")
    (root / "images").mkdir()
    questions, annotations = [], []
    for k, colour in enumerate(COLOURS):
        Image.new("RGB", (48, 48), colour).save(root / "images" / f"img_{k}.png")
        questions.append({"image_id": k, "question": "what colour is the square?", "question_id": k})
        annotations.append({"image_id": k, "question_id": k, "question_type": "what color", "answer_type": "other",
                            "multiple_choice_answer": colour,
                            "answers": [{"answer": colour, "answer_id": n + 1} for n in range(10)]})
    (root / "q.json").write_text(json.dumps({"questions": questions}))
    (root / "a.json").write_text(json.dumps({"annotations": annotations}))
    (root / "vocab").mkdir()
    (root / "vocab" / "vocab.txt").write_text("\n".join([*SPECIAL, "what", "colour", "is", "the", "square", "?"]) + "\n")
    return root


def _args(root, out, tokenizer=None):
    split = f"{{questions: {root / 'q.json'}, annotations: {root / 'a.json'}, image_id_format: 'img_{{}}'}}"
    return ["model=meter", "task=vqa", "task.source=files", f"task.files.train={split}", f"task.files.val={split}",
            "data.image.source=folder", f"data.image.path={root / 'images'}", f"data.tokenizer={tokenizer or root / 'vocab'}",
            "trainer.max_steps=2", "trainer.batch_size=2", "trainer.warmup=1", "trainer.progress=false",
            "trainer.trackers=[]", f"trainer.output_dir={out}"]


def test_own_files_need_no_data_group(own, tmp_path):
    cfg = compose("finetune", _args(own, tmp_path / "ft"))
    assert cfg.data.name == "images" and "path" not in cfg.data and cfg.data.image.path == str(own / "images")
    assert compose("finetune", ["task=vqa", "task.source=files"]).data.name == "shapes"  # the shapes world's images
    assert main(["finetune", *_args(own, tmp_path / "ft")]) == 0
    text = (tmp_path / "ft" / "run.json").read_text()
    run = json.loads(text)
    assert "???" not in text and run["data"]["name"] == "images" and run["data"]["tokenizer"] == str(own / "vocab")
    assert 0.0 <= run["metrics"]["val/vqa"] <= 1.0
    assert main(["evaluate", f"checkpoint={tmp_path / 'ft'}"]) == 0
    assert json.loads((tmp_path / "ft" / "eval.json").read_text()) == run["metrics"]


def test_a_data_group_given_records_no_unset_key(own, tmp_path):
    assert main(["finetune", *_args(own, tmp_path / "ft"), "data=coco"]) == 0
    text = (tmp_path / "ft" / "run.json").read_text()
    assert "???" not in text and json.loads(text)["data"]["name"] == "coco"


def test_images_alone_cannot_be_pre_trained_on(own, tmp_path):
    with pytest.raises(DataError, match="data=images holds no captions.*data=jsonl data.path="):
        main(["pretrain", "model=meter", "data=images", "data.image.source=folder", f"data.image.path={own / 'images'}",
              f"data.tokenizer={own / 'vocab'}", "trainer.max_steps=1", f"trainer.output_dir={tmp_path / 'pre'}"])


def test_a_tokenizer_that_does_not_know_the_words_is_refused(own, tmp_path):
    """The shapes world's tokenizer knows none of these colour words: the preflight names the rate, the words, the
    key and the value that allows it, before anything is written; raising the key lets the run go on."""
    from vlkit.train.preflight import PreflightError

    out = tmp_path / "ft"
    with pytest.raises(PreflightError) as err:
        main(["finetune", *_args(own, out, "shapes")])
    text = str(err.value)
    assert "vqa train data: 16.7% of the text's tokens (4 of 24, in 4 of 4 texts) are unknown to " \
           "data.tokenizer=shapes and become [UNK], e.g. 'colour' (4x)" in text
    assert "data.max_unk_rate=0.05 accepts at most 5%" in text and "allow it with data.max_unk_rate=0.17" in text
    assert not out.exists()
    assert main(["finetune", *_args(own, out, "shapes"), "data.max_unk_rate=0.17"]) == 0
    notes = json.loads((out / "preflight.json").read_text())["data"]["vqa train"]["unknown_tokens"]
    assert notes["rate"] == round(4 / 24, 6) and notes["words"] == {"colour": 4}
    assert json.loads((tmp_path / "ft" / "preflight.json").read_text())["data"]["vqa val"]["unknown_tokens"]["unknown"] == 4


def test_the_unknown_rate_of_pre_training_captions(own, tmp_path):
    from vlkit.train.preflight import PreflightError

    captions = own / "captions.jsonl"
    captions.write_text("".join(json.dumps({"image_id": f"img_{k}", "caption": f"a {c} square"}) + "\n"
                                for k, c in enumerate(COLOURS)))
    args = ["pretrain", "model=meter", "data=jsonl", f"data.path={captions}", "data.image.source=folder",
            f"data.image.path={own / 'images'}", "data.tokenizer=shapes", "trainer.max_steps=1", "trainer.batch_size=2",
            "trainer.progress=false", "trainer.trackers=[]", f"trainer.output_dir={tmp_path / 'pre'}"]
    with pytest.raises(PreflightError, match=r"pre-training data: 33.3% .* e.g. 'teal' \(1x\), 'maroon' \(1x\)"):
        main(args)
    with pytest.raises(PreflightError, match=r"data.max_unk_rate=2 must be a number from 0 to 1"):
        main([*args, "data.max_unk_rate=2"])
    assert main([*args, "data.max_unk_rate=1"]) == 0


def _problem(args) -> str:
    """The message of a command that fails (``main`` raises it in-process; the console prints it)."""
    with pytest.raises(Exception) as err:
        main(args)
    return str(err.value)


def test_a_wrong_image_id_format_says_every_image_is_missing_and_which_format_finds_them(own, tmp_path):
    args = [a.replace("img_{}", "shape_{}") for a in _args(own, tmp_path / "ft")]
    err = _problem(["finetune", *args])
    assert "vqa train data: 4 example(s) name 4 image(s) missing from the image folder" in err and "(100% of its 4" in err
    assert "asks for 'shape_0' (in a folder: a file shape_0.jpg" in err and "holds 'img_0', 'img_1', 'img_2'" in err
    assert "the data's ids follow image_id_format 'shape_{}', the image folder's 'img_{}'" in err
    assert "image_id_format 'img_{}' finds 4 of these 4 images" in err
    assert "on_error=skip" not in err  # leaving every example out is no advice
    assert not (tmp_path / "ft" / "checkpoints").exists()


def test_id_patterns_read_zero_padded_numbers():
    from vlkit.data.images import id_mismatch, id_pattern

    assert id_pattern("COCO_train2014_000000000009") == "COCO_train2014_{:012d}" and id_pattern("shape_3") == "shape_{}"
    assert id_pattern("cat") is None
    held = {"COCO_val2014_000000000001", "COCO_val2014_000000000002"}
    assert id_mismatch(["1", "2", "7"], held, "feature store").endswith(
        "the feature store's 'COCO_val2014_{:012d}': image_id_format 'COCO_val2014_{:012d}' finds 2 of these 3 images")


def test_a_set_without_a_validation_split_is_refused_first_naming_the_fix(own, tmp_path):
    args = [a for a in _args(own, tmp_path / "ft") if not a.startswith("task.files.val=")]
    err = _problem(["finetune", *args])
    assert "task vqa has no 'val' split to evaluate (split= / eval_splits, default [val]); it has none" in err
    assert "task.files.val={questions: FILE, annotations: FILE, image_id_format: 'img_{}'}" in err
    assert "evaluate none (eval_splits=[])" in err and "before step 1" in err
    assert main(["finetune", *args, "eval_splits=[]"]) == 0  # the fix it names works
    assert json.loads((tmp_path / "ft" / "run.json").read_text())["metrics"] == {}
    # evaluating the test split without its files says which key gives them
    err = _problem(["evaluate", f"checkpoint={tmp_path / 'ft'}", "split=test"])
    assert "task vqa has no 'test' split to evaluate" in err  # in the form of the run's files, less annotations
    assert "give its files, task.files.test={image_id_format: 'img_{}', questions: FILE}" in err
    assert "eval_splits=[]" not in err  # vlkit evaluate scores at least one split


def test_evaluate_reads_the_runs_data_by_the_recorded_paths_rule(own, tmp_path):
    """``evaluate checkpoint=`` of a run folder copied from elsewhere reads no data outside it unless passed."""
    assert main(["finetune", *_args(own, tmp_path / "ft")]) == 0
    shutil.copytree(tmp_path / "ft", tmp_path / "theirs")
    err = _problem(["evaluate", f"checkpoint={tmp_path / 'theirs'}"])
    assert f"data.image.path={own / 'images'} lies outside {tmp_path / 'theirs'}" in err
    assert "pass data.image.path=PATH to read it" in err
    with pytest.raises(DataError, match=r'pass evaluate\(data=\{"image": \{"path": \.\.\.\}\}\) to read it'):
        vlkit.evaluate(tmp_path / "theirs", quiet=True)  # from Python: the argument that passes it
    given = [f"data.image.path={own / 'images'}", f"data.tokenizer={own / 'vocab'}"]
    assert main(["evaluate", f"checkpoint={tmp_path / 'theirs'}", *given]) == 0
    assert json.loads((tmp_path / "theirs" / "eval.json").read_text()) == json.loads(
        (tmp_path / "ft" / "run.json").read_text())["metrics"]


def test_a_region_family_on_an_image_folder_suggests_a_pixel_family(own, tmp_path):
    args = [a for a in _args(own, tmp_path / "ft") if a != "model=meter"]  # no model=, no init=: UNITER
    err = _problem(["finetune", *args])
    assert "uniter is a region family" in err and "data.image.source=folder gives images" in err
    assert "model=meter" in err and "vlkit extract-features" in err
    # the image folder given as a feature store (data.image.source left at features) is said to be one
    args = [a for a in args if a != "data.image.source=folder"]
    err = _problem(["finetune", *args])
    assert f"data.image.path={own / 'images'} is a folder of images (img_" in err and "not a feature store" in err
    assert "merge-features" not in err and "model=meter" in err
