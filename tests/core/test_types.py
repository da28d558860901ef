"""The VLBatch contract: validation with named fields, device moves, indexing, no shared mutation."""
import pytest
import torch

from vlkit.types import Encoded, LossOutput, VLBatch


def _batch(b=3, t=5, k=4):
    return VLBatch(input_ids=torch.arange(b * t).view(b, t), attention_mask=torch.ones(b, t, dtype=torch.long),
                   region_feats=torch.randn(b, k, 6), region_boxes=torch.rand(b, k, 4),
                   region_mask=torch.ones(b, k, dtype=torch.long), targets={"label": torch.arange(b), "answers": ["x", "y", "z"]},
                   ids=["a", "b", "c"])


def test_validation_names_the_field():
    with pytest.raises(ValueError, match="attention_mask"):
        VLBatch(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="missing region_boxes, region_mask"):
        VLBatch(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3),
                region_feats=torch.randn(2, 4, 6))
    with pytest.raises(ValueError, match="region_mask has 3 regions"):
        VLBatch(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3),
                region_feats=torch.randn(2, 4, 6), region_boxes=torch.rand(2, 4, 4), region_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="ids has 1 entries"):
        VLBatch(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3), ids=["a"])


def test_index_selects_rows_everywhere():
    batch = _batch()
    sub = batch.index([2, 0])
    assert sub.ids == ["c", "a"] and sub.targets["answers"] == ["z", "x"]
    torch.testing.assert_close(sub.targets["label"], torch.tensor([2, 0]))
    torch.testing.assert_close(sub.region_feats, batch.region_feats[[2, 0]])
    assert sub.batch_size == 2 and sub.has_regions and not sub.has_pixels


def test_replace_and_to_never_share_targets():
    batch = _batch()
    new = batch.replace(input_ids=batch.input_ids + 1)
    new.targets["extra"] = 1
    assert "extra" not in batch.targets
    moved = batch.to("cpu")
    assert moved is not batch and moved.targets is not batch.targets
    torch.testing.assert_close(moved.region_feats, batch.region_feats)


def test_encoded_index_and_loss_metrics():
    enc = Encoded(torch.randn(3, 2, 4), torch.ones(3, 2), {"x": torch.arange(3)})
    sub = enc.index([1, 1])
    torch.testing.assert_close(sub.extra["x"], torch.tensor([1, 1]))
    out = LossOutput(torch.tensor(2.0, requires_grad=True), {"acc": torch.tensor(0.5), "n": 3})
    assert out.detached_metrics() == {"acc": 0.5, "n": 3.0}
