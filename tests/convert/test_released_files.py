"""Issue 21: the released files the converters take, with their sources (`vlkit.released`), and a
convert that refuses an empty or truncated file naming its path, and a known file whose size or sha256
differs from the publisher's."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from official_fixtures import fixture_path, meta
from vlkit.cli import main
from vlkit.convert import ConversionError, from_official
from vlkit.convert.commands import read_answers
from vlkit.features.detector.convert import read_checkpoint
from vlkit.convert.official import read_config
from vlkit.released import RELEASED_FILES, ReleasedFile, check_released, known_file
from vlkit.io import sha256_file

UNITER = meta("uniter_pretrain")["config_json"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"


@pytest.mark.parametrize("name,read", [
    ("uniter-base.pt", lambda p: from_official("uniter", p)),
    ("model.safetensors", lambda p: from_official("uniter", p)),
    ("uniter-base.json", read_config),
    ("trainval_label2ans.pkl", read_answers),
    ("faster_rcnn_from_caffe_attr.pkl", read_checkpoint),
])
def test_an_empty_file_is_refused_naming_its_path(tmp_path, name, read):
    path = tmp_path / name
    path.touch()
    with pytest.raises(ValueError, match=f"{path}: the .* is empty \\(0 bytes\\)") as err:
        read(path)
    if known_file(name):
        assert known_file(name).source in str(err.value)  # where to download it again


def test_a_truncated_checkpoint_is_refused_naming_its_path(tmp_path):
    for name in ("uniter_pretrain.pt", "uniter_pretrain.safetensors"):
        path = tmp_path / name
        path.write_bytes(fixture_path(name).read_bytes()[:2000])
        with pytest.raises(ConversionError, match=f"{path}: not a readable"):
            from_official("uniter", path, config=UNITER)


def test_a_known_file_is_checked_against_its_published_size_and_sha256(tmp_path, monkeypatch, capsys):
    good = fixture_path("uniter_pretrain.pt")
    entry = ReleasedFile("uniter-test.pt", "uniter", "test", "https://example.org/uniter-test.pt", "test",
                         size=good.stat().st_size, sha256=sha256_file(good))
    monkeypatch.setitem(RELEASED_FILES._entries, entry.name, entry)
    path = tmp_path / entry.name
    path.write_bytes(good.read_bytes()[:-10])
    with pytest.raises(ValueError, match=rf"{path}: {entry.size - 10:,} bytes where the released uniter-test.pt has "
                                         rf"{entry.size:,} \(truncated or another file\); download it again from "
                                         r"https://example.org/uniter-test.pt"):
        main(["convert", "family=uniter", f"src={path}", f"dst={tmp_path / 'out'}", f"config={tmp_path / 'c.json'}"])
    data = bytearray(good.read_bytes())
    data[-5] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"{path}: sha256 differs from the released uniter-test.pt's"):
        check_released(path)
    shutil.copyfile(good, path)
    assert check_released(path) == path
    assert from_official("uniter", path, config=UNITER) is not None
    assert not (tmp_path / "out").exists()  # nothing written by the refused conversions


def test_every_released_file_has_a_source_and_a_row_on_the_checkpoints_page():
    names = RELEASED_FILES.names()
    assert {"pretrained_model.bin", "multi_task_model.bin", "bert_base_6layer_6conect.json", "trainval_label2ans.pkl",
            "uniter-base.pt", "uniter-base.json", "meter_clip16_288_roberta_vqa.ckpt",
            "meter_swinbase_384_roberta_pretrain.ckpt", "faster_rcnn_from_caffe_attr.pkl"} <= set(names)
    page = DOCS.read_text(encoding="utf-8")
    for name in names:
        entry = RELEASED_FILES.get(name)
        assert entry.source.startswith("https://") and entry.origin
        assert f"`{name}`" in page and entry.source.split(" ")[0] in page, name
