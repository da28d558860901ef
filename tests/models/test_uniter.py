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
