"""Issue 43: docs/evaluation.md's prediction-file examples as a user runs them. The VQA test-dev command runs as
printed on COCO-named images; the retrieval file shows the keys vlkit writes; `vlkit evaluate` given task keys
without ``task=`` names ``task=`` and its choices."""
from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from shapes_helpers import region_store, tiny_model
from vlkit.cli import console, main
from vlkit.data.images import RegionSource
from vlkit.data.shapes import ShapesWorld, write_shapes
from vlkit.data.shapes.writer import FILES
from vlkit.tasks.predictions import write_predictions
from vlkit.tasks.retrieval import Retrieval

PAGE = Path(__file__).resolve().parents[2] / "docs" / "evaluation.md"
NUM_IMAGES = 30
TEST_DEV = "v2_OpenEnded_mscoco_test-dev2015_questions.json"


def doc_blocks(heading: str) -> list[str]:
    """The fenced blocks of evaluation.md's paragraph that starts with ``heading``, up to the next paragraph's."""
    text = PAGE.read_text(encoding="utf-8").split(f"\n{heading}", 1)[1]
    text = re.split(r"\n\*\*[A-Z]", text, maxsplit=1)[0]
    return re.findall(r"^```\w+\n(.*?)^```$", text, flags=re.M | re.S)


def doc_command(block: str, **placeholders: str) -> list[str]:
    """The ``vlkit`` command of a bash block as the shell splits it, placeholders replaced, ``vlkit`` dropped."""
    words = shlex.split(block.replace("\\\n", " "))
    assert words[0] == "vlkit", block
    for name, value in placeholders.items():
        words = [w.replace(name, value) for w in words]
    return words[1:]


def doc_json(block: str) -> object:
    """A JSON example of the page, its ``...`` (more of the same) left out."""
    return json.loads(re.sub(r",\s*\.\.\.", "", block))


@pytest.fixture(scope="module")
def coco_named(tmp_path_factory):
    """A VQA fine-tuning run on the shapes world whose feature store names the test images as COCO does
    (``COCO_test2015_000000000007``: the test questions give the integer 7), and the test-dev questions file."""
    root = tmp_path_factory.mktemp("coco_named")
    world = ShapesWorld(seed=0, num_images=NUM_IMAGES)
    write_shapes(world, root / "files")
    test = {i for i in range(world.num_images) if world.split(i) == "test"}
    scenes = {(f"COCO_test2015_{i:012d}" if i in test else world.image_id(i)): world.scene(i)
              for i in range(world.num_images)}
    store = region_store(root / "regions.h5", scenes)
    data_dir = root / "DATA"
    data_dir.mkdir()
    shutil.copyfile(root / "files" / FILES["vqa_questions"].format(split="test"), data_dir / TEST_DEV)

    def spec(split: str) -> str:
        return (f"{{questions:{root / 'files' / FILES['vqa_questions'].format(split=split)},"
                f"annotations:{root / 'files' / FILES['vqa_annotations'].format(split=split)}}}")

    run = root / "ft"
    assert main(["finetune", "model=uniter", "task=vqa", "task.source=files", f"task.files.train={spec('train')}",
                 f"task.files.val={spec('val')}", f"data.num_images={NUM_IMAGES}", "data.image.source=features",
                 f"data.image.path={store}", "data.image.num_bb=100", "model.preset=tiny", f"trainer.output_dir={run}",
                 "trainer.max_steps=2", "trainer.batch_size=4", "trainer.warmup=1", "trainer.progress=false",
                 "trainer.trackers=[]", f"cache_dir={root / 'cache'}"]) == 0
    return {"run": run, "data_dir": data_dir, "test": sorted(test)}


