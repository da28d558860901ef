"""Converters of released checkpoints: the three families' official files (`from_official`) and the
bottom-up-attention detectors (`vlkit.convert.detector`).

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

from vlkit.convert.official import (FAMILIES, MODEL, PRETRAINING, ConversionError, OfficialConverter, OfficialReport,
                                    detect_family, read_official)


def converter(family: str) -> OfficialConverter:
    """The official-checkpoint converter of ``family`` (``vilbert``, ``uniter`` or ``meter``)."""
    if family == "vilbert":
        from vlkit.convert.vilbert import ViLBERTConverter

        return ViLBERTConverter()
    if family == "uniter":
        from vlkit.convert.uniter import UniterConverter

        return UniterConverter()
    if family == "meter":
        from vlkit.convert.meter import MeterConverter

        return MeterConverter()
    raise ConversionError(f"unknown family {family!r}; official checkpoints of {', '.join(FAMILIES)} convert")


def from_official(family: str, checkpoint: str | os.PathLike | Mapping[str, Any],
                  config: Mapping[str, Any] | str | os.PathLike | None = None, task: str | None = None,
                  options: Mapping[str, Any] | None = None,
                  return_report: bool = False) -> nn.Module | tuple[nn.Module, OfficialReport]:
    """vlkit modules with every weight of a released checkpoint in place (eval mode).

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
    module, report = converter(family).convert(checkpoint, config, task, options)
    return (module, report) if return_report else module


def save_converted(module: nn.Module, report: OfficialReport, directory: str | os.PathLike) -> Path:
    """Write a converted module as a vlkit run directory: ``model/`` (``save_pretrained``), the module's
    weights (``pretraining.safetensors`` or ``task.safetensors``) and ``run.json``, which
    `vlkit.from_pretrained`, ``vlkit finetune init=`` and ``vlkit evaluate checkpoint=`` read."""
    from vlkit.io import atomic_write_text
    from vlkit.models.base import VLModel
    from vlkit.objectives.mix import Pretraining
    from vlkit.train.pipeline import RUN_INFO, save_run

    directory = Path(directory)
    converted = {"source": report.source, "family": report.family, "kind": report.kind,
                 "unused": report.unused, "transformed": report.transformed, "cast": len(report.cast)}
    if isinstance(module, VLModel):  # no heads: the model alone
        module.save_pretrained(directory / "model")
        info = {"kind": "model", "family": module.family, "converted": converted}
        atomic_write_text(directory / RUN_INFO, json.dumps(info, indent=2, sort_keys=True))
        return directory
    if isinstance(module, Pretraining):
        info = {"kind": "pretrain", "family": module.model.family, "objectives": module.mix, "seed": module.seed,
                "data": None, "converted": converted}
    else:
        itm = getattr(module, "itm", None)
        pretraining = {"objectives": {"itm": {}}, "seed": 0} if itm is not None else None  # retrieval's ITM head
        info = {"kind": "finetune", "task": module.name, "family": module.model.family,
                "options": task_options(module), "data": None, "task_cfg": None, "pretraining": pretraining,
                "converted": converted}
    save_run(directory, module, info)
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


__all__ = ["ConversionError", "OfficialReport", "PRETRAINING", "MODEL", "converter", "detect_family", "from_official",
           "read_official", "save_converted", "task_options"]
