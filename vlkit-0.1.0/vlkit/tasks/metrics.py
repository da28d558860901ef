"""Exact downstream metrics: VQA accuracy (official evaluation), retrieval recall, RefExp, Meta-Sum.

Aggregate metrics are fractions in [0, 1]; ``meta_sum`` turns them into UNITER's points (x100).
"""
from __future__ import annotations

import functools
import re
from typing import Mapping, Sequence

import torch
from torch import Tensor

__all__ = [
    "META_SUM_KEYS", "accuracy", "meta_sum", "normalize_answer", "paired_box_iou", "recall_at_k",
    "refexp_accuracy", "vqa_accuracy", "vqa_score_from_soft_targets",
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
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")  # sic: a lookahead, so every '.' not before a digit
_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")
_PERIOD_STRIP_COUNT = re.UNICODE  # sic: the official code passes re.UNICODE (32) as sub()'s count


def _clean(text: str) -> str:
    return text.replace("\n", " ").replace("\t", " ").strip()


def _process_punctuation(text: str) -> str:
    out = text
    for p in _PUNCT:
        # A mark touching a space, or any digit-comma-digit in the answer, is deleted; else it splits words.
        if (p + " " in text or " " + p in text) or _COMMA_STRIP.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD_STRIP.sub("", out, _PERIOD_STRIP_COUNT)


def _process_digit_article(text: str) -> str:
    words = (_NUMBERS.get(w, w) for w in text.lower().split())
    return " ".join(_CONTRACTIONS.get(w, w) for w in words if w not in _ARTICLES)


@functools.lru_cache(maxsize=1 << 16)  # answers repeat: each is normalised once
def normalize_answer(answer: str) -> str:
    """The official VQA answer normalisation: punctuation, periods, lower case, number words -> digits,
    articles dropped, contractions restored (``"Two dogs."`` -> ``"2 dogs"``, ``"1,000"`` -> ``"1000"``)."""
    return _process_digit_article(_process_punctuation(_clean(answer)))


def vqa_accuracy(predicted: Sequence[str], gt_answers: Sequence[Sequence[str]]) -> list[float]:
    """Per-question VQA accuracy, exactly as the official evaluation computes it.

    For each human answer j: ``min(1, #other humans matching / 3)``, averaged over the humans (the
    "10 choose 9" subsets). As in the official code, answers are normalised only when the humans
    disagree (a unanimous ``"2"`` does not match ``"two"``) and compared case-insensitively.
    """
    if len(predicted) != len(gt_answers):
        raise ValueError(f"vqa_accuracy: {len(predicted)} predictions for {len(gt_answers)} questions")
    scores = []
    for i, (pred, answers) in enumerate(zip(predicted, gt_answers)):
        if not answers:
            raise ValueError(f"vqa_accuracy: question {i} has no ground-truth answers")
        answers, pred = [_clean(a) for a in answers], _clean(pred)
        if len(set(answers)) > 1:
            answers, pred = [normalize_answer(a) for a in answers], normalize_answer(pred)
        hits = [a.lower() == pred.lower() for a in answers]
        total = sum(hits)
        scores.append(sum(min(1.0, (total - h) / 3) for h in hits) / len(hits))
    return scores


def vqa_score_from_soft_targets(logits: Tensor, soft_targets: Tensor) -> Tensor:
    """Training-time VQA score [B]: the soft target (``min(1, n/3)``) of each arg-max answer."""
    if logits.shape != soft_targets.shape:
        raise ValueError(f"vqa_score_from_soft_targets: logits {tuple(logits.shape)} and soft targets "
                         f"{tuple(soft_targets.shape)} differ")
    return soft_targets.gather(-1, logits.argmax(-1, keepdim=True)).squeeze(-1)


def recall_at_k(scores: Tensor, txt2img: Sequence[int] | Tensor, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """Image and text retrieval recall from a score matrix [N_img, N_txt] (higher = better match).

    ``txt2img[t]`` is the image index of caption t. Image retrieval ranks all images for each caption;
    text retrieval ranks all captions for each image and hits when any of its captions is in the top
    k. Ties go against the ground truth (a wrong candidate scoring the same counts as ranked above),
    so results never depend on candidate order. Returns ``ir_r{k}``, ``tr_r{k}`` and their mean
    ``r_mean`` as fractions.
    """
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
    gt_score = scores[txt2img, captions]
    ir_rank = (scores >= gt_score).sum(0) - 1  # images other than the ground truth scoring >= it
    best_gt = scores.masked_fill(~is_gt, float("-inf")).amax(1, keepdim=True)
    tr_rank = ((scores >= best_gt) & ~is_gt).sum(1)
    out = {f"ir_r{k}": (ir_rank < k).double().mean().item() for k in ks}
    out.update({f"tr_r{k}": (tr_rank < k).double().mean().item() for k in ks})
    out["r_mean"] = sum(out.values()) / len(out)
    return out


def paired_box_iou(boxes1: Tensor, boxes2: Tensor, chunk: int = 1024) -> Tensor:
    """IoU [N] of ``boxes1[i]`` with ``boxes2[i]`` (xyxy), via ``torchvision.ops.box_iou`` in chunks.

    Two zero-area boxes have IoU 0; boxes with x2 < x1 or y2 < y1 are an error.
    """
    from torchvision.ops import box_iou

    if boxes1.shape != boxes2.shape or boxes1.dim() != 2 or boxes1.shape[-1] != 4:
        raise ValueError(f"paired_box_iou: need two [N, 4] xyxy tensors, got {tuple(boxes1.shape)} and "
                         f"{tuple(boxes2.shape)}")
    for name, boxes in (("boxes1", boxes1), ("boxes2", boxes2)):
        bad = ((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])).nonzero()
        if len(bad):
            raise ValueError(f"paired_box_iou: {name}[{int(bad[0])}] = {boxes[int(bad[0])].tolist()} is not xyxy")
    boxes1, boxes2 = boxes1.float(), boxes2.float()
    iou = torch.cat([box_iou(boxes1[s:s + chunk], boxes2[s:s + chunk]).diagonal()
                     for s in range(0, len(boxes1), chunk)]) if len(boxes1) else boxes1.new_zeros(0)
    return iou.nan_to_num(0.0)


def refexp_accuracy(pred_boxes: Tensor, gt_boxes: Tensor, iou_threshold: float = 0.5) -> float:
    """Referring-expression accuracy: share of predictions with IoU >= ``iou_threshold`` to the target."""
    if len(pred_boxes) == 0:
        raise ValueError("refexp_accuracy: no boxes")
    return (paired_box_iou(pred_boxes, gt_boxes) >= iou_threshold).double().mean().item()


def accuracy(logits_or_preds: Tensor, labels: Tensor, ignore_index: int = -100) -> Tensor:
    """Classification accuracy (0-dim tensor): arg-max of logits [..., C] or class ids [...] vs labels [...].

    Positions labelled ``ignore_index`` are skipped; NaN when none is left.
    """
    preds = logits_or_preds
    if preds.is_floating_point() and preds.dim() == labels.dim() + 1:
        preds = preds.argmax(-1)
    if preds.shape != labels.shape:
        raise ValueError(f"accuracy: predictions {tuple(preds.shape)} do not match labels {tuple(labels.shape)}")
    valid = labels != ignore_index
    return ((preds == labels) & valid).sum().float() / valid.sum()


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
