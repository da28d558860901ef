"""vlkit: ViLBERT, UNITER and METER under one roof, and a registry that any further family joins.

    import vlkit
    model = vlkit.build_model("uniter", preset="tiny")
    out = model(model.example_batch(batch_size=2))

The extension API (a new family in its own package, found through the ``vlkit.plugins`` entry point):
`register_model` with `VLModel` / `ModelConfig`, `register_head` with the head bases (`Head`,
`JointClassifier`, `PairClassifier`, `RegionScorer`, `RankHead`), `register_objective` with
`Objective`, and the shared layers (`BertLayer`, `Pooler`, `run_single_stream`, `init_bert_weights` ...).
Names other than the registries and the contracts load on first use, so ``import vlkit`` stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

from vlkit.registry import (CONVERTERS, DATASETS, ENCODERS, HEADS, MODELS, OBJECTIVES, TASKS, Registry,
                            UnknownNameError, register_converter, register_dataset, register_encoder, register_head,
                            register_model, register_objective, register_task)
from vlkit.types import Encoded, LossOutput, VLBatch, VLOutput

__version__ = "0.1.0"

# public name -> module that defines it (imported on first access)
_LAZY = {
    **dict.fromkeys(("VLModel", "ModelConfig", "BertStreamConfig"), "vlkit.models.base"),
    **dict.fromkeys(("Head", "JointClassifier", "PairClassifier", "RegionScorer", "RankHead", "mlp_classifier",
                     "init_linear"), "vlkit.models.heads"),
    **dict.fromkeys(("BertLayer", "BertCrossLayer", "BertAttention", "BertSelfAttention", "BertOutput",
                     "BertIntermediate", "Pooler", "additive_mask", "attend", "bert_layers", "run_layers",
                     "run_single_stream", "init_bert_weights", "extend_embedding", "activation", "MASK_VALUE"),
                    "vlkit.models.layers"),
    **dict.fromkeys(("BertTextEmbeddings", "box_locations", "interpolate_pos_embed"), "vlkit.models.embeddings"),
    **dict.fromkeys(("Objective", "PassContext", "IncompatibleObjective", "PredictionHeadTransform"),
                    "vlkit.objectives.base"),
    **dict.fromkeys(("Task", "TaskData", "IncompatibleTask"), "vlkit.tasks.base"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'vlkit' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


def list_models(presets: bool = False) -> list[str]:
    """Names of the registered model families (built-ins plus plugins); with ``presets=True`` every
    preset as ``<family>/<preset>`` (``uniter/base``, ``uniter/tiny`` ...)."""
    if presets:
        from vlkit.models.base import list_presets

        return list_presets()
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


def build_pretraining(model, mix: Any = None):
    """The pre-training module (heads + objective mix) for ``model``; ``mix`` is a preset name, a YAML
    path or a dict (None: the family's own mix, its ``default_mix``)."""
    from vlkit.objectives.mix import build_pretraining as _build

    return _build(model, type(model).default_mix if mix is None else mix)


def list_tasks() -> list[str]:
    return TASKS.names()


def build_task(name: str, model, **cfg: Any):
    """A downstream task with the family's head for it (or the generic one): ``build_task("vqa", model, num_answers=3129)``."""
    from vlkit.tasks import build_task as _build

    return _build(name, model, **cfg)


__all__ = [
    "CONVERTERS", "DATASETS", "ENCODERS", "HEADS", "MODELS", "OBJECTIVES", "TASKS", "Registry", "UnknownNameError",
    "register_converter", "register_dataset", "register_encoder", "register_head", "register_model", "register_objective", "register_task",
    "Encoded", "LossOutput", "VLBatch", "VLOutput",
    "list_models", "build_model", "from_pretrained", "list_objectives", "build_objective",
    "build_pretraining", "list_tasks", "build_task", *_LAZY,
]
