"""Prediction files in the formats the leaderboards and official scripts take, one per task.

``PREDICTIONS`` maps a task name to its `PredictionFormat`; `write_predictions` runs the task over an
evaluation set and writes the file atomically (a failure leaves any previous file as it was):

- ``vqa``: the VQA / EvalAI results JSON ``[{"question_id": int, "answer": str}, ...]`` over every
  question of the split, in question order; a question left without a prediction (an example skipped
  by ``data.on_error=skip``) is an error naming it, and no file is written.
- ``nlvr2``: the CSV the official ``nlvr2/eval/metrics.py`` reads, one ``identifier,prediction`` line
  per example (``True`` / ``False``), no header; written by the ``csv`` module, so an identifier holding a
  comma, a quote or a line break is quoted and a CSV reader reads it back whole (`read_nlvr2_predictions`).
- ``refexp``: JSON ``[{"sent_id", "image_id", "bbox": [x, y, w, h]}, ...]``, the chosen box of each
  expression in pixels of the annotation's image, COCO's xywh (as ``instances.json`` and UNITER's
  results file give boxes).
- ``retrieval``: JSON ``{"k": k, "image_retrieval": {caption_id: [image_id x k]}, "text_retrieval":
  {image_id: [caption_id x k]}}``, the k = 10 best candidates of each query (all of them when fewer),
  best first, equal scores by candidate order.

A plugin task registers its own with ``PREDICTIONS.register(name)(PredictionFormat(...))``.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from vlkit.io import atomic_write_text
from vlkit.registry import Registry
from vlkit.tasks.base import eval_batches

__all__ = ["PREDICTIONS", "PredictionFormat", "check_predictions_path", "read_nlvr2_predictions", "write_predictions"]

PREDICTIONS = Registry("prediction format")


@dataclass(frozen=True)
class PredictionFormat:
    """``render(task, data, batch_size) -> (text, count)``: the file's text and how many predictions it
    holds; ``labelled(data)``: whether ``data`` carries the labels `Task.evaluate` scores; ``kind``: the
    file's name in messages."""

    render: Callable[[Any, Any, int], tuple[str, int]]
    labelled: Callable[[Any], bool]
    kind: str


def write_predictions(task: Any, data: Any, path: str | Path, batch_size: int = 64) -> dict[str, Any]:
    """Write ``task``'s predictions over ``data`` (one of `TaskData.eval`) to ``path`` in the task's
    `PredictionFormat`; returns ``{"path", "format", "count"}``."""
    fmt = PREDICTIONS.get(task.name)
    text, count = fmt.render(task, data, batch_size)
    atomic_write_text(path, text)
    return {"path": str(path), "format": fmt.kind, "count": count}


