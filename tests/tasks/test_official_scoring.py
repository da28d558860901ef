"""vlkit's scorers against the official evaluations' rules, restated here from reading the official code.

VQA: GT-Vision-Lab/VQA ``PythonEvaluationTools/vqaEvaluation/vqaEval.py`` (``2021``: commit a013f00, the
code today; ``2016``: commit 458a8b2, before it). Retrieval: UNITER ``utils/itm_eval.py`` and METER / ViLT
``compute_irtr_recall``. RefExp: ViLBERT ``refer_expression_dataset.iou`` + ``task_utils`` (V-logit) and
UNITER ``data/re.py computeIoU`` + ``train_re.validate``. NLVR2: lil-lab/nlvr ``nlvr2/eval/metrics.py``.
The restatements below are written independently of vlkit's code (only the word tables are shared,
and those are checked entry by entry against the official ones in `test_vqa_tables`).
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vlkit.tasks import metrics as M
from vlkit.tasks.metrics import (
    mean_by,
    nlvr2_consistency,
    official_points,
    process_digit_article,
    process_punctuation,
    recall_at_k,
    refexp_accuracy,
    refexp_iou,
    vqa_accuracy,
)

# -- an independent restatement of vqaEval.py --------------------------------------------------------
OFFICIAL_PUNCT = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",",
                  "?", "!"]


def ref_punctuation(text):
    digit_comma_digit = any(text[i] == "," and text[i - 1].isdecimal() and text[i + 1].isdecimal()
                            for i in range(1, len(text) - 1))
    out = text
    for mark in OFFICIAL_PUNCT:
        touches_space = (mark + " ") in text or (" " + mark) in text
        out = out.replace(mark, "" if touches_space or digit_comma_digit else " ")
    kept, removed = [], 0  # periodStrip: '.' not followed by a digit, at most re.UNICODE = 32 of them
    for i, ch in enumerate(out):
        if ch == "." and removed < 32 and not (i + 1 < len(out) and out[i + 1].isdecimal()):
            removed += 1
            continue
        kept.append(ch)
    return "".join(kept)


def ref_digit_article(text):
    words = []
    for word in text.lower().split():
        word = M._NUMBERS.get(word, word)
        if word not in ("a", "an", "the"):
            words.append(word)
    return " ".join(M._CONTRACTIONS.get(w, w) for w in words)


def ref_question(pred, humans, rules="2021"):
    """One question as ``VQAEval.evaluate`` scores it, with the annotation's answer dicts."""
    gts = [{"answer": a, "answer_id": j + 1} for j, a in enumerate(humans)]
    if rules == "2021":
        for d in gts:
            d["answer"] = d["answer"].replace("\n", " ").replace("\t", " ").strip()
        res = pred.replace("\n", " ").replace("\t", " ").strip()
        if len({d["answer"] for d in gts}) > 1:
            for d in gts:
                d["answer"] = ref_digit_article(ref_punctuation(d["answer"]))
            res = ref_digit_article(ref_punctuation(res))
    else:
        res = ref_digit_article(ref_punctuation(pred.replace("\n", " ").replace("\t", " ").strip()))
        if len({d["answer"] for d in gts}) > 1:
            for d in gts:
                d["answer"] = ref_punctuation(d["answer"])
    accs = []
    for datum in gts:
        others = [d for d in gts if d != datum]
        accs.append(min(1, float(len([d for d in others if d["answer"] == res])) / 3))
    return float(sum(accs)) / len(accs)


def ref_evaluate(questions, rules="2021"):
    """``VQAEval.evaluate`` + ``setAccuracy`` over ``(pred, humans, question_type, answer_type)``
    (unrounded): both a013f00 and 458a8b2 append the question's ``avgGTAcc`` to accQA, accQuesType
    and accAnsType alike. (The 2015 drafts 07aecec..ffa9050 appended the loop's last ``acc`` to the
    two type lists; f8b1ce3 "bug removed" fixed it.)"""
    acc_qa, acc_ques_type, acc_ans_type = [], {}, {}
    for pred, humans, ques_type, ans_type in questions:
        avg = ref_question(pred, humans, rules)
        acc_qa.append(avg)
        acc_ques_type.setdefault(ques_type, []).append(avg)
        acc_ans_type.setdefault(ans_type, []).append(avg)
    mean_of = lambda accs: float(sum(accs)) / len(accs)  # noqa: E731
    return (mean_of(acc_qa), {k: mean_of(v) for k, v in acc_ques_type.items()},
            {k: mean_of(v) for k, v in acc_ans_type.items()})


