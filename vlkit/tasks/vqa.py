"""VQA: answer vocabulary by train frequency, soft scores ``min(1, n/3)``, the family's head on its
joint vector (a `vlkit.models.heads.JointClassifier`), the head's loss on the soft scores (by default
BCE-with-logits times the number of answers), and the official VQA accuracy.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Iterable

import torch
from torch import nn

from vlkit.data.formats import read_vqa
from vlkit.data.pairs import ImageTextPairs
from vlkit.registry import register_task
from vlkit.tasks.base import HeadTask, TaskData, classification_loss, mean, most_common, split_records
from vlkit.tasks.metrics import VQA_RULES, mean_by, normalize_answer, vqa_accuracy, vqa_score_from_soft_targets
from vlkit.types import LossOutput, VLBatch

VQA_V2_ANSWERS = 3129  # the official answer vocabulary of VQA v2 (the train answers seen 9 times or more)


def _target_answer(record: Mapping[str, Any]) -> str | None:
    """The normalised answer a question counts for: its ``multiple_choice_answer``, else the most
    common normalised human answer."""
    mc = record.get("multiple_choice_answer")
    if mc:
        return normalize_answer(str(mc))
    return most_common(normalize_answer(a) for a in record.get("answers") or [])


def answer_vocabulary(records: Iterable[Mapping[str, Any]], num_answers: int | None = None) -> list[str]:
    """Normalised answers of ``records`` by descending frequency (ties alphabetical), as the
    bottom-up-attention preprocessing counts them (one vote per question for its multiple-choice
    answer); the ``num_answers`` most frequent, or all of them when None."""
    if num_answers is not None and num_answers < 1:
        raise ValueError(f"num_answers must be >= 1 or None, got {num_answers}")
    counts = Counter(a for a in map(_target_answer, records) if a is not None)
    return sorted(counts, key=lambda a: (-counts[a], a))[:num_answers]


def soft_scores(answers: Sequence[str], answer2label: Mapping[str, int]) -> tuple[list[int], list[float]]:
    """(labels, scores) of one question: ``min(1, n/3)`` for each vocabulary answer given by n of
    the human ``answers`` (normalised)."""
    counts = Counter(normalize_answer(a) for a in answers)
    pairs = sorted((answer2label[a], min(1.0, n / 3)) for a, n in counts.items() if a in answer2label)
    return [label for label, _ in pairs], [score for _, score in pairs]


def dense_scores(labels: Sequence[int], scores: Sequence[float], num_answers: int) -> torch.Tensor:
    """[num_answers] soft scores: ``scores`` at ``labels``, 0 elsewhere."""
    soft = torch.zeros(num_answers)
    if labels:
        soft[torch.tensor(labels, dtype=torch.long)] = torch.tensor(scores, dtype=torch.float32)
    return soft


def _bag(question: str) -> list[str]:
    """A question's words and word pairs (lower case)."""
    words = re.findall(r"[a-z0-9]+", question.lower())
    return words + [f"{a} {b}" for a, b in zip(words, words[1:])]


def _soft_target(record: Mapping[str, Any], answer2label: Mapping[str, int]) -> tuple[list[int], list[float]] | None:
    """(labels, scores) a question-only model trains on: the soft scores of the human answers, else the target
    answer at 1; None when no answer is in the vocabulary."""
    labels, scores = soft_scores(record.get("answers") or [], answer2label)
    if labels:
        return labels, scores
    label = answer2label.get(_target_answer(record) or "")
    return None if label is None else ([label], [1.0])


