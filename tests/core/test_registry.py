"""The registry: decorators, helpful errors, and third-party plugins through entry points."""
import importlib.metadata
import sys

import pytest

import vlkit
from vlkit import registry
from vlkit.registry import Registry, UnknownNameError


def test_register_get_and_unknown_name_lists_entries():
    reg = Registry("widget")

    @reg.register("alpha")
    class Alpha:
        pass

    @reg.register()
    def beta():
        return 1

    assert reg.get("alpha") is Alpha and reg.get("beta") is beta
    assert reg.names() == ["alpha", "beta"] and "alpha" in reg
    with pytest.raises(UnknownNameError, match=r"unknown widget 'gamma'; registered widgets: alpha, beta"):
        reg.get("gamma")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("alpha")(type("Other", (), {}))


def test_builtin_registries_populate_lazily():
    assert vlkit.list_models() == sorted(vlkit.list_models())
    assert {"vilbert", "uniter", "meter"} <= set(registry.MODELS.names())
    assert {"hf_text", "clip", "swin"} <= set(registry.ENCODERS.names())


def test_plugin_entry_point_registers_a_model(tmp_path, monkeypatch):
    (tmp_path / "vlkit_toy_plugin.py").write_text(
        "import vlkit\n"
        "from vlkit.models.uniter import Uniter\n"
        "def register():\n"
        "    vlkit.MODELS.register('toy-uniter', override=True)(Uniter)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint(name="toy", value="vlkit_toy_plugin:register", group=registry.PLUGIN_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep] if group == registry.PLUGIN_GROUP else [])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        assert "toy-uniter" in vlkit.list_models()
        model = vlkit.build_model("toy-uniter", preset="tiny")
        assert model.family == "uniter"
    finally:
        registry.MODELS._entries.pop("toy-uniter", None)
        sys.modules.pop("vlkit_toy_plugin", None)
