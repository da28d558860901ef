"""Issue 2: every family builds, runs, caches, pads and saves as promised."""
import dataclasses

import pytest
import torch

import vlkit
import vlkit.models.compile
from vlkit.testing import keep_rows_errors

# the checks of every family are vlkit.testing.FamilyContract (tests/models/test_contract.py); these go further
FAMILIES = vlkit.list_models()


def test_list_models():
    assert {"meter", "uniter", "vilbert"} <= set(vlkit.list_models())


@pytest.mark.parametrize("family,preset,count", [
    ("vilbert", "base", 246_726_656 - 11_020_800),  # official BertModel minus the unused q_dense1/2
    ("vilbert", "large", None),
    ("uniter", "base", 109_898_752),
    ("uniter", "large", 335_695_872),
    ("meter", "clip16-roberta", 319_281_152 - 39_424 - 1_024 - 590_592),  # minus unused CLIP-text + pooler
    ("meter", "clip32-roberta", None),
    ("meter", "swin-roberta", None),
])
def test_presets_build_with_official_parameter_counts(family, preset, count):
    with torch.device("meta"):
        model = vlkit.build_model(family, preset=preset)
    n = sum(p.numel() for p in model.parameters())
    if count is not None:
        assert n == count
    assert model.config.preset == preset


