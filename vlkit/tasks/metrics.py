"""Downstream metrics as the official evaluations compute them: VQA accuracy (GT-Vision-Lab/VQA
``vqaEval.py``), retrieval recall (UNITER ``itm_eval``, METER / ViLT ``compute_irtr_recall``), RefExp
accuracy (ViLBERT's and UNITER's IoU rules), NLVR2 consistency (lil-lab/nlvr ``metrics.py``), and
UNITER's Meta-Sum. docs/evaluation.md states every rule.

Metrics are unrounded fractions in [0, 1]; ``meta_sum`` gives UNITER's points (x100) and
``official_points`` the VQA scorer's rounded display.
"""
from __future__ import annotations

import functools
import re
from typing import Hashable, Mapping, Sequence

import torch
from torch import Tensor

from vlkit.objectives.base import accuracy

__all__ = [
    "IOU_BOXES", "IOU_COMPARISONS", "META_SUM_KEYS", "RETRIEVAL_TIES", "VQA_RULES",
    "accuracy", "mean_by", "meta_sum", "nlvr2_consistency", "nlvr2_sentence", "normalize_answer",
    "official_points", "paired_box_iou", "process_digit_article", "process_punctuation", "recall", "recall_at_k",
    "refexp_accuracy", "refexp_hits", "refexp_iou", "vqa_accuracy", "vqa_question_accuracy",
    "vqa_score_from_soft_targets",
]

# Tables and rules of the official VQA evaluation (GT-Vision-Lab/VQA, vqaEval.py).
_CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's",
    "howd": "how'd", "howll": "how'll", "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm",
    "Ive": "I've", "isnt": "isn't", "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll",
    "let's": "let's", "maam": "ma'am", "mightnt": "mightn't", "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've", "mightve": "might've", "mustnt": "mustn't", "mustve": "must've",
    "neednt": "needn't", "notve": "not've", "oclock": "o'clock", "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at", "shant": "shan't",
    "shed've": "she'd've", "she'dve": "she'd've", "she's": "she's", "shouldve": "should've",
    "shouldnt": "shouldn't", "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd", "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll", "somebodys": "somebody's", "someoned": "someone'd",
    "someoned've": "someone'd've", "someone'dve": "someone'd've", "someonell": "someone'll",
    "someones": "someone's", "somethingd": "something'd", "somethingd've": "something'd've",
    "something'dve": "something'd've", "somethingll": "something'll", "thats": "that's",
    "thered": "there'd", "thered've": "there'd've", "there'dve": "there'd've", "therere": "there're",
    "theres": "there's", "theyd": "they'd", "theyd've": "they'd've", "they'dve": "they'd've",
    "theyll": "they'll", "theyre": "they're", "theyve": "they've", "twas": "'twas", "wasnt": "wasn't",
    "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've", "werent": "weren't", "whatll": "what'll",
    "whatre": "what're", "whats": "what's", "whatve": "what've", "whens": "when's", "whered": "where'd",
    "wheres": "where's", "whereve": "where've", "whod": "who'd", "whod've": "who'd've",
    "who'dve": "who'd've", "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll",
    "whyre": "why're", "whys": "why's", "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll",
    "y'allll": "y'all'll", "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've",
    "youd": "you'd", "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll", "youre": "you're",
    "youve": "you've",
}
_NUMBERS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
            "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
