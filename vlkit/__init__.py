"""vlkit: ViLBERT, UNITER and METER under one roof.

    import vlkit
    model = vlkit.build_model("uniter", preset="tiny")
    out = model(model.example_batch(batch_size=2))
"""
from __future__ import annotations

from typing import Any

from vlkit.registry import DATASETS, ENCODERS, MODELS, OBJECTIVES, TASKS, Registry, UnknownNameError
from vlkit.types import Encoded, LossOutput, VLBatch, VLOutput

__version__ = "0.1.0"


def list_models() -> list[str]:
    """Names of the registered model families (built-ins plus plugins)."""
    return MODELS.names()


def build_model(name_or_cfg: Any, preset: str | None = None, **overrides: Any):
    """Build a model: ``build_model("uniter", preset="base", num_hidden_layers=6)`` or ``build_model(cfg)``."""
    from vlkit.models.base import build_model as _build

    return _build(name_or_cfg, preset=preset, **overrides)


def from_pretrained(path: str, **kwargs: Any):
    """Load a model saved with ``model.save_pretrained(path)`` (config.json + model.safetensors)."""
    from vlkit.models.base import from_pretrained as _load

    return _load(path, **kwargs)


def list_objectives() -> list[str]:
    return OBJECTIVES.names()


def build_objective(name: str, model, **cfg: Any):
    """One objective with its head for ``model``: ``build_objective("itm", model, split="half")``."""
    from vlkit.objectives import build_objective as _build

    return _build(name, model, **cfg)


def build_pretraining(model, mix: Any):
    """The pre-training module (heads + objective mix) for ``model``; ``mix`` is a preset name or a dict."""
    from vlkit.objectives.mix import build_pretraining as _build

    return _build(model, mix)


def list_tasks() -> list[str]:
    return TASKS.names()


def build_task(name: str, model, **cfg: Any):
    from vlkit.tasks import build_task as _build

    return _build(name, model, **cfg)


__all__ = [
    "DATASETS", "ENCODERS", "MODELS", "OBJECTIVES", "TASKS", "Registry", "UnknownNameError",
    "Encoded", "LossOutput", "VLBatch", "VLOutput",
    "list_models", "build_model", "from_pretrained", "list_objectives", "build_objective",
    "build_pretraining", "list_tasks", "build_task",
]
