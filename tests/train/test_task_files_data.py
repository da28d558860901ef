"""Issue 43: a fine-tuning on a task's own files (``task.source=files``) takes its images and tokenizer from
``data.image.*`` / ``data.tokenizer`` alone (``data=images``, chosen for it), and its run.json records only keys
that were given."""
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
        questions.append({"image_id": k, "question": "what colour is it?", "question_id": k})
        annotations.append({"image_id": k, "question_id": k, "question_type": "what color", "answer_type": "other",
                            "multiple_choice_answer": colour,
                            "answers": [{"answer": colour, "answer_id": n + 1} for n in range(10)]})
    (root / "q.json").write_text(json.dumps({"questions": questions}))
    (root / "a.json").write_text(json.dumps({"annotations": annotations}))
    (root / "vocab").mkdir()
    (root / "vocab" / "vocab.txt").write_text("\n".join([*SPECIAL, "what", "colour", "is", "it", "?"]) + "\n")
    return root


def _args(root, out):
    split = f"{{questions: {root / 'q.json'}, annotations: {root / 'a.json'}, image_id_format: 'img_{{}}'}}"
    return ["model=meter", "task=vqa", "task.source=files", f"task.files.train={split}", f"task.files.val={split}",
            "data.image.source=folder", f"data.image.path={root / 'images'}", f"data.tokenizer={root / 'vocab'}",
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
