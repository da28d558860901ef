import math

import pytest
import torch

from vlkit.tasks.metrics import (
    META_SUM_KEYS,
    accuracy,
    meta_sum,
    normalize_answer,
    paired_box_iou,
    recall_at_k,
    refexp_accuracy,
    vqa_accuracy,
    vqa_score_from_soft_targets,
)


@pytest.mark.parametrize("raw, expected", [
    ("Two", "2"),
    ("none", "0"),
    ("a dog", "dog"),
    ("The Red Ball", "red ball"),
    ("dont", "don't"),
    ("isnt", "isn't"),
    ("it's", "it's"),  # not in the contractions table: kept as is
    ("1,000", "1000"),  # a digit-comma-digit deletes every punctuation mark
    ("yes.", "yes"),
    ("3.5", "3.5"),  # a period before a digit stays
    ("black/white", "black white"),  # a mark touching no space splits words
    ("black / white", "black white"),  # a mark touching a space is deleted
    ("hello, world!", "hello world"),
    ("  ten\tdogs\n", "10 dogs"),
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def _humans(matching, answer="2", other="3"):
    return [answer] * matching + [other] * (10 - matching)


@pytest.mark.parametrize("matching, expected", [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (10, 1.0)])
def test_vqa_accuracy_leave_one_out_average(matching, expected):
    # For each of the 10 humans: min(1, matches among the other 9 / 3); e.g. 1 match -> 9/10 * 1/3.
    assert math.isclose(vqa_accuracy(["2"], [_humans(matching)])[0], expected)


def test_vqa_accuracy_normalises_only_when_humans_disagree():
    disagree = _humans(3)
    assert vqa_accuracy(["Two", "two.", "the 2", " 2\n"], [disagree] * 4) == pytest.approx([0.9] * 4)
    unanimous = ["2"] * 10
    assert vqa_accuracy(["2", "two", "2."], [unanimous] * 3) == [1.0, 0.0, 0.0]  # official quirk
    assert vqa_accuracy(["YES", "yes"], [["yes"] * 10] * 2) == [0.0, 1.0]  # unanimous: exact, case included


def test_vqa_accuracy_rules_on_both_sides():
    cases = [
        ("a dog", ["dog"] * 3 + ["cat"] * 7, 0.9),
        ("dont", ["don't"] * 3 + ["no"] * 7, 0.9),
        ("1,000", ["1000"] * 4 + ["many"] * 6, 1.0),
        ("red", ["red!"] * 3 + ["blue"] * 7, 0.9),
        ("two", ["2"] * 2 + ["two"] * 1 + ["3"] * 7, 0.9),  # "two" and "2" merge once normalised
    ]
    scores = vqa_accuracy([p for p, _, _ in cases], [g for _, g, _ in cases])
    assert scores == pytest.approx([e for _, _, e in cases])
    with pytest.raises(ValueError, match="question 1"):
        vqa_accuracy(["a", "b"], [["a"], []])
    with pytest.raises(ValueError, match="2 predictions"):
        vqa_accuracy(["a", "b"], [["a"]])


def test_vqa_score_from_soft_targets():
    logits = torch.tensor([[0.1, 2.0, 0.3], [5.0, 0.0, 0.0]])
    targets = torch.tensor([[0.0, 0.6, 1.0], [0.3, 1.0, 0.0]])
    torch.testing.assert_close(vqa_score_from_soft_targets(logits, targets), torch.tensor([0.6, 0.3]))


def _brute_force_recall(scores, txt2img, ks):
    """Sort-based reference: ties ranked against the ground truth (ground truth placed last among equals)."""
    n_img, n_txt = len(scores), len(scores[0])
    out = {}
    ir_ranks = []
    for t in range(n_txt):
        gt = txt2img[t]
        order = sorted(range(n_img), key=lambda i: (-scores[i][t], i == gt))
        ir_ranks.append(order.index(gt))
    tr_ranks = []
    for i in range(n_img):
        gts = {t for t in range(n_txt) if txt2img[t] == i}
        order = sorted(range(n_txt), key=lambda t: (-scores[i][t], t in gts))
        tr_ranks.append(min(order.index(t) for t in gts))
    for k in ks:
        out[f"ir_r{k}"] = sum(r < k for r in ir_ranks) / n_txt
    for k in ks:
        out[f"tr_r{k}"] = sum(r < k for r in tr_ranks) / n_img
    out["r_mean"] = sum(out.values()) / len(out)
    return out


def test_recall_at_k_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    for trial in range(5):
        n_img = 12
        txt2img = torch.cat([torch.arange(n_img), torch.randint(n_img, (30,), generator=g)])
        txt2img = txt2img[torch.randperm(len(txt2img), generator=g)]
        scores = torch.randn(n_img, len(txt2img), generator=g)
        scores[txt2img, torch.arange(len(txt2img))] += trial * 0.5  # from chance to easy
        if trial == 4:
            scores = scores.round()  # many ties
        got = recall_at_k(scores, txt2img.tolist(), ks=(1, 2, 5))
        expected = _brute_force_recall(scores.tolist(), txt2img.tolist(), (1, 2, 5))
        assert got.keys() == expected.keys()
        for key in expected:
            assert math.isclose(got[key], expected[key], abs_tol=1e-6), (trial, key)


def test_recall_at_k_ties_and_perfect_scores():
    txt2img = [0, 0, 1, 1, 2, 2]
    perfect = torch.full((3, 6), -1.0)
    perfect[txt2img, range(6)] = 1.0
    assert all(v == 1.0 for v in recall_at_k(perfect, txt2img).values())
    flat = recall_at_k(torch.zeros(3, 6), txt2img, ks=(1, 2, 3, 5))
    # every image ties: the ground truth ranks behind the 2 others (IR), behind 4 wrong captions (TR)
    assert [flat[f"ir_r{k}"] for k in (1, 2, 3)] == [0.0, 0.0, 1.0]
    assert [flat[f"tr_r{k}"] for k in (1, 3, 5)] == [0.0, 0.0, 1.0]
    assert list(recall_at_k(perfect, txt2img)) == ["ir_r1", "ir_r5", "ir_r10", "tr_r1", "tr_r5", "tr_r10", "r_mean"]


def test_recall_at_k_errors():
    with pytest.raises(ValueError, match="image 2 has no caption"):
        recall_at_k(torch.zeros(3, 2), [0, 1])
    with pytest.raises(ValueError, match="caption 1 points to image 5"):
        recall_at_k(torch.zeros(3, 3), [0, 5, 2])
    with pytest.raises(ValueError, match="NaN"):
        recall_at_k(torch.full((1, 1), float("nan")), [0])


def test_paired_box_iou_and_refexp_accuracy():
    pred = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10], [5, 5, 5, 5],
                         [0, 0, 10, 10]], dtype=torch.float)
    gt = torch.tensor([[0, 0, 10, 10],  # identical: 1
                       [0, 0, 10, 20],  # contains pred, area 2x: exactly 0.5 -> hit
                       [0, 0, 10, 20.5],  # just under 0.5 -> miss
                       [20, 20, 30, 30],  # disjoint: 0
                       [5, 5, 5, 5],  # two identical zero-area boxes: 0, no NaN
                       [10, 0, 20, 10]], dtype=torch.float)  # touching edges: 0
    iou = paired_box_iou(pred, gt)
    torch.testing.assert_close(iou, torch.tensor([1.0, 0.5, 100 / 205, 0.0, 0.0, 0.0]))
    assert math.isclose(refexp_accuracy(pred, gt), 2 / 6)  # continuous boxes, IoU >= 0.5
    assert math.isclose(refexp_accuracy(pred, gt, comparison=">"), 1 / 6)  # the exact 0.5 misses
    assert math.isclose(refexp_accuracy(pred, gt, iou_threshold=0.4), 3 / 6)
    with pytest.raises(ValueError, match=r"boxes2\[0\]"):
        paired_box_iou(pred[:1], torch.tensor([[5.0, 0, 1, 1]]))
    with pytest.raises(ValueError, match="paired_box_iou"):
        paired_box_iou(pred, gt[:2])


