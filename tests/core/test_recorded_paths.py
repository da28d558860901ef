"""The paths a record names (`vlkit.runs`): ``run.json`` and ``processor.json`` write them resolved (relative to
their folder when inside it, else absolute) through one function; on load a relative path is read from the record's
folder, never the working directory, and a path outside the folder only when it is in the user's cache, passed by
the caller, or recorded by this user's vlkit (issue 52: a run loaded from another folder with its own ``photos/``
read those; issue 54: a saved model chose where vlkit wrote its feature store)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from PIL import Image

import vlkit
from vlkit.cli import main
from vlkit.runs import RecordedPathError, own_record, record_path

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["a", "red", "blue", "green", "yellow", "square"]


def _world(root, colours):
    """``photos/`` of one square each (``colours``), ``captions.jsonl`` and a bare ``vocab/vocab.txt`` under root."""
    (root / "photos").mkdir(parents=True)
    for k, colour in enumerate(colours):
        Image.new("RGB", (40, 40), colour).save(root / "photos" / f"photo_{k}.png")
    (root / "captions.jsonl").write_text("".join(json.dumps({"image_id": f"photo_{k}", "caption": f"a {c} square"})
                                                 + "\n" for k, c in enumerate(colours)))
    (root / "vocab").mkdir()
    (root / "vocab" / "vocab.txt").write_text("\n".join(SPECIAL + WORDS) + "\n")


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    """The user's vlkit cache of this test ($VLKIT_CACHE): where the digests of the records it writes go."""
    monkeypatch.setenv("VLKIT_CACHE", str(tmp_path / "user-cache"))
    return tmp_path / "user-cache"


def _pixels(processor):
    return processor(images=["photo_0", "photo_1"], text=["a square", "a square"]).pixel_values


def test_record_path_is_relative_inside_the_folder_and_absolute_outside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run" / "tokenizer").mkdir(parents=True)
    assert record_path("run/tokenizer", tmp_path / "run") == "tokenizer"
    assert record_path("photos", tmp_path / "run") == str(tmp_path / "photos")


def test_a_fine_tunings_task_files_are_recorded_absolute(tmp_path, monkeypatch):
    from vlkit.runs import record_task_paths

    monkeypatch.chdir(tmp_path)
    for name in ("q.json", "a.json", "t.json", "karpathy.json"):
        (tmp_path / name).write_text("{}")
    task = {"name": "vqa", "source": "files", "files": {"train": {"questions": "q.json", "annotations": "a.json",
                                                                  "image_id_format": "img_{}"},
                                                        "val": None, "test": [{"questions": "t.json"}]}}
    assert record_task_paths(task, tmp_path / "run")["files"] == {
        "train": {"questions": str(tmp_path / "q.json"), "annotations": str(tmp_path / "a.json"),
                  "image_id_format": "img_{}"}, "val": None, "test": [{"questions": str(tmp_path / "t.json")}]}
    assert record_task_paths({"name": "retrieval", "path": "karpathy.json", "image_id": "stem"}, tmp_path / "run") == {
        "name": "retrieval", "path": str(tmp_path / "karpathy.json"), "image_id": "stem"}


