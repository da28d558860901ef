"""Issue 23: a region family from an outside package whose config names the data sizes its own way
(``visual_embedding_dim``, no detector classes) runs every command, and ships a converter of checkpoints in
its own layout that ``vlkit convert``, `from_official` and the family guess from a file's keys find."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

import vlkit
from vlkit.cli import main
from vlkit.convert import ConversionError, detect_family, from_official
from vlkit.testing import FamilyContract
from vlkit.train.preflight import PreflightError

PACKAGE = Path(__file__).resolve().parent / "vlkit_visualbert"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


@pytest.fixture(scope="module", autouse=True)  # the contract class below needs it too
def plugin(install_plugin):
    return install_plugin("vlkit_visualbert", "vlkit_visualbert", "visualbert")


class TestVisualBertContract(FamilyContract): family = "visualbert"  # noqa: E701 (vlkit.testing's suite, one line)


def official_layout(model: vlkit.VLModel) -> dict[str, torch.Tensor]:
    """``model``'s weights under VisualBERT's own key names, with a pre-training head the converter leaves out."""
    converter = sys.modules["vlkit_visualbert"].VisualBertConverter
    state = {}
    for key, value in model.state_dict().items():
        ours, theirs = next((o, t) for o, t in converter.renames if key.startswith(o))
        state[theirs + key[len(ours):]] = value.clone()
    state["cls.predictions.bias"] = torch.zeros(model.vocab_size)
    return state


def test_the_family_declares_its_own_size_fields(plugin):
    model = vlkit.build_model("visualbert", preset="tiny", visual_embedding_dim=48).eval()
    assert model.region_feature_size == 48 and model.region_classes is None
    assert model.data_field("region_feature_size") == "visual_embedding_dim"
    batch = model.example_batch(batch_size=3)
    assert batch.region_feats.shape[-1] == 48 and batch.region_soft_labels is None  # no detector classes to label
    assert model(batch).joint.shape == (3, 64)
    with pytest.raises(vlkit.IncompatibleObjective, match="visualbert declares no config field"):
        vlkit.build_objective("mrc_kl", model)  # MRC needs the classes the family does not take


def test_pretrain_then_every_task_through_the_commands(command_args, plugin, cache, tmp_path):
    pre = tmp_path / "pre"
    assert main(["pretrain", "model=visualbert", *command_args(cache, pre)]) == 0
    config = json.loads((pre / "model" / "config.json").read_text())["config"]
    store = next(Path(cache).glob("shapes_*.h5"))
    from vlkit.features.store import FeatureStore

    with FeatureStore(store) as features:
        assert config["visual_embedding_dim"] == features.feature_dim != 64  # the store's size, not the preset's
    assert "v_feature_size" not in config and "v_target_size" not in config
    for task in ("vqa", "retrieval", "refexp", "nlvr2", "snli_ve"):
        ft = tmp_path / task
        assert main(["finetune", f"task={task}", "model=visualbert", f"init={pre}", *command_args(cache, ft)]) == 0
        metrics = json.loads((ft / "run.json").read_text())["metrics"]
        assert metrics and all(0.0 <= v <= 1.0 for k, v in metrics.items() if not k.endswith("/n")), (task, metrics)
        assert main(["evaluate", f"checkpoint={ft}", f"cache_dir={cache}"]) == 0
        assert json.loads((ft / "eval.json").read_text()) == metrics
    with pytest.raises(PreflightError, match="mrc_kl.*visualbert declares no config field"):
        main(["pretrain", "model=visualbert", "objectives=uniter", *command_args(cache, tmp_path / "mrc")])


def test_a_file_of_the_plugin_layout_converts_through_the_command(plugin, tmp_path):
    model = vlkit.build_model("visualbert", preset="tiny").eval()
    state = official_layout(model)
    assert detect_family(list(state)) == "visualbert"
    path = tmp_path / "visualbert_tiny.bin"
    torch.save(state, path)
    batch = model.example_batch(batch_size=2)
    for name, family in (("named", ["family=visualbert"]), ("guessed", [])):  # family= omitted: the keys decide
        dst = tmp_path / name
        assert main(["convert", *family, f"src={path}", f"dst={dst}", "config={num_attention_heads: 2}"]) == 0
        info = json.loads((dst / "run.json").read_text())
        assert info["family"] == "visualbert" and list(info["converted"]["unused"]) == ["cls.predictions.bias"]
        torch.testing.assert_close(vlkit.from_pretrained(dst / "model").eval()(batch).joint, model(batch).joint)
    converted, report = from_official("visualbert", state, config={"num_attention_heads": 2}, return_report=True)
    assert report.mapped == len(model.state_dict()) and report.family == "visualbert"
    with pytest.raises(ConversionError, match="not a uniter checkpoint: it looks like a VisualBERT checkpoint.*"
                                              "family=visualbert"):
        from_official("uniter", path)
    with pytest.raises(ConversionError, match="no converter for family 'visualbrt'.*did you mean 'visualbert'"):
        from_official("visualbrt", path)


def test_the_documentation_shows_the_region_plugin():
    blocks = re.findall(r"```(\w+)\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert (PACKAGE / "vlkit_visualbert.py").read_text() in [code for lang, code in blocks if lang == "python"]
