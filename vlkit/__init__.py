"""vlkit: ViLBERT, UNITER and METER under one roof, and a registry that any further family joins.

    import vlkit
    model = vlkit.build_model("uniter", preset="tiny")
    out = model(model.example_batch(batch_size=2))

Composing in Python: `build_processor` (a `VLProcessor`: tokenizer, images, collator) sizes `build_model`;
`pretrain`, `finetune`, `evaluate` and `compare` build each command's typed spec (`PretrainSpec`, `FinetuneSpec`,
`EvaluateSpec`, `CompareSpec`) from keyword arguments and objects and run the command on it (docs/python.md).

The extension API (a new family in its own package, found through the ``vlkit.plugins`` entry point):
`register_model` with `VLModel` / `ModelConfig`, `register_head` with the head bases (`Head`,
`JointClassifier`, `PairClassifier`, `RegionScorer`, `RankHead`), `register_objective` with
`Objective`, `register_corruption` with `Corruption` (a view an objective scores), `register_executor` with
`Executor` (where a comparison's units run), and the shared layers
(`BertLayer`, `Pooler`, `run_single_stream`, `init_bert_weights` ...).
Names other than the registries and the contracts load on first use, so ``import vlkit`` stays light.
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from vlkit.registry import (CONVERTERS, CORRUPTIONS, DATASETS, ENCODERS, EXECUTORS, HEADS, MODELS, OBJECTIVES, TASKS,
                            Registry, UnknownNameError, register_converter, register_corruption, register_dataset,
                            register_encoder, register_executor, register_head, register_model, register_objective,
                            register_task)
from vlkit.released import PRETRAINED, RELEASED_FILES
from vlkit.types import Encoded, LossOutput, VLBatch, VLOutput
from vlkit.version import __version__

# The home of each registry: the module whose import registers its built-in entries (a package's __init__ imports
# its own files), imported on the registry's first look-up. Written here, with the lazy names below (the one table
# of string imports the layer check allows the bottom floor), so that vlkit.registry names no room above it.
_HOMES = {"vlkit.models": (MODELS, HEADS, ENCODERS, PRETRAINED, RELEASED_FILES),  # the recipes file releases
          "vlkit.objectives": (OBJECTIVES, CORRUPTIONS), "vlkit.tasks": (TASKS,), "vlkit.data": (DATASETS,),
          "vlkit.compare.executors": (EXECUTORS,), "vlkit.convert": (CONVERTERS,)}
for _home, _registries in _HOMES.items():
    for _registry in _registries:
        _registry.home = _home
del _home, _registries, _registry

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
    "Corruption": "vlkit.objectives.corruption",
    **dict.fromkeys(("Task", "TaskData", "IncompatibleTask"), "vlkit.tasks.base"),
    **dict.fromkeys(("list_models", "build_model", "from_pretrained", "list_pretrained", "list_objectives",
                     "build_objective", "build_pretraining", "list_tasks", "build_task"), "vlkit.api"),
    **dict.fromkeys(("PretrainedWeights", "register_pretrained"), "vlkit.released"),
    **dict.fromkeys(("Recipe", "RECIPES", "register_recipe", "recipe_of"), "vlkit.models.recipe"),
    **dict.fromkeys(("VLProcessor", "build_processor", "load_model_and_processor"), "vlkit.processor"),
    **dict.fromkeys(("pretrain", "finetune", "evaluate", "set_quiet", "RunResult"), "vlkit.workflows"),
    **dict.fromkeys(("PretrainSpec", "FinetuneSpec", "EvaluateSpec"), "vlkit.train.spec"),
    **dict.fromkeys(("CompareSpec",), "vlkit.compare.spec"),
    **dict.fromkeys(("ComparisonResult",), "vlkit.compare.command"),
    **dict.fromkeys(("SpecError",), "vlkit.config"),
    **dict.fromkeys(("ImageTextPairs", "VLCollator", "build_pairs", "build_tokenizer", "build_image_source"),
                    "vlkit.data"),
    "TrainerConfig": "vlkit.train",
    "Executor": "vlkit.compare.executor_base",
}


# public functions named like a subpackage: ``vlkit.compare(...)`` calls the function, and ``vlkit.compare`` stays the
# package (``vlkit.flops.count``, ``from vlkit.compare import main``)
_CALLABLE_PACKAGES = {"compare": "vlkit.workflows"}


class _CallablePackage(ModuleType):
    """A subpackage that is also the function of the same name (`_CALLABLE_PACKAGES`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self.__name__.rpartition(".")[2]
        return getattr(importlib.import_module(_CALLABLE_PACKAGES[name]), name)(*args, **kwargs)


class _Package(ModuleType):
    """The type of the ``vlkit`` module: a subpackage of `_CALLABLE_PACKAGES`, once imported, becomes callable."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _CALLABLE_PACKAGES and type(value) is ModuleType:
            value.__class__ = _CallablePackage
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name in _CALLABLE_PACKAGES:
        return importlib.import_module(f"{__name__}.{name}")  # importing it sets it here, callable
    if name not in _LAZY:
        raise AttributeError(f"module 'vlkit' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = [
    "CONVERTERS", "CORRUPTIONS", "DATASETS", "ENCODERS", "EXECUTORS", "HEADS", "MODELS", "OBJECTIVES", "TASKS",
    "Registry", "UnknownNameError", "register_converter", "register_corruption", "register_dataset",
    "register_encoder", "register_executor",
    "register_head", "register_model", "register_objective", "register_task",
    "Encoded", "LossOutput", "VLBatch", "VLOutput",
    "__version__", *_LAZY, *_CALLABLE_PACKAGES,
]