def test_runs_and_saved_processors_record_absolute_paths_and_load_from_another_folder(tmp_path, monkeypatch,
                                                                                   user_cache):
    """A run written with relative paths (the command line's and Python's ``vlkit.pretrain`` share `save_run`) and
    a saved processor built on a relative folder both record it absolute; loaded from another folder that has its own
    ``photos/``, each reads the images it was trained on, never that folder's."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    _world(home, ["red", "blue"])
    _world(elsewhere, ["green", "yellow"])  # the same file names, other pictures
    monkeypatch.chdir(home)
    assert main(["pretrain", "model=meter/tiny", "data=jsonl", "data.path=captions.jsonl", "data.image.source=folder",
                 "data.image.path=photos", "data.tokenizer=vocab", "trainer.max_steps=2", "trainer.batch_size=2",
                 "trainer.warmup=1", "trainer.progress=false", "trainer.trackers=[]", "trainer.output_dir=run"]) == 0
    recorded = json.loads((home / "run" / "run.json").read_text())["data"]
    assert recorded["image"]["path"] == str(home / "photos") and recorded["path"] == str(home / "captions.jsonl")
    assert recorded["tokenizer"] == str(home / "vocab")
    processor = vlkit.build_processor("meter/tiny", tokenizer="vocab", images="photos")
    vlkit.build_model("meter", processor=processor).save_pretrained("saved")
    saved = json.loads((home / "saved" / "processor.json").read_text())
    assert saved["build"]["images"] == saved["data"]["image"]["path"] == str(home / "photos")
    assert "cache_dir" not in saved["build"] and saved["tokenizer"] == "tokenizer"
    expected = _pixels(processor)

    monkeypatch.chdir(elsewhere)
    for folder in (home / "run", home / "saved"):
        _, loaded = vlkit.load_model_and_processor(folder)
        assert loaded.data_config["image"]["path"] == str(home / "photos")
        assert torch.equal(_pixels(loaded), expected), folder  # home's pictures, not elsewhere's
    assert not torch.equal(_pixels(vlkit.build_processor("meter/tiny", tokenizer="vocab", images="photos")), expected)


def test_a_recorded_path_that_is_gone_says_what_moved_and_what_to_pass(tmp_path, monkeypatch, user_cache):
    _world(tmp_path, ["red", "blue"])
    monkeypatch.chdir(tmp_path)
    processor = vlkit.build_processor("meter/tiny", tokenizer="vocab", images="photos")
    vlkit.build_model("meter", processor=processor).save_pretrained("saved")
    expected = _pixels(processor)
    (tmp_path / "photos").rename(tmp_path / "moved")
    with pytest.raises(RecordedPathError) as err:
        vlkit.load_model_and_processor("saved")
    message = str(err.value)
    assert str(tmp_path / "saved" / "processor.json") in message and f"build.images={tmp_path / 'photos'} is gone" in message
    assert "pass images= (load_model_and_processor(folder, images=...)) where it is now" in message
    _, loaded = vlkit.load_model_and_processor("saved", images="moved")
    assert torch.equal(_pixels(loaded), expected)


def test_a_model_folder_from_someone_else_chooses_nothing_outside_it(tmp_path, monkeypatch, user_cache):
    """A copied (or edited) model folder's outside paths are read only when passed; its recorded ``build.cache_dir``
    is never used: features extracted again go to the user's cache."""
    _world(tmp_path, ["red", "blue"])
    monkeypatch.chdir(tmp_path)
    first_cache = tmp_path / "first-cache"
    processor = vlkit.build_processor("uniter/tiny", tokenizer="vocab", images="photos", cache_dir=first_cache)
    vlkit.build_model("uniter", processor=processor).save_pretrained("mine")
    assert own_record(tmp_path / "mine" / "processor.json")
    shutil.copytree(tmp_path / "mine", tmp_path / "theirs")  # a folder from someone else: not recorded here
    with pytest.raises(RecordedPathError, match=r"build.images=.*photos lies outside .*theirs, and this record is not "
                                                r"one your vlkit wrote there.*pass images="):
        vlkit.load_model_and_processor("theirs")

    record = json.loads((tmp_path / "mine" / "processor.json").read_text())
    evil = tmp_path / "somewhere" / "else"
    record["build"]["cache_dir"] = str(evil)  # as older vlkit versions recorded it, or as anyone may write it
    (tmp_path / "mine" / "processor.json").write_text(json.dumps(record))
    shutil.rmtree(first_cache)  # the features must be extracted again
    _, loaded = vlkit.load_model_and_processor("mine", images="photos")  # edited: its images must be passed
    assert not evil.exists() and not (tmp_path / "somewhere").exists()
    store = loaded.image_source.store.path
    assert str(store).startswith(str(user_cache)) and sorted(loaded.image_source.store.ids()) == ["photo_0", "photo_1"]

    record["tokenizer"] = "../../vocab"  # a tokenizer outside the model folder is not read either
    (tmp_path / "theirs" / "processor.json").write_text(json.dumps(record))
    with pytest.raises(RecordedPathError, match="tokenizer=../../vocab lies outside"):
        vlkit.load_model_and_processor("theirs", images="photos")


def test_a_processor_json_naming_a_system_folder_is_refused_as_such(tmp_path, monkeypatch, user_cache):
    _world(tmp_path, ["red", "blue"])
    monkeypatch.chdir(tmp_path)
    vlkit.build_model("meter", processor=vlkit.build_processor("meter/tiny", tokenizer="vocab", images="photos")
                      ).save_pretrained("saved")
    record = json.loads((tmp_path / "saved" / "processor.json").read_text())
    record["build"]["images"] = "/etc"
    (tmp_path / "saved" / "processor.json").write_text(json.dumps(record))
    with pytest.raises(RecordedPathError) as err:
        vlkit.load_model_and_processor("saved")
    assert "build.images=/etc is a system folder" in str(err.value) and "feature store" not in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match=r"images=.*empty is a folder that holds no image files .* is no feature store"):
        vlkit.build_processor("meter/tiny", tokenizer="vocab", images="empty")


def test_a_python_run_from_a_run_folder_reads_its_data_by_the_rule_in_python_spelling(tmp_path, monkeypatch,
                                                                                       user_cache):
    """``vlkit.pretrain(run)`` without ``data`` keeps the run's data, read by `vlkit.runs.run_data`: a copied run's
    outside paths and a gone one are refused naming the argument that passes them; a path given replaces it."""
    _world(tmp_path, ["red", "blue"])
    monkeypatch.chdir(tmp_path)
    assert main(["pretrain", "model=meter/tiny", "data=jsonl", "data.path=captions.jsonl", "data.image.source=folder",
                 "data.image.path=photos", "data.tokenizer=vocab", "trainer.max_steps=2", "trainer.batch_size=2",
                 "trainer.warmup=1", "trainer.progress=false", "trainer.trackers=[]", "trainer.output_dir=run"]) == 0
    shutil.copytree(tmp_path / "run", tmp_path / "theirs")
    trainer = {"max_steps": 2, "batch_size": 2, "warmup": 1, "progress": False, "trackers": []}
    with pytest.raises(RecordedPathError) as err:
        vlkit.pretrain(str(tmp_path / "theirs"), trainer=trainer, output_dir="again", quiet=True)
    assert f"data.path={tmp_path / 'captions.jsonl'} lies outside" in str(err.value)
    assert 'pass pretrain(data={"path": ...}) to read it' in str(err.value)

    (tmp_path / "photos").rename(tmp_path / "moved")
    with pytest.raises(RecordedPathError) as err:
        vlkit.pretrain(str(tmp_path / "run"), trainer=trainer, output_dir="again", quiet=True)
    assert f"data.image.path={tmp_path / 'photos'} is gone" in str(err.value)
    assert 'pass pretrain(data={"image": {"path": ...}}) where it is now' in str(err.value)
    vlkit.pretrain(str(tmp_path / "run"), data={"image": {"path": "moved"}}, trainer=trainer, output_dir="again",
                   quiet=True)
    assert json.loads((tmp_path / "again" / "run.json").read_text())["data"]["image"]["path"] == str(tmp_path / "moved")