def test_paired_box_iou_chunks_match_formula():
    g = torch.Generator().manual_seed(1)
    a = torch.rand(2500, 4, generator=g).sort(-1).values  # x1 <= y1 <= x2 <= y2: valid xyxy
    b = torch.rand(2500, 4, generator=g).sort(-1).values
    wh = (torch.min(a[:, 2:], b[:, 2:]) - torch.max(a[:, :2], b[:, :2])).clamp(min=0)
    inter = wh[:, 0] * wh[:, 1]
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    torch.testing.assert_close(paired_box_iou(a, b, chunk=300), inter / (area(a) + area(b) - inter))


def test_accuracy():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0, 1, 1, -100])
    assert math.isclose(accuracy(logits, labels).item(), 2 / 3, rel_tol=1e-6)  # fp32 tensor
    assert math.isclose(accuracy(torch.tensor([0, 1, 0, 1]), torch.tensor([0, 1, 1, 1])).item(), 0.75)
    assert torch.isnan(accuracy(logits, torch.full((4,), -100)))
    with pytest.raises(ValueError, match="accuracy"):
        accuracy(logits, labels[:3])


def test_meta_sum():
    # UNITER-base style numbers (fractions): 72.70 + 2 x R@1 + NLVR2 + RefCOCO+
    metrics = {"vqa": 0.7270, "ir_r1": 0.7256, "tr_r1": 0.8580, "nlvr2": 0.7766, "refcoco_plus": 0.7526, "x": 9}
    assert math.isclose(meta_sum(metrics), 72.70 + 72.56 + 85.80 + 77.66 + 75.26)
    with pytest.raises(KeyError, match="nlvr2"):
        meta_sum({k: 0.5 for k in META_SUM_KEYS if k != "nlvr2"})
    with pytest.raises(ValueError, match="fractions"):
        meta_sum({**metrics, "vqa": 72.7})