def test_the_vqa_test_dev_command_runs_as_printed_on_coco_named_images(coco_named, tmp_path, monkeypatch, capsys):
    command, example = doc_blocks("**VQA** (EvalAI")
    args = doc_command(command, RUN=str(coco_named["run"]), DATA_DIR=str(coco_named["data_dir"]))
    assert any("image_id_format: 'COCO_test2015_{:012d}'" in a for a in args)
    monkeypatch.chdir(tmp_path)
    assert console(args) == 0, capsys.readouterr().err
    results = json.loads((tmp_path / "vqa_test-dev_results.json").read_text())
    questions = json.loads((coco_named["data_dir"] / TEST_DEV).read_text())["questions"]
    assert {q["image_id"] for q in questions} <= set(coco_named["test"])  # integer ids, as COCO's files give them
    assert [r["question_id"] for r in results] == [q["question_id"] for q in questions]
    assert [set(r) for r in doc_json(example)] == [set(results[0])] * len(doc_json(example))
    # the example as it was, without image_id_format: the images are not found under the integer ids
    old = [re.sub(r", image_id_format: '[^']*'", "", a) for a in args]
    assert old != args
    capsys.readouterr()
    assert console(old) == 1
    err = capsys.readouterr().err
    assert "missing from the feature store" in err and f"'{coco_named['test'][0]}'" in err


def test_task_keys_without_task_name_task_and_its_choices(coco_named, capsys):
    run = coco_named["run"]
    questions = coco_named["data_dir"] / TEST_DEV
    code = console(["evaluate", f"checkpoint={run}", "split=test", f"task.files.test={{questions:{questions}}}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "unknown key 'task.files.test': the task.* keys come with a task; name it first, task=<name> " \
           "task.files.test=..., task= taking nlvr2, refexp, retrieval, snli_ve, vqa" in err
    assert "keys of task: name" not in err and "task.name" not in err
    code = console(["evaluate", f"checkpoint={run}", "task=nlvr2", "split=test"])  # another task than the run's
    err = capsys.readouterr().err
    assert code == 1 and f"task=nlvr2: {run} is a vqa run; task=vqa" in err


def test_the_retrieval_example_shows_the_keys_the_writer_writes(tmp_path, tok):
    """The page's ids in a Karpathy json of the page's form; the file vlkit writes holds the page's keys."""
    (_, example), = [doc_blocks("**Retrieval**")]
    shown = doc_json(example)
    world = ShapesWorld(seed=0, num_images=16)  # 12 test images, 4 train ones (build_data reads both)
    sentids = iter(range(5000, 6000))
    named = list(dict.fromkeys([*shown["text_retrieval"], *(i for v in shown["image_retrieval"].values() for i in v)]))
    stems = named + [str(3000000000 + i) for i in range(world.num_images - len(named))]
    images = [{"filename": f"{stem}.jpg", "split": "test" if i < 12 else "train", "imgid": i,
               "sentences": [{"raw": c, "sentid": next(sentids)} for c in world.captions(i)]}
              for i, stem in enumerate(stems)]
    karpathy = tmp_path / "dataset_flickr30k.json"
    karpathy.write_text(json.dumps({"images": images, "dataset": "flickr30k"}))
    store = region_store(tmp_path / "regions.h5", {stem: world.scene(i) for i, stem in enumerate(stems)})
    data = Retrieval.build_data({"source": "files", "path": str(karpathy), "eval_splits": ["test"]}, tok,
                                RegionSource(store, num_bb=100))
    out = tmp_path / "flickr30k_test_rankings.json"
    write_predictions(Retrieval(tiny_model("uniter")), data.eval["test"], out, batch_size=16)
    written = json.loads(out.read_text())
    assert set(shown) == set(written) and shown["k"] == written["k"]
    tested = [i for i in images if i["split"] == "test"]
    captions, stems = {str(s["sentid"]) for i in tested for s in i["sentences"]}, {i["filename"][:-4] for i in tested}
    for section, keys, values in (("image_retrieval", captions, stems), ("text_retrieval", stems, captions)):
        assert set(written[section]) == keys and set(shown[section]) <= keys, section
        assert all(len(v) == written["k"] and set(v) <= values for v in written[section].values())
        assert all(set(v) <= values for v in shown[section].values()), section
