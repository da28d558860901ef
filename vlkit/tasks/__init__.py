"""Downstream tasks: dataset adapters, loss orchestration and exact metrics; the heads come from the
``(task, family)`` head registry (`vlkit.registry.HEADS`), filled by the family files and plugins.

Each task module registers itself in `vlkit.TASKS`; this package, the registry's home, imports them (at the end:
they import its base first)."""
from __future__ import annotations

from typing import Any

from vlkit.registry import TASKS
from vlkit.tasks.base import IncompatibleTask, Task, TaskData


def build_task(name: str, model, **options: Any) -> Task:
    """``build_task("vqa", model, num_answers=3129)``: the registered task with the family's head (or the
    generic one); `IncompatibleTask` when the model cannot serve the task."""
    return TASKS.get(name)(model, **options)


from vlkit.tasks import nlvr2, refexp, retrieval, snli_ve, vqa  # noqa: E402,F401  (register the built-in tasks)

__all__ = ["IncompatibleTask", "Task", "TaskData", "build_task"]