def check_predictions_path(path: str | Path, key: str = "predictions") -> Path:
    """``path`` as a file a prediction writer may write, checked before any prediction is made: not a folder, and
    its parent a folder (or to be made), not a file; else `IsADirectoryError` / `NotADirectoryError` naming ``key``."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{key}={path} is a folder; name the file to write, e.g. {key}={path / 'predictions.json'}")
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise NotADirectoryError(f"{key}={path}: {parent} is a file, not a folder")
    return path


def _complete(task: str, expected: Iterable[Any], got: dict[str, Any]) -> list[Any]:
    """``expected`` (ids in split order), after checking that every one has a prediction."""
    expected = list(expected)
    missing = [x for x in expected if str(x) not in got]
    if missing:
        shown = ", ".join(repr(x) for x in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"{task} predictions: {len(missing)} of {len(expected)} examples have no prediction "
                         f"({shown}); refusing to write a partial file (were they skipped by data.on_error=skip?)")
    return expected


# -- VQA ----------------------------------------------------------------------------------------------
def _vqa_render(task: Any, data: Any, batch_size: int) -> tuple[str, int]:
    if task.answers is None:
        raise ValueError("vqa predictions: the task has no answer strings (build it with answers=)")
    answers: dict[str, str] = {}
    for batch in task.batches(data, batch_size, "vqa predictions"):
        answers.update(zip(batch.ids, task.predict(batch)["answers"]))
    question_ids = _complete("vqa", getattr(data, "question_ids", None) or data.example_ids(), answers)
    results = [{"question_id": int(q), "answer": answers[str(q)]} for q in question_ids]
    return json.dumps(results), len(results)


def _vqa_labelled(data: Any) -> bool:
    return all(data.data["answers"])


PREDICTIONS.register("vqa")(PredictionFormat(_vqa_render, _vqa_labelled, "VQA results json"))


# -- NLVR2 --------------------------------------------------------------------------------------------
def _nlvr2_render(task: Any, data: Any, batch_size: int) -> tuple[str, int]:
    predicted: dict[str, bool] = {}
    for batch in task.batches(data, batch_size, "nlvr2 predictions"):
        out = task.predict(batch)
        predicted.update(zip(out["ids"], out["labels"]))
    identifiers = _complete("nlvr2", data.pairs.example_ids(), predicted)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows((i, predicted[i]) for i in identifiers)
    return out.getvalue(), len(identifiers)


def read_nlvr2_predictions(path: str | Path) -> dict[str, bool]:
    """``{identifier: prediction}`` of an NLVR2 predictions CSV (quoted fields read whole); a row that is not
    ``identifier,True|False`` or an identifier given twice is an error naming the file and the line."""
    out: dict[str, bool] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for line, row in enumerate(csv.reader(f), 1):
            if len(row) != 2 or row[1] not in ("True", "False"):
                raise ValueError(f"{path}:{line}: expected identifier,True|False, got {len(row)} field(s) {row!r}")
            if row[0] in out:
                raise ValueError(f"{path}:{line}: identifier {row[0]!r} appears again")
            out[row[0]] = row[1] == "True"
    return out


def _nlvr2_labelled(data: Any) -> bool:
    return all(label is not None for label in data.pairs.data["label"])


PREDICTIONS.register("nlvr2")(PredictionFormat(_nlvr2_render, _nlvr2_labelled, "NLVR2 identifier,prediction csv"))


# -- RefExp -------------------------------------------------------------------------------------------
def _refexp_render(task: Any, data: Any, batch_size: int) -> tuple[str, int]:
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False, collate_fn=data.collator())
    chosen: dict[str, dict[str, Any]] = {}
    for batch in eval_batches(task, loader, "refexp predictions"):
        boxes = task.predict(batch)["box"].double().cpu()
        for sent_id, image_id, (x1, y1, x2, y2) in zip(batch.ids, batch.image_ids, boxes.tolist()):
            chosen[sent_id] = {"sent_id": int(sent_id) if sent_id.isdigit() else sent_id, "image_id": image_id,
                               "bbox": [x1, y1, x2 - x1, y2 - y1]}
    sent_ids = _complete("refexp", data.example_ids(), chosen)
    return json.dumps([chosen[s] for s in sent_ids]), len(sent_ids)


PREDICTIONS.register("refexp")(PredictionFormat(_refexp_render, lambda data: True, "RefExp boxes json"))


# -- retrieval ----------------------------------------------------------------------------------------
RANKING_K = 10


def _top(scores: torch.Tensor, k: int) -> list[list[int]]:
    """Indices of the ``k`` best columns of each row, best first, equal scores by column order."""
    return scores.argsort(dim=1, descending=True, stable=True)[:, :k].tolist()


def _retrieval_render(task: Any, data: Any, batch_size: int) -> tuple[str, int]:
    i2t, t2i = task.ranking_scores(data, batch_size=batch_size)
    image_retrieval = {data.caption_ids[t]: [data.image_ids[i] for i in row]
                       for t, row in enumerate(_top(t2i.T, RANKING_K))}
    text_retrieval = {data.image_ids[i]: [data.caption_ids[t] for t in row]
                      for i, row in enumerate(_top(i2t, RANKING_K))}
    payload = {"k": RANKING_K, "image_retrieval": image_retrieval, "text_retrieval": text_retrieval}
    return json.dumps(payload), len(image_retrieval) + len(text_retrieval)


PREDICTIONS.register("retrieval")(PredictionFormat(_retrieval_render, lambda data: True, "retrieval rankings json"))
