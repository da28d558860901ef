"""Catalogue, issue 44 class 9: registries check a plugin's declarations when it registers (the tests/plugins
pattern: a plugin module found through a ``vlkit.plugins`` entry point), naming the plugin and the rule."""
from __future__ import annotations

import importlib.metadata
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vlkit import registry
from vlkit.registry import RegistrationError

CLASH = """
import vlkit
from vlkit.convert import OfficialConverter

@vlkit.register_converter("uniter", signature=("my_uniter.",))
class MyUniter(OfficialConverter):
    family = "uniter"
"""

FAMILY = """
from dataclasses import dataclass
from torch import nn
import vlkit

@dataclass
class RegionConfig(vlkit.ModelConfig):
    family = "{name}"
    presets = {{"tiny": dict(vocab_size=100, hidden_size=8), "base": {{}}}}
    vocab_size: int = 100
    hidden_size: int = 8
    feature_dim: int = 2048  # its own name for the region feature size
    {extra}

@vlkit.register_model("{name}")
class RegionFamily(vlkit.VLModel):
    family = "{name}"
    config_class = RegionConfig
    image_input = "{image_input}"
    {declaration}
"""


def _plugin(tmp_path, monkeypatch, module: str, source: str) -> None:
    """``module`` (``source``) as an installed plugin: on sys.path, named by a ``vlkit.plugins`` entry point."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint(name=module, value=module, group=registry.PLUGIN_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep] if group == registry.PLUGIN_GROUP else [])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.delitem(sys.modules, module, raising=False)


def test_a_plugin_converter_taking_a_builtin_name_first_is_refused_at_its_call(tmp_path):
    """Imported before the built-ins load (a fresh process): the built-ins are loaded first, so the clash is named
    at the plugin's call instead of breaking the built-in registration later."""
    (tmp_path / "clash_plugin.py").write_text(CLASH)
    import vlkit

    checkout = Path(vlkit.__file__).resolve().parents[1]  # this vlkit, not another install
    run = subprocess.run([sys.executable, "-c", "import clash_plugin"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{checkout}"})
    assert run.returncode == 1
    assert ("RegistrationError: converter 'uniter' is already registered by vlkit's built-in "
            "vlkit.convert.uniter.UniterConverter; clash_plugin.MyUniter cannot take its name") in run.stderr


def test_a_plugin_converter_taking_a_builtin_name_later_is_refused_through_the_cli(tmp_path, monkeypatch,
                                                                                  vlkit_console, caplog):
    """The plugin is left out (issue 54: one plugin never breaks a command), warned naming it and the clash; the
    command goes on to its own error."""
    registry.CONVERTERS.names()  # the built-ins first: the other order
    _plugin(tmp_path, monkeypatch, "clash_plugin", CLASH)
    monkeypatch.setattr(registry, "_plugin_failures", {})
    with caplog.at_level(logging.WARNING, logger=registry.log.name):
        code, _, err = vlkit_console("convert", f"src={tmp_path / 'x.pt'}", f"dst={tmp_path / 'dst'}")
    [message] = [r.getMessage() for r in caplog.records if r.name == registry.log.name]
    assert message.startswith("vlkit: plugin clash_plugin (entry point clash_plugin = clash_plugin) failed to load and "
                              "is left out: RegistrationError: converter 'uniter' is already registered")
    assert "clash_plugin.MyUniter cannot take its name" in message and "override=True" in message
    assert code == 1 and "x.pt: checkpoint not found" in err and "looks like a bug" not in err
    assert registry.CONVERTERS.get("uniter").__module__ == "vlkit.convert.uniter"


def test_a_region_family_without_the_default_size_fields_is_refused_at_registration(tmp_path, monkeypatch,
                                                                                     vlkit_console, caplog):
    source = FAMILY.format(name="regionfam", extra="", image_input="regions", declaration="")
    _plugin(tmp_path, monkeypatch, "regionfam_plugin", source)
    monkeypatch.setattr(registry, "_plugin_failures", {})
    try:  # the plugin is left out with a warning; asking for its family names it and why it failed
        with caplog.at_level(logging.WARNING, logger=registry.log.name):
            code, _, err = vlkit_console("pretrain", "model=regionfam", f"trainer.output_dir={tmp_path / 'out'}")
        assert "vlkit: plugin regionfam_plugin (entry point regionfam_plugin = regionfam_plugin) failed" in caplog.text
        assert code in (1, 2) and "looks like a bug" not in err and "v_feature_size" in err, err
        assert "plugin regionfam_plugin (entry point regionfam_plugin = regionfam_plugin) failed to load" in err
        assert "model 'regionfam' (regionfam_plugin.RegionFamily) breaks the family contract " \
               "(VLModel.check_contract)" in err and "declares no size_fields" in err
        assert "regionfam" not in registry.MODELS._entries
    finally:
        registry.MODELS._entries.pop("regionfam", None)


@pytest.mark.parametrize("image_input, declaration, accepted", [
    ("regions", 'size_fields = {"vocab_size": "vocab_size", "region_feature_size": "feature_dim", '
                '"region_classes": None}', True),  # its own field named (HF VisualBERT's pattern)
    ("regions", 'size_fields = {"vocab_size": "vocab_size", "region_feature_size": "feat_dim", '
                '"region_classes": None}', False),  # a field its config lacks
    ("pixels", "", False),  # no image_size / patch_size
])
def test_the_family_contract_is_checked_when_it_registers(image_input, declaration, accepted, tmp_path, monkeypatch):
    name = f"fam{abs(hash((image_input, declaration))) % 10000}"
    source = FAMILY.format(name=name, extra="", image_input=image_input, declaration=declaration)
    (tmp_path / f"{name}_plugin.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        if accepted:
            __import__(f"{name}_plugin")
            assert name in registry.MODELS
        else:
            with pytest.raises(RegistrationError, match=r"VLModel\.check_contract"):
                __import__(f"{name}_plugin")
            assert name not in registry.MODELS._entries
    finally:
        registry.MODELS._entries.pop(name, None)
        sys.modules.pop(f"{name}_plugin", None)


def test_a_converter_signature_overlapping_another_is_refused():
    class Broad:
        pass

    with pytest.raises(RegistrationError, match=r"signature prefix 'uniter\.' overlaps 'uniter\.img_embeddings\.' "
                                                r"of converter 'uniter'"):
        registry.register_converter("broad", signature=("uniter.",))(Broad)
    assert "broad" not in registry.CONVERTERS._entries