_ARTICLES = frozenset({"a", "an", "the"})
_PUNCT = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")  # sic: "(?!<=" is a lookahead, so every '.' not before a digit
_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")
_PERIOD_STRIP_COUNT = re.UNICODE  # sic: the official code passes re.UNICODE (32) as sub()'s count

# The official scorer's rules by version: ``2021`` is GT-Vision-Lab/VQA as it stands (commit a013f00,
# "Fixed processing answers bug"); ``2016`` the version before it (commit 458a8b2), which the
# leaderboard-era papers were scored with.
VQA_RULES = ("2021", "2016")


def _strip(text: str) -> str:
    return text.replace("\n", " ").replace("\t", " ").strip()


def process_punctuation(text: str) -> str:
    """The official ``processPunctuation``: each mark of the list is deleted when it touches a space
    (or when the text holds a digit-comma-digit anywhere), else replaced by a space; then every '.'
    not followed by a digit is deleted (at most 32 of them). Case and spaces are kept."""
    out = text
    for p in _PUNCT:
        if (p + " " in text or " " + p in text) or _COMMA_STRIP.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD_STRIP.sub("", out, _PERIOD_STRIP_COUNT)


def process_digit_article(text: str) -> str:
    """The official ``processDigitArticle``: lower case, split on white space, number words zero to ten
    as digits (``none`` too: ``"0"``), articles dropped, contractions restored, joined by one space."""
    words = (_NUMBERS.get(w, w) for w in text.lower().split())
    return " ".join(_CONTRACTIONS.get(w, w) for w in words if w not in _ARTICLES)


@functools.lru_cache(maxsize=1 << 16)  # answers repeat: each is normalised once
def normalize_answer(answer: str) -> str:
    """Both official processing steps after stripping tabs, newlines and outer spaces
    (``"Two dogs."`` -> ``"2 dogs"``, ``"1,000"`` -> ``"1000"``): what the answer vocabulary is built
    from. Scoring applies them only as `vqa_accuracy` says."""
    return process_digit_article(process_punctuation(_strip(answer)))


def vqa_question_accuracy(predicted: str, answers: Sequence[str], rules: str = "2021") -> float:
    """One question's VQA accuracy as the official ``VQAEval.evaluate`` computes it (a fraction).

    ``answers`` are the human answers (10 in VQA v2). Each human j scores ``min(1, m_j / 3)``, m_j the
    other humans whose (processed) answer equals the (processed) prediction exactly, case included; the
    question scores their mean (the "10 choose 9" average). What is processed depends on ``rules``:

    - ``2021`` (the official code today): the prediction and the human answers lose tabs, newlines and
      outer spaces; only when the humans are not unanimous do both sides get `process_punctuation` and
      `process_digit_article`. A unanimous ``"yes"`` matches ``"yes"`` only, not ``"Yes"`` nor ``"yes."``.
    - ``2016`` (before March 2021): the prediction is always stripped and processed by both steps; the
      human answers are never stripped, and get `process_punctuation` only, only when not unanimous.
      A unanimous ``"2"`` matches ``"two"``; a unanimous ``"the cat"`` can never be matched.
    """
    if rules == "2021":
        answers, predicted = [_strip(a) for a in answers], _strip(predicted)
        if len(set(answers)) > 1:
            answers, predicted = [normalize_answer(a) for a in answers], normalize_answer(predicted)
    elif rules == "2016":
        predicted = normalize_answer(predicted)
        if len(set(answers)) > 1:
            answers = [process_punctuation(a) for a in answers]
    else:
        raise ValueError(f"unknown VQA rules {rules!r}; choose one of {', '.join(VQA_RULES)}")
    hits = [a == predicted for a in answers]
    matches = sum(hits)
    return sum(min(1.0, (matches - h) / 3) for h in hits) / len(hits)


def vqa_accuracy(predicted: Sequence[str], gt_answers: Sequence[Sequence[str]], rules: str = "2021") -> list[float]:
    """Per-question VQA accuracy (fractions, unrounded) of ``predicted[i]`` against the human answers
    ``gt_answers[i]``: `vqa_question_accuracy` under ``rules`` (default: the official code today)."""
    if len(predicted) != len(gt_answers):
        raise ValueError(f"vqa_accuracy: {len(predicted)} predictions for {len(gt_answers)} questions")
    if rules not in VQA_RULES:
        raise ValueError(f"unknown VQA rules {rules!r}; choose one of {', '.join(VQA_RULES)}")
    empty = next((i for i, answers in enumerate(gt_answers) if not answers), None)
    if empty is not None:
        raise ValueError(f"vqa_accuracy: question {empty} has no ground-truth answers")
    return [vqa_question_accuracy(p, a, rules) for p, a in zip(predicted, gt_answers)]


def mean_by(values: Sequence[float], keys: Sequence[Hashable]) -> dict[Hashable, float]:
    """The mean of ``values`` per key (keys in first-seen order): the official per-answer-type and
    per-question-type accuracies, from the unrounded per-question scores (`vqa_accuracy`'s 10-choose-9
    means, which ``vqaEval.py`` appends to its type lists as to the overall one)."""
    groups: dict[Hashable, list[float]] = {}
    for value, key in zip(values, keys, strict=True):
        groups.setdefault(key, []).append(value)
    return {key: sum(vs) / len(vs) for key, vs in groups.items()}


def official_points(fraction: float, digits: int = 2) -> float:
    """A fraction as the official VQA scorer displays it: ``round(100 * x, 2)`` points. vlkit rounds
    only here, for display; metrics files keep the unrounded fraction."""
    return round(100 * fraction, digits)


def vqa_score_from_soft_targets(logits: Tensor, soft_targets: Tensor) -> Tensor:
    """Training-time VQA score [B]: the soft target (``min(1, n/3)``) of each arg-max answer."""
    if logits.shape != soft_targets.shape:
        raise ValueError(f"vqa_score_from_soft_targets: logits {tuple(logits.shape)} and soft targets "
                         f"{tuple(soft_targets.shape)} differ")
    return soft_targets.gather(-1, logits.argmax(-1, keepdim=True)).squeeze(-1)


RETRIEVAL_TIES = ("worst", "index")


def recall_at_k(scores: Tensor, txt2img: Sequence[int] | Tensor, ks: Sequence[int] = (1, 5, 10),
                ties: str = "worst", uniter_ir_rows: bool = False) -> dict[str, float]:
    """Image and text retrieval recall from a score matrix [N_img, N_txt] (higher = better match), as
    UNITER's ``itm_eval`` and METER's / ViLT's ``compute_irtr_recall`` count it.

    ``txt2img[t]`` is the image index of caption t. IR R@k: the share of captions whose image is among
    the k best-scoring images; TR R@k: the share of images with any of their captions among the k
    best-scoring captions. Both official codes take the k best with ``torch.topk``, whose order among
    equal scores is unspecified; ``ties`` fixes it: ``worst`` (default) ranks a wrong candidate scoring
    the same as the ground truth above it, so results never depend on candidate order; ``index`` ranks
    equal scores by candidate index (lower first). They differ only on exact ties. Returns ``ir_r{k}``,
    ``tr_r{k}`` and their mean ``r_mean`` (UNITER's: the mean of the IR and TR means) as fractions.

    ``uniter_ir_rows`` reproduces a slip of UNITER's ``itm_eval``: it counts IR hits as ``(rank < k).sum()``
    over the ``nonzero()`` (caption, position) pairs of the top-10 hits, so each of the first k captions
    whose image is in its top 10 counts once more (IR R@k up by at most k / N_txt).
    """
    if ties not in RETRIEVAL_TIES:
        raise ValueError(f"recall_at_k: unknown ties={ties!r}; choose one of {', '.join(RETRIEVAL_TIES)}")
    scores = torch.as_tensor(scores)
    if scores.dim() != 2:
        raise ValueError(f"recall_at_k: scores must be [N_img, N_txt], got {tuple(scores.shape)}")
    n_img, n_txt = scores.shape
    txt2img = torch.as_tensor(txt2img, dtype=torch.long, device=scores.device)
    if txt2img.shape != (n_txt,):
        raise ValueError(f"recall_at_k: txt2img has shape {tuple(txt2img.shape)}, expected ({n_txt},)")
    if n_txt and (txt2img.min() < 0 or txt2img.max() >= n_img):
        bad = int(((txt2img < 0) | (txt2img >= n_img)).nonzero()[0])
        raise ValueError(f"recall_at_k: caption {bad} points to image {int(txt2img[bad])} of {n_img}")
    if torch.isnan(scores).any():
        raise ValueError("recall_at_k: scores contain NaN")
    captions = torch.arange(n_txt, device=scores.device)
    is_gt = torch.zeros(n_img, n_txt, dtype=torch.bool, device=scores.device)
    is_gt[txt2img, captions] = True
    lonely = (~is_gt.any(1)).nonzero()
    if len(lonely):
        raise ValueError(f"recall_at_k: image {int(lonely[0])} has no caption")
    if ties == "worst":
        gt_score = scores[txt2img, captions]
        ir_rank = (scores >= gt_score).sum(0) - 1  # images other than the ground truth scoring >= it
        best_gt = scores.masked_fill(~is_gt, float("-inf")).amax(1, keepdim=True)
        tr_rank = ((scores >= best_gt) & ~is_gt).sum(1)
    else:
        ir_rank = _positions(scores, 0).gather(0, txt2img[None]).squeeze(0)  # position of each caption's image
        tr_rank = _positions(scores, 1).masked_fill(~is_gt, n_txt).amin(1)  # best position of an image's captions
    out = {f"ir_r{k}": (ir_rank < k).double().mean().item() for k in ks}
    if uniter_ir_rows:
        out = {f"ir_r{k}": v + (ir_rank[:k] < 10).sum().item() / n_txt for k, v in zip(ks, out.values())}
    out.update({f"tr_r{k}": (tr_rank < k).double().mean().item() for k in ks})
    out["r_mean"] = sum(out.values()) / len(out)
    return out


def _positions(scores: Tensor, dim: int) -> Tensor:
    """The 0-based position of every entry when sorted by descending score along ``dim``, equal scores
    by index."""
    order = scores.argsort(dim=dim, descending=True, stable=True)
    positions = torch.empty_like(order)
    ranks = torch.arange(scores.shape[dim], device=scores.device)
    positions.scatter_(dim, order, ranks[:, None].expand_as(order) if dim == 0 else ranks[None, :].expand_as(order))
    return positions


def _check_xyxy(who: str, boxes1: Tensor, boxes2: Tensor) -> None:
    if boxes1.shape != boxes2.shape or boxes1.dim() != 2 or boxes1.shape[-1] != 4:
        raise ValueError(f"{who}: need two [N, 4] xyxy tensors, got {tuple(boxes1.shape)} and {tuple(boxes2.shape)}")
    for name, boxes in (("boxes1", boxes1), ("boxes2", boxes2)):
        bad = ((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])).nonzero()
        if len(bad):
            raise ValueError(f"{who}: {name}[{int(bad[0])}] = {boxes[int(bad[0])].tolist()} is not xyxy")