def test_vilbert_task_tokens_add_official_count():
    with torch.device("meta"):
        model = vlkit.build_model("vilbert", preset="base", task_specific_tokens=True)
    assert sum(p.numel() for p in model.parameters()) == 246_742_016 - 11_020_800


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_forward_backward(family, build_tiny):
    model = build_tiny(family).train()
    batch = model.example_batch(batch_size=3)
    out = model(batch)
    b, t = batch.input_ids.shape
    assert out.text_states.shape[:2] == (b, t)
    assert out.joint.shape == (b, model.joint_size)
    assert out.region_states.shape[1] == (batch.region_feats.shape[1] if batch.has_regions else
                                          (model.config.image_size // model.config.patch_size) ** 2)
    (out.joint.sum() + out.text_states.sum() + out.image_states.sum()).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert sum(g is not None and bool(g.abs().sum() > 0) for g in grads) > 0.9 * len(grads)


@pytest.mark.parametrize("family,overrides", [
    ("vilbert", {}), ("vilbert", {"single_stream": True}), ("vilbert", {"task_specific_tokens": True}),
    ("uniter", {}), ("meter", {}), ("meter", {"fusion": "merged"}),
])
def test_pooled_only_fusion_keeps_poolers(family, overrides, build_tiny):
    """``pooled_only`` computes the last layers at the pooled positions only: same poolers and joint,
    and the states it returns are the full run's states at those positions."""
    model = build_tiny(family, **overrides)
    batch = model.example_batch(batch_size=3, text_len=9, num_regions=7)
    kwargs = {"task_ids": torch.tensor([1, 0, 1])} if overrides.get("task_specific_tokens") else {}
    with torch.no_grad():
        full, pooled = model(batch, **kwargs), model(batch, pooled_only=True, **kwargs)
    for name in ("text_pooled", "image_pooled", "joint"):
        torch.testing.assert_close(getattr(pooled, name), getattr(full, name), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(pooled.text_states[:, 0], full.text_states[:, 0], atol=1e-6, rtol=1e-5)
    assert pooled.text_states.shape[1] == 1 and pooled.text_mask.shape == pooled.text_states.shape[:2]
    if family != "uniter":
        torch.testing.assert_close(pooled.image_states[:, 0], full.image_states[:, 0], atol=1e-6, rtol=1e-5)
        assert pooled.image_states.shape[1] == 1 and pooled.image_mask.shape == pooled.image_states.shape[:2]


def _perturb(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p))


@pytest.mark.parametrize("family", ["vilbert", "meter"])
def test_coattention_updates_both_streams_simultaneously(family, build_tiny):
    """The image output of co-layer i reads the text *input* of layer i, never its text update."""
    model = build_tiny(family)
    batch = model.example_batch(batch_size=2)
    text, image = model.encode_text(batch), model.encode_image(batch)
    t_mask = vlkit.models.layers.additive_mask(text.mask, torch.float32)
    v_mask = vlkit.models.layers.additive_mask(image.mask, torch.float32)
    with torch.no_grad():
        if family == "vilbert":
            layer = model.encoder.c_layer[0]
            vis_a, txt_a = layer(image.states, v_mask, text.states, t_mask)
            for m in (layer.biOutput.dense2, layer.biOutput.LayerNorm2, layer.t_intermediate, layer.t_output):
                _perturb(m)  # everything that computes the text update
            vis_b, txt_b = layer(image.states, v_mask, text.states, t_mask)
        else:
            text_layer, image_layer = model.cross_modal_text_layers[0], model.cross_modal_image_layers[0]
            vis_a, txt_a = image_layer(image.states, v_mask, text.states, t_mask), text_layer(text.states, t_mask, image.states, v_mask)
            full_a = model.fuse(text, image).image_states
            _perturb(text_layer)
            vis_b, txt_b = image_layer(image.states, v_mask, text.states, t_mask), text_layer(text.states, t_mask, image.states, v_mask)
            full_b = model.fuse(text, image).image_states
            assert not torch.allclose(full_a, full_b)  # ... but later layers do see it
    torch.testing.assert_close(vis_a, vis_b)
    assert not torch.allclose(txt_a, txt_b)


def test_from_pretrained_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        vlkit.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="config.json"):
        vlkit.from_pretrained(tmp_path)


def test_build_model_errors_and_overrides():
    with pytest.raises(vlkit.UnknownNameError, match="meter, uniter, vilbert"):
        vlkit.build_model("lxmert")
    with pytest.raises(vlkit.UnknownNameError, match="presets: tiny"):
        vlkit.build_model("uniter", preset="huge")
    with pytest.raises(TypeError, match="no field"):
        vlkit.build_model("uniter", preset="tiny", num_layers=3)
    model = vlkit.build_model("uniter", preset="tiny", num_hidden_layers=1)
    assert len(model.encoder.layer) == 1


def test_build_model_from_a_command_config_node():
    from vlkit.cli import compose

    node = compose("pretrain", ["model=uniter", "model.num_hidden_layers=3"]).model
    model = vlkit.build_model(node)
    assert model.config.preset == "tiny" and len(model.encoder.layer) == 3
    assert vlkit.build_model(node, preset="base").config.hidden_size == 768


def test_build_model_refuses_another_preset_for_a_resolved_config():
    config = vlkit.MODELS.get("uniter").config_class.from_preset("tiny", num_hidden_layers=2)
    assert len(vlkit.build_model(config, preset="tiny").encoder.layer) == 2  # its own preset: fine
    with pytest.raises(ValueError, match="preset 'tiny', not preset='base'"):
        vlkit.build_model(config, preset="base")


@pytest.mark.parametrize("family", FAMILIES)
def test_hydra_node_is_derived_from_the_config_dataclass(family):
    from vlkit.config import hydra_node

    node = hydra_node(family)
    fields = {f.name for f in dataclasses.fields(vlkit.MODELS.get(family).config_class)}
    assert set(node) == fields | {"name"} and node["preset"] == "tiny"
    assert all(v is None for k, v in node.items() if k not in ("name", "preset"))


def test_presets_are_in_hydra_config_store():
    from hydra.core.config_store import ConfigStore

    from vlkit.config import register_model_configs

    register_model_configs()
    repo = ConfigStore.instance().repo["model"]
    for name in ("uniter.yaml", "vilbert_base.yaml", "uniter_large.yaml", "meter_clip16-roberta.yaml", "meter_tiny.yaml"):
        assert name in repo
    node = repo["uniter_base.yaml"].node
    assert node.name == "uniter" and node.preset == "base" and node.hidden_size is None
    model_cfg = vlkit.MODELS.get("uniter").config_class.from_preset(node.preset)
    assert model_cfg.hidden_size == 768 and model_cfg.vocab_size == 28996


def test_list_models_with_presets():
    listed = vlkit.list_models(presets=True)
    assert {"uniter/base", "uniter/tiny", "vilbert/large", "meter/clip16-roberta"} <= set(listed)
    assert listed == [f"{f}/{p}" for f in vlkit.list_models() for p in vlkit.MODELS.get(f).config_class.presets]


DROPOUT = {"vilbert": dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, v_hidden_dropout_prob=0.1,
                           v_attention_probs_dropout_prob=0.1),
           "uniter": dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
           "meter": dict(drop_rate=0.1)}


