"""Issue 23: named released weights, ``<family>/<tag>`` as timm's ``arch.tag``: `vlkit.list_pretrained` names them,
``vlkit convert pretrained=<name> src=<file>`` converts one into its folder, and ``build_model(family,
pretrained=tag)`` loads it from there (nothing is downloaded); a release not converted yet says how to."""
from __future__ import annotations

import json

import pytest
import torch

import vlkit
from official_fixtures import fixture_path, meta
from vlkit.cli import main
from vlkit.convert import from_official
from vlkit.registry import UnknownNameError
from vlkit.released import PRETRAINED, PretrainedWeights, register_pretrained


@pytest.fixture
def weights(tmp_path, monkeypatch):
    monkeypatch.setenv("VLKIT_WEIGHTS", str(tmp_path / "weights"))
    entry = register_pretrained(PretrainedWeights("uniter", "tiny.fixture", "uniter_pretrain.pt",
                                                  "the parity fixture in UNITER's layout"))
    yield tmp_path / "weights"
    PRETRAINED._entries.pop(entry.name)


def test_the_released_weights_are_named():
    names = vlkit.list_pretrained()
    assert {"uniter/base.official", "uniter/large.official", "vilbert/base.official", "meter/clip16-roberta.288"} <= set(names)
    assert vlkit.list_pretrained("uniter") == ["uniter/base.official", "uniter/large.official"]
    assert PRETRAINED.get("vilbert/base.multitask").task == "pretraining"


def test_a_release_not_converted_says_how_to_convert_it(weights):
    assert vlkit.list_pretrained(available=True) == []
    with pytest.raises(FileNotFoundError, match=r"uniter/base\.official: not converted yet.*released at https://"
                                                r".*uniter-base\.pt.*vlkit convert pretrained=uniter/base\.official "
                                                r"src=uniter-base\.pt"):
        vlkit.build_model("uniter", pretrained="base.official")
    with pytest.raises(UnknownNameError, match="did you mean 'base.official'"):
        vlkit.build_model("uniter", pretrained="base.oficial")


def test_convert_a_named_release_then_build_it(weights):
    src, config = fixture_path("uniter_pretrain.pt"), meta("uniter_pretrain")["config_json"]
    (weights.parent / "uniter.json").write_text(json.dumps(config))
    assert main(["convert", "pretrained=uniter/tiny.fixture", f"src={src}", f"config={weights.parent / 'uniter.json'}"]) == 0
    assert (weights / "uniter" / "tiny.fixture" / "model" / "config.json").is_file()
    assert vlkit.list_pretrained("uniter", available=True) == ["uniter/tiny.fixture"]
    model = vlkit.build_model("uniter", pretrained="tiny.fixture").eval()
    expected = from_official("uniter", src, config=config).model
    batch = expected.example_batch(batch_size=2)
    torch.testing.assert_close(model(batch).joint, expected(batch).joint, atol=0, rtol=0)
    with pytest.raises(ValueError, match="fixes the config"):
        vlkit.build_model("uniter", pretrained="tiny.fixture", num_hidden_layers=1)
    with pytest.raises(ValueError, match="family=vilbert conflicts with pretrained=uniter/tiny.fixture"):
        main(["convert", "pretrained=uniter/tiny.fixture", "family=vilbert", f"src={src}", "overwrite=true"])
