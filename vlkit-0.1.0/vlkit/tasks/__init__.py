"""Downstream tasks: dataset adapters, loss orchestration and exact metrics; the heads come from the
``(task, family)`` head registry (`vlkit.registry.HEADS`), filled by the family files and plugins.

Each task module registers itself in `vlkit.TASKS` when first looked up (see `vlkit.registry`)."""
from __future__ import annotations

from typing import Any

from vlkit.registry import TASKS
from vlkit.tasks.base import IncompatibleTask, Task, TaskData


def build_task(name: str, model, **options: Any) -> Task:
    """``build_task("vqa", model, num_answers=3129)``: the registered task with the family's head (or the
    generic one); `IncompatibleTask` when the model cannot serve the task."""
    return TASKS.get(name)(model, **options)


__all__ = ["IncompatibleTask", "Task", "TaskData", "build_task"]