def question_only_answers(train: Sequence[Mapping[str, Any]], questions: Sequence[str], answers: Sequence[str],
                          steps: int = 300, batch_size: int = 512, max_features: int = 5000) -> list[str]:
    """The question-only ("blind") baseline of VQA (Antol et al., 2015, "BoW Q"): a softmax regression from a
    question's bag of words and word pairs (the ``max_features`` most frequent in ``train``) to its answer
    in ``answers``, trained on the ``train`` records' soft scores ``min(1, n/3)`` (`soft_scores`, the targets
    the VQA heads train on; the target answer alone for a record without human answers) by soft-target
    cross-entropy (Adam, ``steps`` batches, from zero weights: deterministic); the answers it gives
    ``questions``. Its softmax estimates each answer's expected score, so it answers what the VQA accuracy
    rewards most (a count's neighbours earn annotators' partial credit), as a model trained on the
    question alone would. What it scores above the per-question-type prior is what a question gives away
    without its image."""
    answer2label = {a: k for k, a in enumerate(answers)}
    pairs = [(_bag(r["question"]), _soft_target(r, answer2label)) for r in train]
    pairs = [(bag, target) for bag, target in pairs if target is not None]
    counts = Counter(f for bag, _ in pairs for f in set(bag))
    feature = {f: k + 1 for k, f in enumerate(sorted(counts, key=lambda f: (-counts[f], f))[:max_features])}

    def encode(bags: Sequence[list[str]]) -> torch.Tensor:  # [N, longest] feature ids, 0 = padding
        ids = [[feature[f] for f in bag if f in feature] for bag in bags]
        out = torch.zeros(len(ids), max((len(x) for x in ids), default=0) or 1, dtype=torch.long)
        for row, x in zip(out, ids):
            row[:len(x)] = torch.tensor(x, dtype=torch.long)
        return out

    # from zero weights, drawing nothing from the global RNG (a fine-tuning's seed must not depend on it)
    weights = nn.EmbeddingBag.from_pretrained(torch.zeros(len(feature) + 1, len(answers)), freeze=False, mode="sum",
                                              padding_idx=0)
    bias = nn.Parameter(torch.zeros(len(answers)))
    optimizer = torch.optim.Adam([weights.weight, bias], lr=0.05)
    inputs = encode([bag for bag, _ in pairs])
    targets = torch.stack([dense_scores(*target, len(answers)) for _, target in pairs]) if pairs else None
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(0))
    for step in range(steps if pairs else 0):
        batch = order[(torch.arange(batch_size) + step * batch_size) % len(pairs)]
        loss = nn.functional.cross_entropy(weights(inputs[batch]) + bias, targets[batch])  # soft targets
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if not questions:
        return []
    with torch.no_grad():
        best = (weights(encode([_bag(q) for q in questions])) + bias).argmax(-1)
    return [answers[k] for k in best.tolist()]


