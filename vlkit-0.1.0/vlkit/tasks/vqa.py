"""VQA: answer vocabulary by train frequency, soft scores ``min(1, n/3)``, the family's head on its
joint vector (a `vlkit.models.heads.JointClassifier`), the head's loss on the soft scores (by default
BCE-with-logits times the number of answers), and the official VQA accuracy.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Iterable

import torch
from torch import nn

from vlkit.registry import register_task
from vlkit.tasks.base import HeadTask, TaskData, classification_loss, mean, most_common, split_records
from vlkit.tasks.metrics import normalize_answer, vqa_accuracy, vqa_score_from_soft_targets
from vlkit.types import LossOutput, VLBatch

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


class VQATargets:
    """``targets(record)`` of a VQA example: the dense soft scores [num_answers], the raw human
    answers and the answer type (for the official accuracy per type)."""

    def __init__(self, num_answers: int):
        self.num_answers = num_answers

    def __call__(self, row: Mapping[str, Any]) -> dict[str, Any]:
        soft = torch.zeros(self.num_answers)
        if row["labels"]:
            soft[torch.tensor(row["labels"], dtype=torch.long)] = torch.tensor(row["scores"], dtype=torch.float32)
        return {"soft_targets": soft, "answers": list(row["answers"]), "answer_type": row.get("answer_type") or ""}


def shapes_vqa_records(world: Any, i: int) -> list[dict]:
    """The questions of shapes image ``i`` as `vlkit.data.formats.read_vqa` records."""
    return [{"id": str(q["question_id"]), "question_id": q["question_id"], "image_id": world.image_id(i),
             "question": q["question"], "answers": [str(a["answer"]) for a in q["answers"]],
             "answer_type": q["answer_type"], "question_type": q["question_type"],
             "multiple_choice_answer": q["multiple_choice_answer"]} for q in world.vqa(i)]


def _vqa_files(spec: Mapping[str, Any]) -> list[dict]:
    from vlkit.data.formats import read_vqa

    if not isinstance(spec, Mapping) or not spec.get("questions"):
        raise ValueError(f"task vqa: each files.<split> entry needs questions (and annotations), got {spec!r}")
    return read_vqa(spec["questions"], spec.get("annotations"), spec.get("image_id_format", "{}"))


def _vqa_dataset(records: list[dict], answer2label: Mapping[str, int], tokenizer: Any, image_source: Any,
                 max_len: int, filter_long: bool):
    from vlkit.data.pairs import ImageTextPairs

    rows = []
    for r in records:
        labels, scores = soft_scores(r["answers"], answer2label)
        rows.append({**r, "labels": labels, "scores": scores})
    return ImageTextPairs(rows, tokenizer, image_source, max_len=max_len, filter_long=filter_long,
                          text_key="question", targets=VQATargets(len(answer2label)))


@register_task("vqa")
class VQATask(HeadTask):
    """VQA over an answer vocabulary (``answers``, sorted by train frequency as `build_data` gives it).

    ``num_answers`` alone builds the head without answer strings (``predict`` then gives label ids,
    ``evaluate`` needs the strings). ``majority_answer`` (default ``answers[0]``) is the baseline that
    `evaluate` reports as ``vqa_majority_baseline``.
    """

    name = "vqa"

    def __init__(self, model: nn.Module, answers: Sequence[str] | None = None, num_answers: int | None = None,
                 majority_answer: str | None = None, loss: str | None = None, task_id: int | None = None,
                 head: str | None = None):
        super().__init__(model, loss, task_id, head)
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
        """Official VQA accuracy (``vqa``, and ``vqa_<answer type>``), the training soft score
        (``vqa_soft_score``) and the accuracy of always answering the majority answer
        (``vqa_majority_baseline``), all fractions."""
        if self.answers is None:
            raise ValueError("task vqa: evaluate needs the answer strings (build the task with answers=)")
        predicted, humans, types, ids, soft = [], [], [], [], []
        for batch in self.batches(data, batch_size, "vqa eval"):
            out = self.predict(batch)
            predicted += out["answers"]
            humans += self.target(batch, "answers")
            types += self.target(batch, "answer_type")
            ids += batch.ids or [None] * batch.batch_size
            soft.append(vqa_score_from_soft_targets(out["logits"], self.target(batch, "soft_targets")).cpu())
        missing = [i for i, h in zip(ids, humans) if not h]
        if missing:
            raise ValueError(f"task vqa: question {missing[0]!r} (and {len(missing) - 1} more) has no human answers; "
                             "an unannotated split can only be predicted")
        accuracy = vqa_accuracy(predicted, humans)
        out = {"vqa": mean(accuracy), "vqa_soft_score": float(torch.cat(soft).mean())}
        if self.majority_answer is not None:
            out["vqa_majority_baseline"] = mean(vqa_accuracy([self.majority_answer] * len(humans), humans))
        for kind in sorted(set(types) - {""}):
            key = "vqa_" + kind.replace("/", "_").replace(" ", "_")
            out[key] = mean([a for a, t in zip(accuracy, types) if t == kind])
        return out

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
        train = data.pop("train")
        return TaskData(train=train, eval=data, options={"answers": answers, "majority_answer": answers[0]})
