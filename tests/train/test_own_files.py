"""Issue 43: a fine-tuning on a task's own files (``task.source=files``) takes its images and tokenizer from
``data.image.*`` / ``data.tokenizer`` alone (``data=images``, chosen for it), its run.json records only keys
that were given, and the preflight refuses a tokenizer that does not know the words of the text
(``data.max_unk_rate``)."""
import json

import pytest
from PIL import Image

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
