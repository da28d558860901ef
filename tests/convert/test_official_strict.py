"""Strict conversion: one unexpected or missing key fails naming it, a file of another family is refused
saying which family it looks like, and no pickled code ever runs (``torch.load(weights_only=True)``)."""
from __future__ import annotations

import os
import pickle
import sys
import types

import pytest
import torch

from official_fixtures import fixture_path, meta
from vlkit.convert import ConversionError, from_official

VILBERT = meta("vilbert_pretrain")["config_json"]
UNITER = meta("uniter_pretrain")["config_json"]


def _state(name):
    return dict(torch.load(fixture_path(name), weights_only=True))


def test_one_extra_key_fails_naming_it():
    state = _state("vilbert_pretrain.bin")
    state["bert.encoder.layer.0.attention.self.extra.weight"] = torch.zeros(2)
    with pytest.raises(ConversionError, match=r"unexpected: bert\.encoder\.layer\.0\.attention\.self\.extra\.weight"):
        from_official("vilbert", state, config=VILBERT)


def test_one_missing_key_fails_naming_it():
    state = _state("uniter_pretrain.pt")
    del state["uniter.encoder.layer.1.attention.self.query.weight"]
    with pytest.raises(ConversionError, match=r"missing: uniter\.encoder\.layer\.1\.attention\.self\.query\.weight "
                                              r"\(vlkit model\.encoder\.layer\.1\.attention\.self\.query\.weight\)"):
        from_official("uniter", state, config=UNITER)


def test_a_misshaped_key_fails_naming_it():
    state = _state("vilbert_pretrain.bin")
    state["cls.bi_seq_relationship.weight"] = torch.zeros(3, 20)
    with pytest.raises(ConversionError, match=r"shape mismatch: \('cls\.bi_seq_relationship\.weight', \(3, 20\), \(2, 20\)\)"):
        from_official("vilbert", state, config=VILBERT)


@pytest.mark.parametrize("family,name,looks", [("vilbert", "uniter_pretrain.pt", "a UNITER checkpoint.*family=uniter"),
                                               ("uniter", "meter_clip16_vqa.ckpt", "a METER checkpoint.*family=meter"),
                                               ("meter", "vilbert_multitask.bin", "a ViLBERT checkpoint.*family=vilbert")])
def test_another_familys_file_is_refused(family, name, looks):
    with pytest.raises(ConversionError, match=f"not a {family} checkpoint: it looks like {looks}"):
        from_official(family, fixture_path(name))


def test_detector_and_text_only_files_are_named():
    with pytest.raises(ConversionError, match="bottom-up-attention detector"):
        from_official("uniter", {"roi_heads.box_predictor.cls_score.weight": torch.zeros(2, 2)})
    with pytest.raises(ConversionError, match="text-only BERT"):
        from_official("vilbert", {"bert.encoder.layer.0.output.dense.weight": torch.zeros(2, 2)})


def test_several_task_heads_need_a_task():
    with pytest.raises(ConversionError, match="holds heads for pretraining, vqa, gqa, retrieval, refexp, nlvr2, snli_ve; "
                                              "choose one with task="):
        from_official("vilbert", fixture_path("vilbert_multitask.bin"), config=VILBERT)
    with pytest.raises(ConversionError, match="holds no vqa head"):
        from_official("vilbert", fixture_path("vilbert_pretrain.bin"), config=VILBERT, task="vqa")


def test_config_errors_name_the_key():
    with pytest.raises(ConversionError, match="config hidden_size=768 disagrees with the checkpoint"):
        from_official("uniter", fixture_path("uniter_pretrain.pt"), config={**UNITER, "hidden_size": 768})
    with pytest.raises(ConversionError, match="unknown config key 'hiden_size'"):
        from_official("uniter", fixture_path("uniter_pretrain.pt"), config={"hiden_size": 48})
    with pytest.raises(ConversionError, match="visual_target=1 is not supported"):
        from_official("vilbert", fixture_path("vilbert_pretrain.bin"), config={**VILBERT, "visual_target": 1})
    with pytest.raises(ConversionError, match="give num_attention_heads"):  # 48 is not a multiple of 64
        from_official("uniter", fixture_path("uniter_pretrain.pt"))


