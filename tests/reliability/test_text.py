"""Catalogue: annotation files and captions (encoding, empty text, over-long captions)."""
from __future__ import annotations

import json
import logging

import pytest
from reliability_helpers import captions

from vlkit.data.formats import FormatError, read_caption_jsonl, read_karpathy
from vlkit.data.images import build_image_source
from vlkit.data.pairs import ImageTextPairs
from vlkit.data.tokenizers import build_tokenizer
from vlkit.validate import DataError, SkipLog


def test_non_utf8_annotation_names_file_line_and_column(tmp_path):
    path = tmp_path / "caps.jsonl"
    path.write_bytes(b'{"image_id": "a", "caption": "a red circle"}\n' * 10 + b'{"image_id": "b", "caption": "caf\xe9"}\n')
    with pytest.raises(FormatError, match=r"caps\.jsonl:11: not UTF-8 text \(byte b'\\xe9' at column 34\)"):
        read_caption_jsonl(path)
    karpathy = tmp_path / "dataset_coco.json"
    karpathy.write_bytes(b'{"images": [\n{"filename": "x\xff.jpg"}]}')
    with pytest.raises(FormatError, match=r"dataset_coco\.json:2: not UTF-8"):
        read_karpathy(karpathy)


@pytest.mark.parametrize("text", ["", "   \t "])
def test_empty_and_whitespace_captions(tmp_path, text, data):
    caps = captions(tmp_path / "c.jsonl", ["a"], extra=[{"image_id": "a", "caption": text}])
    with pytest.raises(FormatError, match=r"c\.jsonl:4: 'caption' must be a non-empty string"):
        read_caption_jsonl(caps)
    store, _, ids = data(n=2)
    records = [{"id": "fine", "image_id": ids[0], "caption": "a red circle"},
               {"id": "blank", "image_id": ids[1], "caption": text}]
    tokenizer = build_tokenizer("shapes")
    with pytest.raises(DataError, match=r"1 example\(s\) have an empty or whitespace-only caption: 'blank'"):
        ImageTextPairs(records, tokenizer, build_image_source({"path": str(store)}))
    skips = SkipLog(tmp_path / "skipped.jsonl")
    pairs = ImageTextPairs(records, tokenizer, build_image_source({"path": str(store)}, on_error="skip", skips=skips))
    assert pairs.example_ids() == ["fine"] and skips.ids == ["blank"]
    assert json.loads((tmp_path / "skipped.jsonl").read_text())["reason"] == "empty caption"


def test_overlong_caption_is_counted_and_logged(data, caplog):
    store, _, ids = data(n=2)
    records = [{"id": "short", "image_id": ids[0], "caption": "a red circle"},
               {"id": "essay", "image_id": ids[1], "caption": " ".join(["red"] * 10000)}]
    with caplog.at_level(logging.WARNING, logger="vlkit.data"):
        pairs = ImageTextPairs(records, build_tokenizer("shapes"), build_image_source({"path": str(store)}), max_len=20)
    assert pairs.truncated == [("essay", 10002)]
    assert len(pairs[1]["input_ids"]) == 20 and pairs[1]["input_ids"][-1] == pairs[0]["input_ids"][-1]  # [SEP] kept
    assert "1 of 2 captions are longer than max_len=20 tokens and were truncated (longest: example 'essay', 10002 tokens)" \
        in caplog.text