# -- the tables ---------------------------------------------------------------------------------------
def test_vqa_tables():
    assert M._PUNCT == OFFICIAL_PUNCT  # no ':' nor "'" (the Beta v0.9 list had them), no '.'
    assert M._NUMBERS == {w: str(n) for n, w in enumerate(
        ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"])} | {"none": "0"}
    assert M._ARTICLES == {"a", "an", "the"}
    assert len(M._CONTRACTIONS) == 120
    for key, value in [("dont", "don't"), ("somebody'd", "somebodyd"), ("ow's'at", "'ow's'at"), ("Im", "I'm"),
                       ("let's", "let's"), ("yall'd've", "y'all'd've"), ("twas", "'twas")]:
        assert M._CONTRACTIONS[key] == value


# -- one test per rule of vqaEval.py --------------------------------------------------------------
def test_punctuation_mark_touching_a_space_is_deleted_else_splits():
    assert process_punctuation("black/white") == "black white"
    assert process_punctuation("black / white") == "black  white"  # deleted, both spaces kept
    assert process_punctuation("a-b c- d") == "ab c d"  # one "- " anywhere deletes every '-'
    assert process_punctuation("(yes)") == " yes "


def test_digit_comma_digit_anywhere_deletes_every_mark():
    assert process_punctuation("1,000") == "1000"
    assert process_punctuation("1,000 cats/dogs") == "1000 catsdogs"
    assert process_punctuation("cats,dogs") == "cats dogs"


def test_period_strip():
    assert process_punctuation("yes.") == "yes"
    assert process_punctuation("3.5") == "3.5"  # before a digit: kept
    assert process_punctuation("a.b") == "ab"  # deleted, not a space
    assert process_punctuation("." * 33) == "."  # re.UNICODE passed as count: 32 deletions at most
    assert process_punctuation("it's: ok") == "it's: ok"  # apostrophe and colon are not in the list


def test_digit_article():
    assert process_digit_article("The Two Dogs") == "2 dogs"
    assert process_digit_article("none") == "0"
    assert process_digit_article("eleven") == "eleven"  # only zero to ten
    assert process_digit_article("dont  know") == "don't know"
    assert process_digit_article("Im") == "im"  # the upper-case keys never match after lower()
    assert process_digit_article("a an the") == ""


@pytest.mark.parametrize("matching, expected", [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (10, 1.0)])
def test_ten_choose_nine_average(matching, expected):
    humans = ["2"] * matching + ["3"] * (10 - matching)
    assert math.isclose(vqa_accuracy(["2"], [humans])[0], expected)


def test_2021_unanimous_humans_are_compared_exactly_after_stripping():
    unanimous = ["yes"] * 10
    assert vqa_accuracy(["yes", " yes\n", "Yes", "yes.", "the yes"], [unanimous] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert vqa_accuracy(["2", "two"], [[" 2 "] * 10] * 2) == [1.0, 0.0]  # humans are stripped too


def test_2021_disagreeing_humans_normalise_both_sides():
    humans = ["Two"] * 3 + ["three."] * 7
    assert vqa_accuracy(["2", "the two", "3", "Three"], [humans] * 4) == pytest.approx([0.9, 0.9, 1.0, 1.0])


def test_2016_prediction_always_normalised_humans_only_punctuation():
    unanimous = ["2"] * 10
    assert vqa_accuracy(["two", "2."], [unanimous] * 2, rules="2016") == [1.0, 1.0]
    assert vqa_accuracy(["the cat"], [["the cat"] * 10], rules="2016") == [0.0]  # "cat" never equals "the cat"
    humans = ["Two"] * 3 + ["3"] * 7
    assert vqa_accuracy(["Two", "3."], [humans] * 2, rules="2016") == pytest.approx([0.0, 1.0])
    # a human "red!" becomes "red " (the mark turns into a space, never stripped): nothing matches it
    assert vqa_accuracy(["red"], [["red!"] * 7 + ["blue"] * 3], rules="2016") == [0.0]
    assert vqa_accuracy(["red"], [["red!"] * 7 + ["blue"] * 3]) == [1.0]
    with pytest.raises(ValueError, match="rules"):
        vqa_accuracy(["a"], [["a"]], rules="2017")


def test_types_average_the_ten_choose_nine_mean_not_the_last_subset():
    # 3 of 10 humans say "2", the 10th among them: the question scores (7 * 1 + 3 * 2/3) / 10 = 0.9; the
    # subset without the 10th human alone would give 2/3 (the 2015 drafts' per-type value)
    humans = ["3"] * 7 + ["2"] * 3
    accuracy = vqa_accuracy(["2", "2"], [humans, ["3"] * 10])
    assert accuracy == pytest.approx([0.9, 0.0])
    assert mean_by(accuracy, ["number", "number"]) == pytest.approx({"number": 0.45})  # not (2/3 + 0) / 2
    by_question_type = mean_by(accuracy, ["how many", "what number is"])
    assert by_question_type == pytest.approx({"how many": 0.9, "what number is": 0.0})


def test_types_are_means_of_unrounded_scores_rounded_only_for_display():
    scores = [1 / 3, 1.0, 0.0]
    assert mean_by(scores, ["number", "yes/no", "number"]) == {"number": 1 / 6, "yes/no": 1.0}
    assert official_points(1 / 6) == 16.67


# -- property test: vlkit equals the restatement on every input -----------------------------------
_WORDS = ["yes", "Yes", "no", "two", "2", "none", "0", "the", "a", "an", "dont", "don't", "1,000", "3.5", "red",
          "red.", "cat", "Cat", "Im", "ten"]
_pieces = st.one_of(st.sampled_from(_WORDS), st.text(alphabet="aA2 .,;/-!?()'\"\t\n:_", max_size=4))
_answer = st.lists(_pieces, min_size=0, max_size=4).map(" ".join)


@st.composite
def _question(draw):
    pool = draw(st.lists(_answer, min_size=1, max_size=3))
    n = draw(st.integers(1, 10))
    if draw(st.booleans()):
        humans = [pool[0]] * n  # unanimous
    else:
        humans = [draw(st.sampled_from(pool)) for _ in range(n)]
    pred = draw(st.one_of(st.sampled_from(pool), _answer))
    return pred, humans, draw(st.sampled_from(M.VQA_RULES))


@settings(max_examples=2000, deadline=None)
@given(_question())
def test_vqa_accuracy_equals_the_official_rules(case):
    pred, humans, rules = case
    assert vqa_accuracy([pred], [humans], rules) == [ref_question(pred, humans, rules)]


_TYPES = st.sampled_from(["yes/no", "number", "other"])
_QTYPES = st.sampled_from(["how many", "what color is the", "is the"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_question(), _QTYPES, _TYPES), min_size=1, max_size=6), st.sampled_from(M.VQA_RULES))
def test_overall_and_per_type_accuracies_equal_the_official_rules(questions, rules):
    """Overall, per-question-type and per-answer-type accuracy as `VQATask.evaluate` computes them."""
    preds, humans = [q[0] for q, _, _ in questions], [q[1] for q, _, _ in questions]
    accuracy = vqa_accuracy(preds, humans, rules)
    overall, per_ques_type, per_ans_type = ref_evaluate(
        [(q[0], q[1], ques_type, ans_type) for q, ques_type, ans_type in questions], rules)
    assert math.isclose(sum(accuracy) / len(accuracy), overall, abs_tol=1e-12)
    for got, expected in ((mean_by(accuracy, [t for _, t, _ in questions]), per_ques_type),
                          (mean_by(accuracy, [t for _, _, t in questions]), per_ans_type)):
        assert got.keys() == expected.keys()
        assert all(math.isclose(got[k], expected[k], abs_tol=1e-12) for k in got)


# -- retrieval -------------------------------------------------------------------------------------
def ref_recall_topk(scores, txt2img, k):
    """METER / ViLT ``compute_irtr_recall`` (scores [N_img, N_txt], image ids = indices)."""
    tiids = torch.tensor(txt2img)
    iids = torch.arange(scores.shape[0])
    tr = (iids.unsqueeze(1) == tiids[scores.topk(k, dim=1).indices]).float().max(dim=1)[0].mean()
    ir = (tiids.unsqueeze(0) == iids[scores.topk(k, dim=0).indices]).float().max(dim=0)[0].mean()
    return ir.item(), tr.item()


def test_recall_counts_as_meter_and_uniter_without_ties():
    g = torch.Generator().manual_seed(3)
    txt2img = torch.cat([torch.arange(20), torch.randint(20, (60,), generator=g)]).tolist()
    scores = torch.randn(20, 80, generator=g, dtype=torch.float64)
    for ties in M.RETRIEVAL_TIES:
        got = recall_at_k(scores, txt2img, ties=ties)
        for k in (1, 5, 10):
            ir, tr = ref_recall_topk(scores, txt2img, k)
            assert math.isclose(got[f"ir_r{k}"], ir, abs_tol=1e-6) and math.isclose(got[f"tr_r{k}"], tr, abs_tol=1e-6)


def ref_uniter_ir(scores_txt_img, txt2img):
    """UNITER ``itm_eval``'s image retrieval, as written (score matrix [N_txt, N_img])."""
    _, rank_txt = scores_txt_img.topk(10, dim=1)
    gt = torch.tensor(txt2img).unsqueeze(1).expand_as(rank_txt)
    rank = (rank_txt == gt).nonzero()
    return {k: (rank < k).sum().item() / len(txt2img) for k in (1, 5, 10)}


def test_uniter_ir_rows_reproduce_itm_eval():
    g = torch.Generator().manual_seed(0)
    txt2img = (torch.arange(100) % 20).tolist()
    scores = torch.randn(100, 20, generator=g, dtype=torch.float64)
    expected = ref_uniter_ir(scores, txt2img)
    got = recall_at_k(scores.T, txt2img, uniter_ir_rows=True)
    plain = recall_at_k(scores.T, txt2img)
    for k in (1, 5, 10):
        assert math.isclose(got[f"ir_r{k}"], expected[k], abs_tol=1e-12)
    assert expected[10] > plain["ir_r10"]  # the slip inflates IR R@10 here (0.58 vs 0.53)


def test_text_retrieval_hits_when_any_caption_is_in_the_top_k():
    scores = torch.tensor([[0.9, 0.1, 0.8, 0.0], [0.95, 0.2, 0.3, 0.7]])  # image 0: captions 0, 1; image 1: 2, 3
    out = recall_at_k(scores, [0, 0, 1, 1], ks=(1, 2))
    assert out["tr_r1"] == 0.5 and out["tr_r2"] == 1.0  # image 1: its caption 3 second, behind caption 0


def test_ties_worst_or_by_index():
    scores = torch.zeros(2, 2)
    assert recall_at_k(scores, [0, 1], ks=(1,))["ir_r1"] == 0.0
    assert recall_at_k(scores, [0, 1], ks=(1,), ties="index")["ir_r1"] == 0.5  # image 0 first: caption 0 hits


# -- RefExp ----------------------------------------------------------------------------------------
def test_vilbert_plus_one_boxes():
    a, b = torch.tensor([[0.0, 0, 9, 9]]), torch.tensor([[0.0, 0, 9, 19]])
    assert refexp_iou(a, b, "plus_one").item() == 0.5  # 10 x 10 of 10 x 20 pixels
    assert refexp_accuracy(a, b, boxes="plus_one", comparison=">") == 0.0  # ViLBERT: select_target > 0.5
    assert refexp_accuracy(a, b, boxes="plus_one", comparison=">=") == 1.0


def test_uniter_boxes_drop_an_intersection_one_pixel_wide():
    a, b = torch.tensor([[0.0, 0, 10, 10], [0.0, 0, 10, 10]]), torch.tensor([[9.0, 0, 19, 10], [8.0, 0, 18, 10]])
    torch.testing.assert_close(refexp_iou(a, b, "uniter"), torch.tensor([0.0, 20 / 180], dtype=torch.float64))
    torch.testing.assert_close(refexp_iou(a, b, "continuous"), torch.tensor([10 / 190, 20 / 180], dtype=torch.float64))
    half = torch.tensor([[0.0, 0, 10, 20]])
    assert refexp_accuracy(a[:1], half, boxes="uniter", comparison=">") == 0.0  # train_re: computeIoU > .5


def test_official_defaults_per_family():
    """Each family's RefExp rule is in its recipe (METER has no official RefExp evaluation: the default)."""
    from vlkit.models.recipe import recipe_of

    assert {f: recipe_of(f).refexp for f in ("vilbert", "uniter", "meter")} == {
        "vilbert": ("plus_one", ">"), "uniter": ("uniter", ">"), "meter": None}
    assert M.REFEXP_DEFAULT == ("continuous", ">=")


# -- NLVR2 -----------------------------------------------------------------------------------------
def test_nlvr2_consistency_groups_a_sentence_over_its_pairs():
    ids = ["dev-1-0-0", "dev-1-1-0", "dev-1-0-1", "dev-2-0-0", "dev-2-3-0"]
    correct = [True, True, True, True, False]
    # sentences dev-1--0 (both right), dev-1--1 (right), dev-2--0 (one wrong)
    assert nlvr2_consistency(ids, correct) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="identifier"):
        nlvr2_consistency(["dev1"], [True])
