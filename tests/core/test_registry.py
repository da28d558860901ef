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


def test_heads_are_keyed_by_task_and_family_with_a_generic_fallback():
    from vlkit.models.heads import JointClassifier, NLVR2Head, VQAHead

    heads = registry.HEADS
    assert heads.names("nlvr2", "uniter") == ["pair_biattn", "pair"]  # the family's default first
    assert heads.get("nlvr2", "meter").output == "nlvr2_classifier"
    assert heads.get("vqa", "no-such-family") is VQAHead and heads.get("nlvr2", "no-such-family") is NLVR2Head
    with pytest.raises(ValueError, match="meter has no head 'pair_biattn'; choose one of pair"):
        heads.get("nlvr2", "meter", "pair_biattn")

    @registry.register_head("vqa", "toy-family")
    class ToyHead(JointClassifier):
        output, loss = "toy_output", "ce"

    @registry.register_head("vqa", "toy-family", "second", default=True)
    class SecondHead(JointClassifier):
        output, loss = "second_output", "ce"

    try:
        assert heads.get("vqa", "toy-family") is SecondHead and heads.get("vqa", "toy-family", "default") is ToyHead
        assert heads.get("snli_ve", "toy-family").output == "snli_ve_head"  # no head of its own: the generic one
        with pytest.raises(ValueError, match="already registered"):
            registry.register_head("vqa", "toy-family")(type("Other", (JointClassifier,), {}))
    finally:
        heads._entries.pop(("vqa", "toy-family"))
        heads._defaults.pop(("vqa", "toy-family"))


def test_a_task_installs_its_head_under_the_official_names(build_tiny):
    task = vlkit.build_task("nlvr2", build_tiny("uniter"))
    keys = [k for k in task.state_dict() if not k.startswith("model.")]
    assert keys[:2] == ["nlvr2_output.weight", "nlvr2_output.bias"] and "attn_pool.fc.0.weight" in keys
    assert task.head is task.nlvr2_output and task.task_head.attn1 is task.attn1
    task.eval()
    assert not task.task_head.training and not task.attn1.training
