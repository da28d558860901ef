"""Converters of released checkpoints (`from_official`): one per family, in the converter registry
(`vlkit.registry.CONVERTERS`). Each family's converter registers itself with its key signature
(``@vlkit.register_converter("uniter", signature=("uniter.img_embeddings.", ...))`` on an
`OfficialConverter` subclass), so a plugin family's converter is found by ``vlkit convert family=<plugin>``,
`from_official` and the family guess from a file's keys (`detect_family`) like the built-in ones. The
bottom-up-attention detector's converter lives with the detector (`vlkit.features.detector.convert`).

    pre = vlkit.convert.from_official("uniter", "uniter-base.pt")                  # Pretraining: model + heads
    vqa = vlkit.convert.from_official("vilbert", "multi_task_model.bin", task="vqa",
                                      config="bert_base_6layer_6conect.json")       # VQATask with vil_prediction
    ret = vlkit.convert.from_official("meter", "meter_clip16_288_roberta_flickr.ckpt", config={"image_size": 384})
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from torch import nn

from vlkit.convert.official import (MODEL, PRETRAINING, ConversionError, OfficialConverter, OfficialReport, Source,
                                    describe_family, detect_family, read_official)
from vlkit.data.tokenizers import save_tokenizer
from vlkit.io import atomic_write_text
from vlkit.models.base import VLModel
from vlkit.objectives.mix import Pretraining
from vlkit.registry import CONVERTERS, UnknownNameError
from vlkit.runs import RUN_INFO, save_run


def converter(family: str) -> OfficialConverter:
    """The official-checkpoint converter of ``family``: a built-in one (``vilbert``, ``uniter``, ``meter``) or
    one a plugin registered with `vlkit.register_converter`."""
    try:
        return CONVERTERS.get(family)()
    except UnknownNameError as err:
        raise ConversionError(f"no converter for family {family!r}: {err}") from None


def from_official(family: str | None, checkpoint: str | os.PathLike | Mapping[str, Any],
                  config: Mapping[str, Any] | str | os.PathLike | None = None, task: str | None = None,
                  options: Mapping[str, Any] | None = None,
                  return_report: bool = False) -> nn.Module | tuple[nn.Module, OfficialReport]:
    """vlkit modules with every weight of a released checkpoint in place (eval mode).

    ``family``: the family whose converter reads the file (a registered converter, `vlkit.register_converter`;
    None: the family whose key signature the file carries, `detect_family`).
    ``checkpoint``: the released file (``.bin`` / ``.pt`` / ``.pth`` / ``.ckpt`` / ``.tar``, read with
    ``torch.load(weights_only=True)``; Lightning files: only ``state_dict``; or ``.safetensors``) or a state
    dict. ``config``: the official repository's own config (a mapping or a JSON / YAML file: ViLBERT
    ``bert_base_6layer_6conect.json`` keys, UNITER ``uniter-base.json``, METER ``config.py`` values such as
    ``vit``, ``image_size``, ``patch_size``, ``tokenizer``, ``num_top_layer``); sizes it does not give come
    from the tensor shapes. ``task``: ``pretraining`` (a `vlkit.objectives.Pretraining` with the objective
    heads the file holds), a task name (``vqa``, ``retrieval``, ``refexp``, ``nlvr2``, ``snli_ve``, ViLBERT
    ``gqa``) for the task module with the file's head, or ``model`` for the bare model; by default the
    heads the file holds decide. ``options`` go to the task's constructor (``answers=`` the VQA answer
    strings in label order, ``task_id=`` ViLBERT's task token: default the ``vilbert_tasks.yml`` id of the
    task, e.g. 7 instead of 8 for COCO retrieval). Every source key is mapped or declared unused with
    its reason; anything else raises `ConversionError` naming the keys. ``return_report=True`` also
    returns the `OfficialReport`.
    """
    state, meta, name = read_official(checkpoint)
    if family is None:
        family = detect_family(list(state))
        if family not in CONVERTERS:
            raise ConversionError(f"{name}: no registered converter recognises its keys: it looks like "
                                  f"{describe_family(family)} (first keys: {', '.join(list(state)[:3])}); converters: "
                                  f"{', '.join(CONVERTERS.names())}")
    module, report = converter(family).convert_state(state, meta, name, config, task, options)
    return (module, report) if return_report else module


def save_converted(module: nn.Module, report: OfficialReport, directory: str | os.PathLike,
                   tokenizer: Any = None) -> Path:
    """Write a converted module as a vlkit run directory: ``model/`` (``save_pretrained``), the module's
    weights (``pretraining.safetensors`` or ``task.safetensors``), ``tokenizer/`` when ``tokenizer`` is given and
    ``run.json`` (with the official tokenizer's name: what ``finetune init=`` / ``evaluate checkpoint=`` use without
    ``tokenizer/`` unless ``data.tokenizer`` is given), which
    `vlkit.from_pretrained`, ``vlkit finetune init=`` and ``vlkit evaluate checkpoint=`` read."""
    directory = Path(directory)
    converted = {"source": report.source, "family": report.family, "kind": report.kind,
                 "unused": report.unused, "transformed": report.transformed, "cast": len(report.cast)}
    model = module if isinstance(module, VLModel) else module.model
    official = type(model).official_tokenizer(model.config)  # what `vlkit.data.tokenizers.run_tokenizer` reads
    if isinstance(module, VLModel):  # no heads: the model alone
        module.save_pretrained(directory / "model")
        if tokenizer is not None:
            save_tokenizer(tokenizer, directory)
        info = {"kind": "model", "family": module.family, "converted": converted, "tokenizer": official}
        atomic_write_text(directory / RUN_INFO, json.dumps(info, indent=2, sort_keys=True))
        return directory
    if isinstance(module, Pretraining):
        info = {"kind": "pretrain", "family": module.model.family, "objectives": module.mix, "seed": module.seed,
                "data": None, "converted": converted, "tokenizer": official}
    else:
        itm = getattr(module, "itm", None)
        pretraining = {"objectives": {"itm": {}}, "seed": 0} if itm is not None else None  # retrieval's ITM head
        info = {"kind": "finetune", "task": module.name, "family": module.model.family,
                "options": task_options(module), "data": None, "task_cfg": None, "pretraining": pretraining,
                "converted": converted, "tokenizer": official}
    save_run(directory, module, info, tokenizer)
    return directory


def task_options(task: nn.Module) -> dict[str, Any]:
    """The constructor options that rebuild a converted task (`vlkit.build_task`) before its weights load."""
    options: dict[str, Any] = {"head": getattr(task, "head_kind", None)}
    for name in ("answers", "num_answers", "task_id", "labels", "use_img_type"):
        value = getattr(task, {"labels": "label_names"}.get(name, name), None)
        if value is not None:
            options[name] = list(value) if isinstance(value, (list, tuple)) else value
    if task.name == "refexp":
        options["mlp"] = 2 if isinstance(task.task_head.output_layer, nn.Sequential) else 1
    if task.name == "retrieval":
        options.pop("head")
    return {k: v for k, v in options.items() if v is not None}


# the built-in families' converters register themselves (this package is the home of vlkit.CONVERTERS); at the end:
# they import this package's names first. In this order: a state dict's family is looked up in registration order
from vlkit.convert import vilbert, uniter, meter  # noqa: E402,F401

__all__ = ["ConversionError", "OfficialConverter", "OfficialReport", "Source", "PRETRAINING", "MODEL", "converter",
           "detect_family", "from_official", "read_official", "save_converted", "task_options"]
