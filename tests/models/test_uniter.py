"""UNITER specifics: 7-d boxes, image type id 1 from the text table, the learned mask embedding."""
import torch

from vlkit.models.embeddings import box_locations


def test_box_locations():
    boxes = torch.tensor([[0.1, 0.2, 0.5, 0.6]])
    torch.testing.assert_close(box_locations(boxes, 7), torch.tensor([[0.1, 0.2, 0.5, 0.6, 0.4, 0.4, 0.16]]))
    torch.testing.assert_close(box_locations(boxes, 5), torch.tensor([[0.1, 0.2, 0.5, 0.6, 0.16]]))


def test_mask_embedding_only_touches_masked_regions(build_tiny):
    model = build_tiny("uniter")
    batch = model.example_batch(batch_size=1)
    masked = torch.zeros_like(batch.region_mask, dtype=torch.bool)
    masked[0, 2] = True
    with torch.no_grad():
        model.img_embeddings.mask_embedding.weight.normal_()
        plain = model.encode_image(batch).states
        with_mask = model.encode_image(batch.replace(region_masked=masked)).states
    changed = (plain - with_mask).abs().sum(-1)[0] > 1e-6
    assert changed.tolist() == masked[0].tolist()


def test_images_use_token_type_one_of_the_text_table(build_tiny):
    model = build_tiny("uniter")
    batch = model.example_batch(batch_size=1)
    with torch.no_grad():
        before = model.encode_image(batch).states
        model.embeddings.token_type_embeddings.weight[0].add_(1.0)  # text type: no effect on images
        same = model.encode_image(batch).states
        model.embeddings.token_type_embeddings.weight[1].add_(1.0)
        after = model.encode_image(batch).states
    torch.testing.assert_close(before, same)
    assert not torch.allclose(before, after)


def _ragged_batch(model):
    """Lengths that vary in opposite directions, so the packed sequence is shorter than text + regions."""
    batch = model.example_batch(batch_size=3, text_len=12, num_regions=10, seed=4)
    text = torch.tensor([[1] * 12, [1] * 5 + [0] * 7, [1] * 9 + [0] * 3])
    regions = torch.tensor([[1] * 3 + [0] * 7, [1] * 10, [1] * 6 + [0] * 4])
    return batch.replace(attention_mask=text, region_mask=regions, region_feats=batch.region_feats * regions[..., None])


def test_packed_sequence_gives_the_padded_outputs_at_real_positions(build_tiny):
    """UNITER's fuse packs each example's regions after its own text (length 15 here instead of 22): the
    states, pooled vector and gradients of every real position equal the [text padded | regions padded] run."""
    from vlkit.models.layers import run_single_stream
    from vlkit.models.rows import packing

    model = build_tiny("uniter", hidden_dropout_prob=0.0)
    batch = _ragged_batch(model)
    assert packing(batch.attention_mask, batch.region_mask)[0].shape[1] == 15
    text, image = model.encode_text(batch), model.encode_image(batch)
    packed = model.fuse(text, image)
    padded_t, padded_i = run_single_stream(model.encoder.layer, text, image, pack=False)
    t_real, i_real = batch.attention_mask.bool(), batch.region_mask.bool()
    torch.testing.assert_close(packed.text_states[t_real], padded_t[t_real], rtol=0, atol=2e-6)
    torch.testing.assert_close(packed.image_states[i_real], padded_i[i_real], rtol=0, atol=2e-6)
    assert not packed.text_states[~t_real].any() and not packed.image_states[~i_real].any()
    torch.testing.assert_close(packed.joint, model.pooler(padded_t), rtol=0, atol=2e-6)
    pooled = model.fuse(text, image, pooled_only=True)
    torch.testing.assert_close(pooled.joint, packed.joint, rtol=0, atol=2e-6)
    grads = []
    weights = torch.randn(int(t_real.sum()) + int(i_real.sum()), model.config.hidden_size)
    for pack in (True, False):
        model.zero_grad()
        t, i = run_single_stream(model.encoder.layer, model.encode_text(batch), model.encode_image(batch), pack=pack)
        (torch.cat([t[t_real], i[i_real]]) * weights).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1])
    for a, b in zip(*grads):  # float sums in another order: within 1e-5 of each gradient's scale
        assert (a - b).abs().max() <= 1e-5 * a.abs().max().clamp(min=1.0)


def test_packed_sequence_with_kept_rows(build_tiny):
    """Packing and computing only kept positions together: the kept real positions as in the full run."""
    model = build_tiny("uniter")
    batch = _ragged_batch(model)
    keep_t = torch.zeros(3, 12, dtype=torch.bool)
    keep_t[:, 3] = True
    keep_i = torch.zeros(3, 10, dtype=torch.bool)
    keep_i[1, 7] = keep_i[2, 0] = True
    with torch.no_grad():
        text, image = model.encode_text(batch), model.encode_image(batch)
        full, pruned = model.fuse(text, image), model.fuse(text, image, keep_rows=(keep_t, keep_i))
    torch.testing.assert_close(pruned.joint, full.joint, rtol=0, atol=1e-6)
    kt, ki = keep_t & batch.attention_mask.bool(), keep_i & batch.region_mask.bool()
    torch.testing.assert_close(pruned.text_states[kt], full.text_states[kt], rtol=0, atol=1e-5)
    torch.testing.assert_close(pruned.image_states[ki], full.image_states[ki], rtol=0, atol=1e-5)
