"""The bottom-up-attention detector: architecture, Caffe conventions, the BUTD selection rule, training."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from vlkit.features.detector import (
    BottomUpDetector, Stem, average_precision, butd_select, cell_anchors, decode_boxes, encode_boxes, legacy_nms,
    load_detector, preset, save_detector,
)
from vlkit.features.detector.training import losses as detector_losses


def test_butd_r101_architecture_and_output_shapes():
    torch.manual_seed(0)
    # the real R101 architecture; small input and few proposals keep the forward fast
    model = BottomUpDetector(preset("butd_r101", min_size=96, max_size=160, rpn_post_nms_topk=24)).eval()
    state = model.state_dict()
    assert len(model.backbone.res4) == 23 and len(model.roi_heads.res5) == 3
    assert state["proposal_generator.rpn_head.conv.weight"].shape == (512, 1024, 3, 3)
    assert state["proposal_generator.rpn_head.objectness_logits.weight"].shape == (12, 512, 1, 1)
    assert state["roi_heads.box_predictor.cls_score.weight"].shape == (1601, 2048)
    assert state["roi_heads.box_predictor.bbox_pred.weight"].shape == (1601 * 4, 2048)
    assert state["roi_heads.box_predictor.cls_embedding.weight"].shape == (1601, 256)
    assert state["roi_heads.box_predictor.fc_attr.weight"].shape == (512, 2048 + 256)
    assert state["roi_heads.box_predictor.attr_score.weight"].shape == (401, 512)
    # res5: stride 1, conv2 dilated by 2 (14x14 RoIs stay 14x14)
    assert model.roi_heads.res5[0].conv1.stride == (1, 1) and model.roi_heads.res5[0].conv2.dilation == (2, 2)
    rng = np.random.default_rng(0)
    out = model.extract([rng.integers(0, 256, (120, 200, 3), dtype=np.uint8)])[0]
    n = len(out["boxes"])
    assert 10 <= n <= 24
    assert out["features"].shape == (n, 2048) and out["cls_prob"].shape == (n, 1601)
    assert out["attr_prob"].shape == (n, 401) and out["conf"].shape == (n,)
    assert (out["image_h"], out["image_w"]) == (120, 200)
    assert out["objects_id"].max() < 1600 and out["attrs_id"].max() < 400
    np.testing.assert_allclose(out["cls_prob"].sum(1), 1, atol=1e-5)
    assert (out["boxes"][:, [0, 2]] <= 199).all() and (out["boxes"][:, [1, 3]] <= 119).all() and (out["boxes"] >= 0).all()


def test_caffe_stem_max_pool_pad0_ceil():
    stem = Stem(preset("butd_r101")).eval()
    with torch.no_grad():
        # conv1 gives 300x500: pad 0 with floor would pool to 149x249, ceil gives 150x250
        assert stem(torch.zeros(1, 3, 600, 1000)).shape[-2:] == (150, 250)
        # conv1 gives 301x501: pad 1 (torchvision / d2 default) would pool to 151x251
        assert stem(torch.zeros(1, 3, 601, 1001)).shape[-2:] == (150, 250)


def test_cell_anchors_match_py_faster_rcnn_generate_anchors():
    expected = [[-84, -40, 99, 55], [-176, -88, 191, 103], [-360, -184, 375, 199], [-56, -56, 71, 71],
                [-120, -120, 135, 135], [-248, -248, 263, 263], [-36, -80, 51, 95], [-80, -168, 95, 183],
                [-168, -344, 183, 359]]
    assert cell_anchors(16, (8, 16, 32), (0.5, 1, 2)).tolist() == expected
    a = cell_anchors(16, (4, 8, 16, 32), (0.5, 1, 2))  # BUTD: 12 anchors 64-512 px
    widths = a[:, 2] - a[:, 0] + 1
    assert len(a) == 12 and widths[4:8].tolist() == [64, 128, 256, 512]


def test_box_coder_round_trip_and_legacy_iou():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(20, 2, generator=g) * 50
    ref = torch.cat([a, a + torch.rand(20, 2, generator=g) * 40 + 2], 1)
    b = torch.rand(20, 2, generator=g) * 50
    tgt = torch.cat([b, b + torch.rand(20, 2, generator=g) * 40 + 2], 1)
    for w in [(1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0)]:
        # py-faster-rcnn's bbox_transform_inv puts x2 at ctr + w/2 (no -1): one pixel past the +1 width
        expected = tgt + torch.tensor([0.0, 0.0, 1.0, 1.0])
        torch.testing.assert_close(decode_boxes(encode_boxes(ref, tgt, w), ref, w), expected, atol=1e-4, rtol=1e-5)
    # Caffe +1 IoU: [0,0,9,9] and [5,0,14,9] overlap 5x10 of 10x10 boxes -> 50 / 150 = 1/3
    boxes = torch.tensor([[0.0, 0, 9, 9], [5, 0, 14, 9]])
    assert len(legacy_nms(boxes, torch.tensor([0.9, 0.8]), 0.33)) == 1
    assert len(legacy_nms(boxes, torch.tensor([0.9, 0.8]), 0.34)) == 2


def _separate_boxes(n: int) -> torch.Tensor:
    xs = torch.arange(n, dtype=torch.float32) * 20
    return torch.stack([xs, torch.zeros(n), xs + 10, torch.full((n,), 10.0)], 1)


def _probs(conf: torch.Tensor, num_classes: int = 5) -> torch.Tensor:
    """Rows whose best foreground probability is ``conf`` (class 1), the rest on background."""
    p = torch.zeros(len(conf), num_classes)
    p[:, 1] = conf
    p[:, 0] = 1 - conf
    return p


@pytest.mark.parametrize("n_conf,expected", [(150, 100), (3, 10), (25, 25), (0, 10)])
def test_butd_select_threshold_and_10_to_100(n_conf, expected):
    n = 200
    conf = torch.full((n,), 0.05)
    conf[:n_conf] = torch.linspace(0.9, 0.2, max(n_conf, 1))[:n_conf]  # 0.2 exactly is kept (>=)
    keep, max_conf = butd_select(_separate_boxes(n), _probs(conf), 0.3, 0.2, 10, 100)
    assert len(keep) == expected
    kept = max_conf[keep]
    assert torch.all(kept[:-1] >= kept[1:])
    assert int((kept >= 0.2).sum()) == min(n_conf, 100)


def test_butd_select_fixed_36_and_per_class_nms():
    conf = torch.linspace(0.9, 0.3, 50)
    keep, _ = butd_select(_separate_boxes(50), _probs(conf), min_boxes=36, max_boxes=36)
    assert len(keep) == 36
    # two identical boxes: the weaker one is suppressed in class 1 and scores only via class 2
    boxes = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 10]])
    probs = torch.tensor([[0.1, 0.6, 0.3, 0.0], [0.3, 0.5, 0.2, 0.0]])
    keep, max_conf = butd_select(boxes, probs, min_boxes=1, max_boxes=10)
    torch.testing.assert_close(max_conf, torch.tensor([0.6, 0.0]))  # class 2: box 0 (0.3) beats box 1
    assert keep.tolist() == [0]


def test_butd_select_matches_brute_force_loop():
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        r, c = int(torch.randint(5, 120, (1,), generator=g)), int(torch.randint(3, 40, (1,), generator=g))
        xy = torch.rand(r, 2, generator=g) * 100
        boxes = torch.cat([xy, xy + torch.rand(r, 2, generator=g) * 60 + 2], 1)
        probs = (torch.randn(r, c, generator=g) * float(torch.rand(1, generator=g) * 6)).softmax(1)
        max_conf = torch.zeros(r)
        for k in range(1, c):  # generate_tsv.py's loop
            kept = legacy_nms(boxes, probs[:, k], 0.3)
            max_conf[kept] = torch.maximum(max_conf[kept], probs[kept, k])
        order = torch.sort(max_conf, descending=True, stable=True).indices
        n = min(max(int((max_conf >= 0.2).sum()), 10), 100, r)
        keep, got = butd_select(boxes, probs)
        assert keep.tolist() == order[:n].tolist()
        torch.testing.assert_close(got[keep], max_conf[order[:n]])


def test_extract_sorted_and_given_boxes(tiny_detector, rgb_images):
    outs = tiny_detector.extract(rgb_images)
    for o in outs:
        assert 3 <= len(o["boxes"]) <= 12
        assert np.all(np.diff(o["conf"]) <= 0)
        assert o["features"].shape[1] == tiny_detector.cfg.feature_dim
    given = [np.array([[1, 2, 30, 40], [10, 10, 63, 47], [0, 0, 5, 5]], dtype=np.float32)]
    g = tiny_detector.extract(rgb_images[:1], given_boxes=given)[0]
    np.testing.assert_allclose(g["boxes"], given[0], atol=1e-4)
    assert g["features"].shape == (3, tiny_detector.cfg.feature_dim)
    # features depend only on the box: the same box alone gives the same row
    alone = tiny_detector.extract(rgb_images[:1], given_boxes=[given[0][1:2]])[0]
    np.testing.assert_allclose(alone["features"][0], g["features"][1], rtol=1e-4, atol=1e-5)


def test_batched_extraction_equals_one_by_one(tiny_detector, rgb_images):
    together = tiny_detector.extract(rgb_images)
    for img, o in zip(rgb_images, together):
        single = tiny_detector.extract([img])[0]
        np.testing.assert_allclose(single["features"], o["features"], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(single["boxes"], o["boxes"], atol=1e-3)


@pytest.mark.parametrize("dilation", [2, 1])
def test_fast_inference_keeps_the_features(tiny_detector, rgb_images, monkeypatch, tiny_config, randomize, dilation):
    """Batch norm folded into the convolutions and channels-last (NHWC) activations against the plain NCHW
    conv + norm network: the same boxes, features and class distributions."""
    from vlkit.features.detector.network import ConvNorm

    model = tiny_detector if dilation == 2 else randomize(BottomUpDetector(tiny_config(res5_dilation=1))).eval()
    fast = model.extract(rgb_images)
    monkeypatch.setattr(ConvNorm, "forward", lambda self, x: self.norm(nn.Conv2d.forward(self, x)))
    monkeypatch.setattr(BottomUpDetector, "channels_last", False)
    plain = model.extract(rgb_images)
    for f, p in zip(fast, plain):
        np.testing.assert_allclose(f["boxes"], p["boxes"], rtol=0, atol=1e-3)  # the same boxes, in order
        for key in ("features", "cls_prob", "attr_prob", "conf"):
            scale = max(float(np.abs(p[key]).max()), 1.0)
            np.testing.assert_allclose(f[key], p[key], rtol=0, atol=1e-5 * scale, err_msg=key)


def test_training_losses_decrease(tiny_config):
    torch.manual_seed(0)
    model = BottomUpDetector(tiny_config(norm="bn", bbox_reg_weights=(10.0, 10.0, 5.0, 5.0), roi_batch_per_image=32))
    img = np.zeros((64, 64, 3), dtype=np.uint8)
    img[10:30, 12:40] = (255, 0, 0)
    img[40:60, 40:60] = (0, 0, 255)
    target = {"boxes": np.array([[12, 10, 39, 29], [40, 40, 59, 59]], np.float32), "labels": np.array([1, 2]),
              "attributes": np.array([[1, 3], [2, -1]])}
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    first = None
    for _ in range(15):
        losses = detector_losses(model, [img, img], [target, target])
        total = sum(losses.values())
        assert all(torch.isfinite(v) for v in losses.values())
        first = float(total.detach()) if first is None else first
        opt.zero_grad()
        total.backward()
        opt.step()
    assert float(total.detach()) < 0.7 * first


def test_average_precision_known_values():
    gt = [{"boxes": [[0, 0, 10, 10], [20, 20, 30, 30]], "labels": [1, 1]}, {"boxes": [[0, 0, 10, 10]], "labels": [2]}]
    perfect = [{"boxes": [[0, 0, 10, 10], [20, 20, 30, 30]], "scores": [0.9, 0.8], "labels": [1, 1]},
               {"boxes": [[0, 0, 10, 10]], "scores": [0.7], "labels": [2]}]
    assert average_precision(perfect, gt) == {1: 1.0, 2: 1.0}
    # class 1: a false positive ranked first, then both hits -> precision 1/2, 2/3 at recall 0.5, 1
    fp_first = [{"boxes": [[50, 50, 60, 60], [0, 0, 10, 10], [20, 20, 30, 30]], "scores": [0.95, 0.9, 0.8],
                 "labels": [1, 1, 1]}, {"boxes": np.zeros((0, 4)), "scores": [], "labels": []}]
    aps = average_precision(fp_first, gt)
    assert aps[1] == pytest.approx(0.5 * 2 / 3 + 0.5 * 2 / 3) and aps[2] == 0.0
    # a duplicate of a matched box is a false positive
    dup = [{"boxes": [[0, 0, 10, 10], [0, 0, 10, 10]], "scores": [0.9, 0.8], "labels": [1, 1]},
           {"boxes": [[0, 0, 10, 10]], "scores": [0.7], "labels": [2]}]
    assert average_precision(dup, gt)[1] == pytest.approx(0.5)


def test_save_and_load_detector_round_trip(tmp_path, rgb_images, tiny_config, randomize):
    torch.manual_seed(0)
    model = randomize(BottomUpDetector(tiny_config(norm="bn"))).eval()
    path = save_detector(model, tmp_path, "tiny", meta={"map50": 0.5})
    loaded = load_detector(path)
    assert loaded.provenance["weights_sha256"] and loaded.cfg == model.cfg
    a, b = model.extract(rgb_images[:1])[0], loaded.extract(rgb_images[:1])[0]
    np.testing.assert_array_equal(a["features"], b["features"])
    with pytest.raises(ValueError, match="needs weights"):
        load_detector("butd")