def question_type_prior(train: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-question-type prior of VQA (Antol et al., 2015): each question answered with the most common
    train answer of its question type and answer type (the overall most common one for a type train lacks)."""
    by_type: dict[tuple[str, str], Counter] = {}
    for r in train:
        answer = _target_answer(r)
        if answer is not None:
            by_type.setdefault((r.get("question_type") or "", r.get("answer_type") or ""), Counter())[answer] += 1
    overall = sum(by_type.values(), Counter())

    def best(counts: Counter) -> str:
        return min(counts, key=lambda a: (-counts[a], a))

    prior = {t: best(c) for t, c in by_type.items()}
    fallback = best(overall) if overall else ""
    return [prior.get((r.get("question_type") or "", r.get("answer_type") or ""), fallback) for r in records]


def baseline_accuracies(train: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]],
                        answers: Sequence[str], rules: str) -> dict[str, float]:
    """The blind baselines of ``records`` (annotated questions), overall and per answer type, as
    `VQATask.evaluate` reports them: ``vqa_blind_baseline`` / ``vqa_blind_<answer type>``
    (`question_only_answers`) and ``vqa_prior_baseline`` / ``vqa_prior_<answer type>`` (`question_type_prior`)."""
    records = [r for r in records if r.get("answers")]
    if not records:  # test-dev / test-std: nothing to score
        return {}
    humans = [r["answers"] for r in records]
    types = [r.get("answer_type") or "" for r in records]
    out = {}
    for name, predicted in (("blind", question_only_answers(train, [r["question"] for r in records], answers)),
                            ("prior", question_type_prior(train, records))):
        accuracy = vqa_accuracy(predicted, humans, rules)
        out[f"vqa_{name}_baseline"] = mean(accuracy)
        out.update({f"vqa_{name}_{_key(kind)}": v for kind, v in sorted(mean_by(accuracy, types).items()) if kind})
    return out


class VQATargets:
    """``targets(record)`` of a VQA example: the dense soft scores [num_answers], the raw human
    answers and the answer and question types (for the official accuracies per type); a question
    without annotations (test-dev, test-std) has no answers and empty types."""

    def __init__(self, num_answers: int):
        self.num_answers = num_answers

    def __call__(self, row: Mapping[str, Any]) -> dict[str, Any]:
        return {"soft_targets": dense_scores(row["labels"], row["scores"], self.num_answers),
                "answers": list(row.get("answers") or []), "answer_type": row.get("answer_type") or "",
                "question_type": row.get("question_type") or ""}


def shapes_vqa_records(world: Any, i: int) -> list[dict]:
    """The questions of shapes image ``i`` as `vlkit.data.formats.read_vqa` records."""
    return [{"id": str(q["question_id"]), "question_id": q["question_id"], "image_id": world.image_id(i),
             "question": q["question"], "answers": [str(a["answer"]) for a in q["answers"]],
             "answer_type": q["answer_type"], "question_type": q["question_type"],
             "multiple_choice_answer": q["multiple_choice_answer"]} for q in world.vqa(i)]


def _vqa_files(spec: Mapping[str, Any]) -> list[dict]:
    if not isinstance(spec, Mapping) or not spec.get("questions"):
        raise ValueError(f"task vqa: each files.<split> entry needs questions (and annotations), got {spec!r}")
    return read_vqa(spec["questions"], spec.get("annotations"), spec.get("image_id_format", "{}"))


def _vqa_dataset(records: list[dict], answer2label: Mapping[str, int], tokenizer: Any, image_source: Any,
                 max_len: int, filter_long: bool):
    rows = []
    for r in records:
        labels, scores = soft_scores(r.get("answers") or [], answer2label)
        rows.append({**r, "labels": labels, "scores": scores})
    data = ImageTextPairs(rows, tokenizer, image_source, max_len=max_len, filter_long=filter_long,
                          text_key="question", targets=VQATargets(len(answer2label)))
    data.question_ids = [r["question_id"] for r in records]  # every question of the split, for the results file
    return data


def _key(kind: str) -> str:
    return kind.replace("/", "_").replace(" ", "_")


@register_task("vqa")
class VQATask(HeadTask):
    """VQA over an answer vocabulary (``answers``, sorted by train frequency as `build_data` gives it).

    ``num_answers`` alone builds the head without answer strings (``predict`` then gives label ids,
    ``evaluate`` needs the strings). ``majority_answer`` (default ``answers[0]``) is the baseline that
    `evaluate` reports as ``vqa_majority_baseline``. ``rules``: the official scorer's version that
    `evaluate` applies (`vlkit.tasks.metrics.VQA_RULES`; ``2021``, the official code today, by default).
    """

    name = "vqa"

    def __init__(self, model: nn.Module, answers: Sequence[str] | None = None, num_answers: int | None = None,
                 majority_answer: str | None = None, loss: str | None = None, task_id: int | None = None,
                 head: str | None = None, rules: str | int = "2021"):
        super().__init__(model, loss, task_id, head)
        rules = str(rules)  # a config gives 2016 as a number
        if rules not in VQA_RULES:
            raise ValueError(f"task vqa: unknown rules {rules!r}; choose one of {', '.join(VQA_RULES)}")
        self.rules = rules
        if answers is not None:
            answers = [str(a) for a in answers]
            if num_answers is not None and num_answers != len(answers):
                raise ValueError(f"task vqa: num_answers={num_answers} but {len(answers)} answers were given")
            num_answers = len(answers)
        if not num_answers:
            raise ValueError("task vqa: give the answer vocabulary (answers=) or its size (num_answers=)")
        self.answers, self.num_answers = answers, int(num_answers)
        self.majority_answer = majority_answer if majority_answer is not None else (answers[0] if answers else None)
        self.install_head(self.head_class(head)(model, self.num_answers))

    def forward(self, batch: VLBatch, step: int = 0, micro_step: int | None = None) -> LossOutput:
        soft = self.target(batch, "soft_targets")
        logits = self.logits(batch)
        if soft.shape != logits.shape:
            raise ValueError(f"task vqa: soft targets {tuple(soft.shape)} do not match the {self.num_answers} answers "
                             f"of the head (batch of {batch.batch_size})")
        loss = classification_loss(logits, soft, self.loss_kind)
        return LossOutput(loss, {"vqa_score": vqa_score_from_soft_targets(logits.detach(), soft).mean()})

    def predict(self, batch: VLBatch) -> dict[str, Any]:
        """``ids``, ``labels`` [B] (arg-max), ``answers`` (their strings, None without a vocabulary), ``logits``."""
        with torch.no_grad():
            logits = self.logits(batch)
        labels = logits.argmax(-1)
        answers = [self.answers[k] for k in labels.tolist()] if self.answers is not None else None
        return {"ids": batch.ids, "labels": labels, "answers": answers, "logits": logits}

    def evaluate(self, data: Any, batch_size: int = 64) -> dict[str, float]:
        """Official VQA accuracy under ``rules`` (``vqa``), per answer type (``vqa_<answer type>``, e.g.
        ``vqa_yes_no``) and per question type (``vqa_qtype_<question type>``, e.g.
        ``vqa_qtype_what_color_is_the``), each the mean of the unrounded per-question scores (the
        10-choose-9 means, as the official code averages per type too, not a single leave-one-out); the
        training soft score (``vqa_soft_score``) and the accuracy of always answering the majority
        answer (``vqa_majority_baseline``), and the question-only baselines `build_data` attached to ``data``
        (`baseline_accuracies`). All fractions."""
        if self.answers is None:
            raise ValueError("task vqa: evaluate needs the answer strings (build the task with answers=)")
        predicted, humans, answer_types, question_types, ids, soft = [], [], [], [], [], []
        for batch in self.batches(data, batch_size, "vqa eval"):
            out = self.predict(batch)
            predicted += out["answers"]
            humans += self.target(batch, "answers")
            answer_types += self.target(batch, "answer_type")
            question_types += self.target(batch, "question_type")
            ids += batch.ids or [None] * batch.batch_size
            soft.append(vqa_score_from_soft_targets(out["logits"], self.target(batch, "soft_targets")).cpu())
        missing = [i for i, h in zip(ids, humans) if not h]
        if missing:
            raise ValueError(f"task vqa: question {missing[0]!r} (and {len(missing) - 1} more) has no human answers; "
                             "an unannotated split can only be predicted (vlkit evaluate predictions=...)")
        accuracy = vqa_accuracy(predicted, humans, self.rules)
        out = {"vqa": mean(accuracy), "vqa_soft_score": float(torch.cat(soft).mean())}
        if self.majority_answer is not None:
            out["vqa_majority_baseline"] = mean(vqa_accuracy([self.majority_answer] * len(humans), humans, self.rules))
        out.update(getattr(data, "baselines", {}))  # the question-only baselines of the data (`build_data`)
        for prefix, types in (("vqa_", answer_types), ("vqa_qtype_", question_types)):
            by_type = mean_by(accuracy, types)
            out.update({prefix + _key(kind): by_type[kind] for kind in sorted(set(by_type) - {""})})
        return out

    @classmethod
    def plan_options(cls, cfg: Mapping[str, Any]) -> dict[str, Any]:
        """The answer vocabulary's size: ``num_answers``, else VQA v2's 3,129."""
        return {"num_answers": int(cfg.get("num_answers") or VQA_V2_ANSWERS)}

    def example_batch(self, batch_size: int, text_len: int, num_regions: int, values: bool = True) -> VLBatch:
        batch = super().example_batch(batch_size, text_len, num_regions, values)
        soft = torch.zeros(batch_size, self.num_answers, device=batch.device)
        soft[:, 0] = 1.0
        return batch.replace(targets={"soft_targets": soft})

    @classmethod
    def build_data(cls, cfg: Mapping[str, Any], tokenizer: Any, image_source: Any, world: Any = None) -> TaskData:
        """Questions of the shapes world or of VQAv2 files (``files.<split>: {questions, annotations,
        image_id_format}``); the vocabulary is the ``num_answers`` most frequent train answers."""
        splits = split_records(cfg, world, shapes_vqa_records, _vqa_files)
        answers = answer_vocabulary(splits["train"], cfg.get("num_answers"))
        if not answers:
            raise ValueError("task vqa: the train questions have no answers to build a vocabulary from "
                             "(files.train needs annotations)")
        answer2label = {a: k for k, a in enumerate(answers)}
        max_len = cfg.get("max_len", 40)
        data = {s: _vqa_dataset(recs, answer2label, tokenizer, image_source, max_len,
                                cfg.get("filter_long", False) and s == "train") for s, recs in splits.items()}
        if cfg.get("blind_baseline", True):
            rules = str((cfg.get("options") or {}).get("rules") or "2021")
            for split, part in data.items():
                if split != "train":
                    part.baselines = baseline_accuracies(splits["train"], splits[split], answers, rules)
        train = data.pop("train")
        return TaskData(train=train, eval=data, options={"answers": answers, "majority_answer": answers[0]})