def paired_box_iou(boxes1: Tensor, boxes2: Tensor, chunk: int = 1024) -> Tensor:
    """IoU [N] of ``boxes1[i]`` with ``boxes2[i]`` (xyxy), via ``torchvision.ops.box_iou`` in chunks.

    Two zero-area boxes have IoU 0; boxes with x2 < x1 or y2 < y1 are an error.
    """
    from torchvision.ops import box_iou

    _check_xyxy("paired_box_iou", boxes1, boxes2)
    boxes1, boxes2 = boxes1.float(), boxes2.float()
    iou = torch.cat([box_iou(boxes1[s:s + chunk], boxes2[s:s + chunk]).diagonal()
                     for s in range(0, len(boxes1), chunk)]) if len(boxes1) else boxes1.new_zeros(0)
    return iou.nan_to_num(0.0)


# RefExp hit rules: (box convention, comparison with the threshold); each family's official one is in its recipe
# (`vlkit.models.recipe.Recipe.refexp`). ``plus_one`` (ViLBERT, vilbert-multi-task refer_expression_dataset.iou):
# xyxy boxes with +1 pixel in widths, heights and the intersection. ``uniter`` (UNITER, data/re.py computeIoU):
# xywh boxes, the intersection counted only when both its sides exceed one pixel, areas w x h. ``continuous``:
# plain areas (torchvision ``box_iou``).
IOU_BOXES = ("continuous", "plus_one", "uniter")
IOU_COMPARISONS = (">=", ">")
REFEXP_DEFAULT = ("continuous", ">=")  # a family without an official RefExp evaluation


