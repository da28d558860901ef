"""The public functions of ``import vlkit`` (`vlkit.build_model`, `vlkit.build_task` ...): the top of the
house, over the models, objectives and tasks they build. ``vlkit/__init__`` names them and imports this
module on first use, so that importing any part of vlkit never imports a higher layer.
"""
from __future__ import annotations

from typing import Any

from vlkit import objectives
from vlkit.models import base
from vlkit.models.recipe import recipe_of
from vlkit.registry import MODELS, OBJECTIVES, TASKS
from vlkit.released import PRETRAINED


def list_models(presets: bool = False) -> list[str]:
    """Names of the registered model families (built-ins plus plugins); with ``presets=True`` every
    preset as ``<family>/<preset>`` (``uniter/base``, ``uniter/tiny`` ...)."""
    if presets:
        return base.list_presets()
    return MODELS.names()


def build_model(name_or_cfg: Any, preset: str | None = None, pretrained: str | None = None, processor: Any = None,
                **overrides: Any):
    """Build a model: ``build_model("uniter", preset="base", num_hidden_layers=6)``, ``build_model("uniter/tiny")``
    (any name `list_models` gives), ``build_model(cfg)``, or with the named released weights it was converted
    from: ``build_model("uniter", pretrained="base.official")`` (`list_pretrained`). With a `VLProcessor`
    (`build_processor`) the data decides the sizes it decides on the command line (vocabulary, region feature and
    class sizes; the preset defaults to the processor's), and the model keeps the processor (``model.processor``:
    `save_pretrained` writes it beside the weights)."""
    if processor is None:
        return base.build_model(name_or_cfg, preset=preset, pretrained=pretrained, **overrides)
    if pretrained is not None:
        raise ValueError("build_model: pretrained= fixes the model's sizes; a processor= cannot size it")
    if isinstance(name_or_cfg, str):
        name, named_preset = base.model_name(name_or_cfg)
    else:
        name, named_preset, given = base.split_model_config(name_or_cfg)
        overrides = {**given, **overrides}
    if name != processor.family:
        raise ValueError(f"build_model: the processor was built for {processor.family}, not {name}")
    model = base.build_model(processor.model_config(preset or named_preset, **overrides))
    model.processor = processor
    return model


def list_pretrained(family: str | None = None, available: bool = False) -> list[str]:
    """The named released weights as ``<family>/<tag>`` (``uniter/base.official``), of ``family`` only when
    given; with ``available=True`` only those converted on disk (``vlkit convert pretrained=<name> src=<file>``),
    which ``build_model(family, pretrained=tag)`` loads."""
    return [name for name in PRETRAINED.names() if (family is None or name.startswith(f"{family}/"))
            and (not available or PRETRAINED.get(name).converted)]


def from_pretrained(path: str, **kwargs: Any):
    """Load a model saved with ``model.save_pretrained(path)`` (config.json + model.safetensors)."""
    return base.from_pretrained(path, **kwargs)


def list_objectives() -> list[str]:
    return OBJECTIVES.names()


def build_objective(name: str, model, **cfg: Any):
    """One objective with its head for ``model``: ``build_objective("itm", model, split="half")``."""
    return objectives.build_objective(name, model, **cfg)


def build_pretraining(model, mix: Any = None):
    """The pre-training module (heads + objective mix) for ``model``; ``mix`` is a preset name, a YAML
    path or a dict (None: the family's own mix, its recipe's ``mix``)."""
    return objectives.build_pretraining(model, recipe_of(model).mix if mix is None else mix)


def list_tasks() -> list[str]:
    return TASKS.names()


def build_task(name: str, model, **cfg: Any):
    """A downstream task with the family's head for it (or the generic one): ``build_task("vqa", model, num_answers=3129)``."""
    from vlkit.tasks import build_task as _build  # start-up cost: vlkit.build_model loads no task (0.1 s, PIL)

    return _build(name, model, **cfg)
