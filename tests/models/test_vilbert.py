"""ViLBERT specifics: [IMG] token, task tokens, layer schedule, depth k, single-stream baseline."""
import pytest
import torch

import vlkit


def test_img_token_is_mean_of_real_regions_with_whole_image_box(build_tiny):
    model = build_tiny("vilbert")
    batch = model.example_batch(batch_size=2)
    seen = {}
    model.v_embeddings.register_forward_hook(lambda m, args, out: seen.update(feats=args[0], boxes=args[1]))
    with torch.no_grad():
        out = model(batch)
    real = batch.region_mask[-1].bool()
    torch.testing.assert_close(seen["feats"][-1, 0], batch.region_feats[-1][real].mean(0))
    torch.testing.assert_close(seen["boxes"][:, 0], torch.tensor([[0.0, 0.0, 1.0, 1.0]] * 2))
    assert out.image_offset == 1 and out.image_states.shape[1] == batch.region_feats.shape[1] + 1
    assert out.image_mask[:, 0].eq(1).all()


def test_relu_poolers_and_product_joint(build_tiny):
    model = build_tiny("vilbert")
    with torch.no_grad():
        out = model(model.example_batch())
    assert (out.text_pooled >= 0).all() and (out.image_pooled >= 0).all()
    torch.testing.assert_close(out.joint, out.text_pooled * out.image_pooled)
    summed = build_tiny("vilbert", fusion_method="sum")
    summed.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(summed(model.example_batch()).joint, out.text_pooled + out.image_pooled)


def test_task_token_inserted_after_cls_and_dropped_from_outputs(build_tiny):
    model = build_tiny("vilbert", task_specific_tokens=True)
    batch = model.example_batch(batch_size=2)
    with pytest.raises(ValueError, match="task_ids"):
        model(batch)
    with torch.no_grad():
        a = model(batch, task_ids=torch.tensor([1, 1]))
        b = model(batch, task_ids=torch.tensor([3, 3]))
        enc = model.encode_text(batch, task_ids=torch.tensor([1, 1]))
    assert enc.states.shape[1] == batch.input_ids.shape[1] + 1
    assert a.text_states.shape[:2] == batch.input_ids.shape
    assert not torch.allclose(a.joint, b.joint)


@pytest.mark.parametrize("k", [2, 4, 6, 8])
def test_depth_k_follows_official_schedule(k):
    with torch.device("meta"):
        model = vlkit.build_model("vilbert", preset="base", num_coattention_layers=k)
    c = model.config
    assert c.v_biattention_id == list(range(k)) and c.t_biattention_id == list(range(12 - k, 12))
    assert len(model.encoder.c_layer) == k and len(model.encoder.v_layer) == k


def test_layer_execution_order_matches_official(build_tiny):
    """Base-style order for tiny (t_bi [2,3], v_bi [0,1]): L0 L1 co0 L2 V0 co1 V1 L3."""
    model = build_tiny("vilbert")
    order = []
    for i, layer in enumerate(model.encoder.layer):
        layer.register_forward_hook(lambda *a, i=i: order.append(f"L{i}"))
    for i, layer in enumerate(model.encoder.v_layer):
        layer.register_forward_hook(lambda *a, i=i: order.append(f"V{i}"))
    for i, layer in enumerate(model.encoder.c_layer):
        layer.register_forward_hook(lambda *a, i=i: order.append(f"co{i}"))
    with torch.no_grad():
        model(model.example_batch())
    assert order == ["L0", "L1", "co0", "L2", "V0", "co1", "V1", "L3"]


def test_single_stream_baseline(build_tiny):
    model = build_tiny("vilbert", single_stream=True).train()
    assert not hasattr(model.encoder, "c_layer") and not hasattr(model, "t_pooler")
    batch = model.example_batch(batch_size=2)
    out = model(batch)
    assert out.joint.shape == (2, model.config.hidden_size)
    torch.testing.assert_close(out.joint, out.text_pooled)
    out.joint.sum().backward()
    assert model.v_embeddings.image_embeddings.weight.grad.abs().sum() > 0


def test_first_coattention_projections_are_cached_exactly(build_tiny):
    """encode_text / encode_image carry the first co-attention's projections of their stream: fusing with
    them equals fusing without them (recomputed), so retrieval scores each caption's / image's once."""
    from vlkit.types import Encoded

    model = build_tiny("vilbert")
    batch = model.example_batch(batch_size=3)
    with torch.no_grad():
        text, image = model.encode_text(batch), model.encode_image(batch)
        assert text.extra["co_proj"].shape[-1] == 3 * model.config.bi_hidden_size
        cached = model.fuse(text, image)
        plain = model.fuse(Encoded(text.states, text.mask), Encoded(image.states, image.mask))
    torch.testing.assert_close(cached.joint, plain.joint, rtol=0, atol=1e-6)
    torch.testing.assert_close(cached.text_states, plain.text_states, rtol=0, atol=1e-6)