def refexp_iou(boxes1: Tensor, boxes2: Tensor, boxes: str = "continuous") -> Tensor:
    """IoU [N] (float64) of ``boxes1[i]`` with ``boxes2[i]`` (xyxy pixels) under a box convention of
    `IOU_BOXES`: ``continuous`` (`paired_box_iou`), ``plus_one`` (ViLBERT's: a box spans x2 - x1 + 1
    pixels) or ``uniter`` (UNITER's ``computeIoU`` on x, y, w = x2 - x1, h = y2 - y1)."""
    if boxes not in IOU_BOXES:
        raise ValueError(f"refexp_iou: unknown boxes={boxes!r}; choose one of {', '.join(IOU_BOXES)}")
    if boxes == "continuous":
        return paired_box_iou(boxes1, boxes2).double()
    _check_xyxy("refexp_iou", boxes1, boxes2)
    a, b = boxes1.double(), boxes2.double()
    lo, hi = torch.maximum(a[:, :2], b[:, :2]), torch.minimum(a[:, 2:], b[:, 2:])
    if boxes == "plus_one":
        side = (hi - lo + 1).clamp(min=0)
        area_a, area_b = (a[:, 2:] - a[:, :2] + 1).prod(1), (b[:, 2:] - b[:, :2] + 1).prod(1)
    else:
        side = torch.where(hi - lo > 1, hi - lo, torch.zeros_like(lo))  # computeIoU: x1 < x2 - 1 of the overlap
        side = torch.where((side > 0).all(1, keepdim=True), side, torch.zeros_like(side))
        area_a, area_b = (a[:, 2:] - a[:, :2]).prod(1), (b[:, 2:] - b[:, :2]).prod(1)
    inter = side.prod(1)
    return (inter / (area_a + area_b - inter)).nan_to_num(0.0)