def _loss_and_grads(model, batch):
    torch.manual_seed(7)  # the same dropout draws
    model.zero_grad()
    out = model(batch)
    loss = out.joint.square().sum() + out.text_states.mean() + out.image_states.mean()
    loss.backward()
    return out.joint.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", DROPOUT)
def test_activation_checkpointing_keeps_outputs_and_gradients(family, build_tiny):
    """Dropout on: the recomputed blocks draw the same masks, so the step is bitwise the plain one."""
    model = build_tiny(family, **DROPOUT[family]).train()
    batch = model.example_batch(batch_size=3)
    plain = _loss_and_grads(model, batch)
    assert model.set_activation_checkpointing() >= 4
    checkpointed = _loss_and_grads(model, batch)
    assert torch.equal(plain[0], checkpointed[0]) and plain[1].keys() == checkpointed[1].keys()
    assert all(torch.equal(plain[1][n], checkpointed[1][n]) for n in plain[1])
    model.set_activation_checkpointing(False)
    assert not any("forward" in vars(b) for b in vlkit.models.compile.transformer_blocks(model))


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_blocks_keep_outputs(family, build_tiny):
    """Regional compilation (the eager backend here, to keep the test fast): same outputs and gradients."""
    model = build_tiny(family).train()
    batch = model.example_batch(batch_size=3)
    plain = _loss_and_grads(model, batch)
    assert model.compile_blocks(backend="eager") >= 4
    compiled = _loss_and_grads(model, batch)
    torch.testing.assert_close(compiled[0], plain[0], rtol=0, atol=1e-6)
    for name, grad in plain[1].items():
        torch.testing.assert_close(compiled[1][name], grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_projections_keep_outputs_and_gradients(family, build_tiny, monkeypatch):
    """Q/K/V (and ViLBERT's co-attention projections) as one GEMM over the concatenated weights: the
    outputs and gradients of one GEMM each, and the state-dict keys unchanged."""
    from vlkit.models import layers

    model = build_tiny(family).train()
    batch = model.example_batch(batch_size=3)
    keys = list(model.state_dict())
    fused = _loss_and_grads(model, batch)
    monkeypatch.setattr(layers, "FUSE_PROJECTIONS", False)
    separate = _loss_and_grads(model, batch)
    torch.testing.assert_close(fused[0], separate[0], rtol=0, atol=1e-6)
    for name, grad in separate[1].items():
        assert (fused[1][name] - grad).abs().max() <= 1e-5 * grad.abs().max().clamp(min=1.0), name
    assert list(model.state_dict()) == keys


@pytest.mark.parametrize("family,overrides", [("vilbert", {}), ("vilbert", {"single_stream": True}), ("uniter", {}),
                                              ("meter", {}), ("meter", {"fusion": "merged"})])
def test_keep_rows_computes_the_kept_positions_exactly(family, overrides, build_tiny):
    """``fuse(keep_rows=...)``: the states of the kept token / region positions and the joint vector equal
    the full fusion's; the last layers skip the rest (returned as zeros, or computed as filler)."""
    model = build_tiny(family, **overrides)
    errors = keep_rows_errors(model, model.example_batch(batch_size=3, text_len=10, num_regions=8, seed=2))
    assert errors["joint"] <= 1e-6 and errors["text_states"] <= 1e-5 and errors["image_states"] <= 1e-5, errors
