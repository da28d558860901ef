"""A comparison's cost plan in FLOPs: each unit's training FLOPs per step counted on its own model, objective mix
or task at its batch and sequence shapes (`vlkit.compare.flops`: on the meta device, seconds for a base-size
comparison, no data read), its steps, and the hours they take on a device at an MFU
(`vlkit.compare.devices`): hours = FLOPs / (peak x MFU).

``compare.plan`` (conf/compare.yaml) sets the device, the MFU, the precision and the shapes; the report uses the
same plan to price the seeds a claim still needs (`vlkit.compare.report`).
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from vlkit.compare.devices import DEVICES, PRECISIONS, TRAINER_PRECISION, Device, cpu_device, gpu_device
from vlkit.compare.flops import StepShapes


@dataclass
class UnitPlan:
    unit: Any
    key: str
    steps: int
    flops_per_step: float
    shapes: StepShapes
    precision: str
    devices: int  # devices the unit holds (GPUs x nodes; a CPU unit: 1)
    hours: float = 0.0  # device-hours at the plan's MFU

    @property
    def flops(self) -> float:
        return self.flops_per_step * self.steps

    @property
    def wall_hours(self) -> float:
        return self.hours / self.devices


@dataclass
class Plan:
    units: list[UnitPlan]
    device: Device
    mfu: float
    mfu_source: str

    @property
    def hours(self) -> float:
        return sum(u.hours for u in self.units)

    @property
    def flops(self) -> float:
        return sum(u.flops for u in self.units)

    def by_key(self) -> dict[str, UnitPlan]:
        return {u.key: u for u in self.units}


def plan_settings(compare: dict[str, Any]) -> dict[str, Any]:
    """``compare.plan`` with its defaults, checked before any work (an unknown device or key names itself)."""
    settings = {"method": "flops", "device": None, "mfu": None, "precision": None, "text_len": None, "regions": None,
                **(compare.get("plan") or {})}
    unknown = set(settings) - {"method", "device", "mfu", "precision", "text_len", "regions"}
    if unknown:
        raise KeyError(f"compare.plan: unknown key(s) {sorted(unknown)}; keys: device, mfu, precision, text_len, "
                       "regions, method")
    if settings["method"] not in ("flops", "probe"):
        raise ValueError(f"compare.plan.method={settings['method']!r}: flops or probe")
    if settings["device"] is not None and settings["device"] not in (*DEVICES, "cpu"):
        raise ValueError(f"compare.plan.device={settings['device']!r}: one of {', '.join([*DEVICES, 'cpu'])}")
    mfu = settings["mfu"]
    if mfu is not None and not (isinstance(mfu, (int, float)) and 0 < mfu <= 1):
        raise ValueError(f"compare.plan.mfu={mfu!r}: a fraction in (0, 1], e.g. 0.3")
    if settings["precision"] is not None and settings["precision"] not in PRECISIONS:
        raise ValueError(f"compare.plan.precision={settings['precision']!r}: one of {', '.join(PRECISIONS)}")
    lengths = settings["text_len"] if isinstance(settings["text_len"], dict) else {"": settings["text_len"]}
    for key, value in [*((f"text_len.{k}" if k else "text_len", v) for k, v in lengths.items()),
                       ("regions", settings["regions"])]:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"compare.plan.{key}={value!r}: a positive whole number (text_len: or a mapping of "
                             "pretrain and task names to one)")
    return settings


def plan_device(settings: dict[str, Any], gpus_per_unit: int, threads: int, precisions: tuple[str, ...]) -> Device:
    """The plan's device: ``compare.plan.device``; unset, this machine's CPU when units take no GPU, else the
    visible GPU when the table knows it, else the A100."""
    name = settings["device"]
    if name is None:
        name = "cpu"
        if gpus_per_unit:
            import torch

            visible = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
            name = gpu_device(visible) or "a100"
    return cpu_device(threads, precisions) if name == "cpu" else DEVICES[name]


def unit_shapes(comparison: Any, unit: Any, settings: dict[str, Any], model: Any) -> StepShapes:
    """A unit's step shapes: its trainer's global batch (``batching: units``: the examples its input units hold)
    times its gradient accumulation (an optimizer step's examples),
    ``compare.plan.text_len`` (a number, or one per ``pretrain`` and task name; else the task's or the data's
    ``max_len``: batches pad to their longest, so this is their ceiling) and ``compare.plan.regions`` (else
    ``data.image.num_bb``, else ``max_bb``)."""
    from vlkit.compare.config import run_data

    spec = comparison.specs[unit.run]
    data = run_data(comparison.cfg["data"], spec)
    task = None if unit.is_pretrain else comparison.task_cfg(unit.task, spec)
    text_len = settings["text_len"]
    if isinstance(text_len, dict):
        text_len = text_len.get("pretrain" if unit.is_pretrain else unit.task)
    text_len = text_len or int((task or {}).get("max_len") or data.get("max_len") or 40)
    image = data.get("image") or {}
    regions = settings["regions"] or int(image.get("num_bb") or image.get("max_bb") or 36)
    trainer = comparison.unit_trainer(unit)
    batch = int(trainer.get("batch_size") or 32)
    if trainer.get("batching") == "units":
        image_tokens = regions if model.image_input == "regions" else (model.image_size // model.patch_size) ** 2 + 1
        batch = max(1, int(trainer.get("max_units") or 10240) // (text_len + image_tokens))
    return StepShapes(batch * int(trainer.get("grad_accum") or 1), text_len, regions)


def make_plan(comparison: Any, settings: dict[str, Any], gpus_per_unit: int = 0, threads: int = 1,
              slurm_nodes: int = 1, counted: dict[str, float] | None = None) -> Plan:
    """Every unit of ``comparison`` with its FLOPs per step, steps and device-hours. Each distinct model, mix or
    task at each shape is counted once (``counted``: what earlier plans counted, by the sha256 of what was counted;
    the counts are added to it); models are built on the meta device."""
    from vlkit.compare.config import objective_mix, run_data
    from vlkit.compare.flops import finetune_step_flops, on_meta, plan_sizes, pretrain_step_flops
    from vlkit.models.base import build_model, split_model_config
    from vlkit.objectives.mix import build_pretraining
    from vlkit.registry import MODELS, TASKS
    from vlkit.tasks import build_task

    units = comparison.all_units()
    models: dict[str, Any] = {}
    counted = {} if counted is None else counted
    rows: list[UnitPlan] = []
    for unit in units:
        spec = comparison.specs[unit.run]
        data = run_data(comparison.cfg["data"], spec)
        model_key = json.dumps([spec.model, data], sort_keys=True, default=str)
        if model_key not in models:
            name, preset, overrides = split_model_config(spec.model)
            cls = MODELS.get(name)
            config = cls.config_class.from_preset(preset, **overrides)
            sizes = plan_sizes(cls, overrides, data, config)
            models[model_key] = on_meta(lambda: build_model({**spec.model, **sizes}))
        model = models[model_key]
        shapes = unit_shapes(comparison, unit, settings, model)
        mix = objective_mix(spec)
        task_cfg = None if unit.is_pretrain else comparison.task_cfg(unit.task, spec)
        from_mix = unit.is_pretrain or (unit.variant == "pretrained" and TASKS.get(unit.task).from_pretraining)
        kind = hashlib.sha256(json.dumps([model_key, mix if from_mix else None, task_cfg, shapes.__dict__],
                                         sort_keys=True, default=str).encode()).hexdigest()
        if kind not in counted:
            model = copy.deepcopy(models[model_key])  # a task may change its model (NLVR2's image token types)
            pretraining = on_meta(lambda: build_pretraining(model, mix)) if mix is not None else None
            if unit.is_pretrain:
                counted[kind] = pretrain_step_flops(pretraining, shapes)["per_step"]
            else:
                cls = TASKS.get(unit.task)
                source = pretraining if from_mix else model
                options = {**cls.plan_options(task_cfg), **(task_cfg.get("options") or {})}
                task = on_meta(lambda: build_task(unit.task, source, **options))
                counted[kind] = finetune_step_flops(task, shapes)
        trainer = comparison.unit_trainer(unit)
        precision = settings["precision"] or TRAINER_PRECISION.get(str(trainer.get("mixed_precision") or "no"), "fp32")
        devices = max(1, gpus_per_unit) * slurm_nodes if gpus_per_unit else 1
        rows.append(UnitPlan(unit, comparison.key(unit), comparison.unit_steps(unit), counted[kind], shapes, precision,
                             devices))
    device = plan_device(settings, gpus_per_unit, threads, tuple(dict.fromkeys(r.precision for r in rows)))
    mfu = float(settings["mfu"] or device.mfu)
    source = "compare.plan.mfu" if settings["mfu"] else device.mfu_source
    for row in rows:
        row.hours = row.flops / (device.peak(row.precision) * mfu) / 3600
    return Plan(rows, device, mfu, source)


def seed_costs(comparison: Any, made: Plan | None = None) -> dict[str, Any]:
    """What one more seed of each run costs on the plan's device (``compare.plan``): device-hours per run, the mean
    over its seeds of its units' hours; with the device and MFU they assume. ``made``: a plan of the comparison
    already made, used when it is on that device."""
    from vlkit.compare.config import unit_threads
    from vlkit.compare.executor_base import unit_nodes

    compare = comparison.compare
    gpus = int(compare.get("gpus_per_unit") or 0)
    settings = plan_settings(compare)
    wanted = settings["device"] or ("cpu" if not gpus else None)
    plan = made if made is not None and wanted == made.device.name else \
        make_plan(comparison, settings, gpus, unit_threads(comparison.cfg),
                  unit_nodes(compare))
    hours: dict[str, dict[int, float]] = {}
    for row in plan.units:
        per_seed = hours.setdefault(comparison.specs[row.unit.run].name, {})
        per_seed[row.unit.seed] = per_seed.get(row.unit.seed, 0.0) + row.hours
    return {"device": plan.device.name, "mfu": plan.mfu, "mfu_source": plan.mfu_source,
            "seed_hours": {run: sum(v.values()) / len(v) for run, v in hours.items()}}


__all__ = ["Plan", "UnitPlan", "make_plan", "plan_device", "plan_settings", "seed_costs", "unit_shapes"]