def refexp_hits(iou: Tensor, iou_threshold: float = 0.5, comparison: str = ">=") -> Tensor:
    """Bool [N]: IoU ``>=`` or ``>`` (``comparison``) the threshold."""
    if comparison not in IOU_COMPARISONS:
        raise ValueError(f"refexp: unknown comparison {comparison!r}; choose one of {', '.join(IOU_COMPARISONS)}")
    return iou >= iou_threshold if comparison == ">=" else iou > iou_threshold


def refexp_accuracy(pred_boxes: Tensor, gt_boxes: Tensor, iou_threshold: float = 0.5, boxes: str = "continuous",
                    comparison: str = ">=") -> float:
    """Referring-expression accuracy: the share of predicted boxes whose IoU with the target (under the
    box convention ``boxes``) compares ``comparison`` to ``iou_threshold``. The official evaluations:
    the families' recipes (ViLBERT ``plus_one`` and ``>``, UNITER ``uniter`` and ``>``)."""
    if len(pred_boxes) == 0:
        raise ValueError("refexp_accuracy: no boxes")
    return refexp_hits(refexp_iou(pred_boxes, gt_boxes, boxes), iou_threshold, comparison).double().mean().item()


def recall(i2t: Tensor, t2i: Tensor, txt2img: Sequence[int] | Tensor, ties: str = "worst",
           uniter_ir_rows: bool = False) -> dict[str, float]:
    """IR recall from the columns of ``t2i`` and TR recall from the rows of ``i2t`` (both [N_img, N_txt];
    the same matrix when every pair is scored), with their mean ``r_mean``; ``ties`` and
    ``uniter_ir_rows`` as in `recall_at_k`."""
    if i2t is t2i:
        return recall_at_k(i2t, txt2img, ties=ties, uniter_ir_rows=uniter_ir_rows)
    ir = recall_at_k(t2i, txt2img, ties=ties, uniter_ir_rows=uniter_ir_rows)
    tr = recall_at_k(i2t, txt2img, ties=ties)
    out = {**{k: v for k, v in ir.items() if k.startswith("ir_")},
           **{k: v for k, v in tr.items() if k.startswith("tr_")}}
    out["r_mean"] = sum(out.values()) / len(out)
    return out


def nlvr2_sentence(identifier: str) -> str:
    """The sentence an NLVR2 example belongs to, as the official ``metrics.py`` groups them: the
    identifier ``split-set-pair-sentence`` with its pair field blanked (``dev-850-0-0`` -> ``dev-850--0``)."""
    parts = str(identifier).split("-")
    if len(parts) < 3:
        raise ValueError(f"nlvr2: identifier {identifier!r} is not of the form split-set-pair-sentence")
    parts[2] = ""
    return "-".join(parts)


def nlvr2_consistency(identifiers: Sequence[str], correct: Sequence[bool]) -> float:
    """The official NLVR2 consistency: the share of sentences (`nlvr2_sentence`) all of whose examples
    (the sentence with each of its image pairs) are predicted right."""
    consistent: dict[str, bool] = {}
    for identifier, ok in zip(identifiers, correct, strict=True):
        key = nlvr2_sentence(identifier)
        consistent[key] = consistent.get(key, True) and bool(ok)
    if not consistent:
        raise ValueError("nlvr2_consistency: no examples")
    return sum(consistent.values()) / len(consistent)


META_SUM_KEYS = ("vqa", "ir_r1", "tr_r1", "nlvr2", "refcoco_plus")


def meta_sum(metrics: Mapping[str, float]) -> float:
    """UNITER Table 2's Meta-Sum in points: 100 x (VQA + IR R@1 + TR R@1 + NLVR2 + RefCOCO+).

    Reads the keys ``META_SUM_KEYS`` (fractions in [0, 1], as this module returns them); other keys
    are ignored, a missing key or a value outside [0, 1] (e.g. already in percent) is an error.
    """
    missing = [k for k in META_SUM_KEYS if k not in metrics]
    if missing:
        raise KeyError(f"meta_sum: missing {', '.join(missing)} (needs {', '.join(META_SUM_KEYS)})")
    values = {k: float(metrics[k]) for k in META_SUM_KEYS}
    bad = {k: v for k, v in values.items() if not 0.0 <= v <= 1.0}
    if bad:
        raise ValueError(f"meta_sum: values must be fractions in [0, 1], got {bad}")
    return 100.0 * sum(values.values())