def test_untied_decoder_and_broken_tie():
    """An MLM decoder that differs from the word embeddings loads untied; UNITER's feat_regress must stay
    img_linear's transpose (vlkit ties them as the official code does)."""
    state = _state("vilbert_pretrain.bin")
    state["cls.predictions.decoder.weight"] = state["cls.predictions.decoder.weight"].clone() + 1
    pre = from_official("vilbert", state, config=VILBERT)
    mlm = pre.objectives["mlm"].predictions.decoder.weight
    assert mlm is not pre.model.embeddings.word_embeddings.weight and torch.equal(mlm, state["cls.predictions.decoder.weight"])
    state = _state("uniter_pretrain.pt")
    state["feat_regress.weight"] = state["feat_regress.weight"].clone() + 1
    with pytest.raises(ConversionError, match="tied .*objectives.mrfr.weight.* receive different official tensors"):
        from_official("uniter", state, config=UNITER)


def test_unsupported_files_are_refused(tmp_path):
    (tmp_path / "weights.pkl").write_bytes(pickle.dumps({"w": 1}))
    with pytest.raises(ConversionError, match="unsupported checkpoint type '.pkl'"):
        from_official("uniter", tmp_path / "weights.pkl")
    (tmp_path / "empty.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConversionError, match=r"refused: torch.load\(weights_only=True\) cannot read it"):
        from_official("uniter", tmp_path / "empty.pt")
    torch.save({"state_dict": {"uniter.embeddings.x": [1, 2]}}, tmp_path / "list.ckpt")
    with pytest.raises(ConversionError, match="key 'uniter.embeddings.x' holds list, not a tensor"):
        from_official("uniter", tmp_path / "list.ckpt")


class Payload:
    """Runs ``os.makedirs(marker)`` when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (str(self.marker),)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pickle_payloads_are_refused(tmp_path):
    marker = tmp_path / "PWNED"
    files = {
        "evil.bin": lambda p: torch.save({"bert.embeddings.word_embeddings.weight": torch.zeros(2, 2),
                                          "evil": Payload(marker)}, p),
        "evil.ckpt": lambda p: torch.save({"state_dict": {"w": torch.zeros(1)}, "hyper_parameters": Payload(marker)}, p),
        "evil_legacy.pt": lambda p: torch.save({"w": torch.zeros(1), "x": Payload(marker)}, p,
                                               _use_new_zipfile_serialization=False),
        "evil_raw.pt": lambda p: p.write_bytes(pickle.dumps({"w": Payload(marker)})),
    }
    for name, write in files.items():
        write(tmp_path / name)
        with pytest.raises(ConversionError, match=f"{name}: refused: (it pickles .*makedirs|torch.load.* cannot read it)"):
            from_official("vilbert", tmp_path / name)
        assert not marker.exists(), f"{name} ran its payload"


def test_config_containers_in_hyper_parameters_are_read_without_their_code(tmp_path, monkeypatch):
    """Lightning files may pickle sacred's ReadOnlyDict / ReadOnlyList next to the weights: they load as plain
    containers, by name, without importing sacred or running any of the class's code."""
    marker = tmp_path / "RAN"
    sacred = types.ModuleType("sacred.config.custom_containers")

    class ReadOnlyDict(dict):
        def __reduce__(self):
            return self.__class__, (dict(self),), {"message": "read-only"}

        def __setstate__(self, state):
            marker.mkdir()

    class ReadOnlyList(list):
        def __reduce__(self):
            return self.__class__, (list(self),)

    for cls in (ReadOnlyDict, ReadOnlyList):
        cls.__module__, cls.__qualname__ = sacred.__name__, cls.__name__
        setattr(sacred, cls.__name__, cls)
    for name in ("sacred", "sacred.config"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, sacred.__name__, sacred)
    ckpt = torch.load(fixture_path("meter_clip16_vqa.ckpt"), weights_only=True)
    config = ReadOnlyDict(ckpt["hyper_parameters"]["config"])
    config["train_transform_keys"] = ReadOnlyList(config["train_transform_keys"])
    ckpt["hyper_parameters"] = {"config": config}
    torch.save(ckpt, tmp_path / "sacred.ckpt")
    for name in ("sacred", "sacred.config", sacred.__name__):
        monkeypatch.delitem(sys.modules, name)
    task = from_official("meter", tmp_path / "sacred.ckpt", config={"text_config": {"num_attention_heads": 2}})
    assert task.model.config.image_size == 48 and not marker.exists()
