"""Downstream tasks: the families' official heads, dataset adapters and exact metrics.

Each task module registers itself in `vlkit.TASKS` when first looked up (see `vlkit.registry`)."""
from __future__ import annotations

from typing import Any

from vlkit.registry import TASKS
from vlkit.tasks.base import Task


def build_task(name: str, model, **options: Any) -> Task:
    """``build_task("vqa", model, num_answers=3129)``: the registered task with the family's head."""
    return TASKS.get(name)(model, **options)


__all__ = ["Task", "build_task"]
