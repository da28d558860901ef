"""What a comparison's units cost, in FLOPs and device-hours: each unit's training FLOPs per step counted on its
own model, objective mix or task at its batch and sequence shapes (`vlkit.flops.count`: on the meta device, seconds for a base-size
comparison, no data read), its steps, and the hours they take on a device at an MFU
(`vlkit.flops.devices`): hours = FLOPs / (peak x MFU).

``compare.plan`` (conf/compare.yaml) sets the device, the MFU, the precision and the shapes; the report uses the
same costs to price the seeds a claim still needs (`vlkit.compare.report`).
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

from torch import nn

from vlkit.compare.config import objective_mix, run_data, unit_threads
from vlkit.compare.executor_base import unit_nodes
from vlkit.data import tokenizers
from vlkit.environment import data_sizes
from vlkit.features.store import FeatureStore
from vlkit.flops.buckets import Spread, stated_buckets
from vlkit.flops.count import StepShapes, finetune_step_flops, on_meta, pretrain_step_flops
from vlkit.flops.devices import DEVICES, PRECISIONS, TRAINER_PRECISION, Device, choose_device, cpu_device
from vlkit.models.base import build_model, split_model_config
from vlkit.objectives.mix import build_pretraining
from vlkit.registry import MODELS, TASKS, did_you_mean
from vlkit.tasks import build_task


@dataclass
class UnitCost:
    unit: Any
    key: str
    steps: int
    flops_per_step: float
    shapes: StepShapes
    precision: str
    devices: int  # devices the unit holds (GPUs x nodes; a CPU unit: 1)
    hours: float = 0.0  # device-hours at the MFU priced at

    @property
    def flops(self) -> float:
        return self.flops_per_step * self.steps

    @property
    def wall_hours(self) -> float:
        return self.hours / self.devices


@dataclass
class Costs:
    units: list[UnitCost]
    device: Device
    mfu: float
    mfu_source: str

    @property
    def hours(self) -> float:
        return sum(u.hours for u in self.units)

    @property
    def flops(self) -> float:
        return sum(u.flops for u in self.units)

    def by_key(self) -> dict[str, UnitCost]:
        return {u.key: u for u in self.units}


PLAN_KEYS = ("method", "device", "mfu", "precision", "text_len", "regions", "lengths")  # compare.plan's
SPREAD = ("mean", "sd", "min", "max")  # a stated length: compare.plan.lengths.<data>.text / .regions


def cost_settings(compare: dict[str, Any]) -> dict[str, Any]:
    """``compare.plan`` with its defaults, checked before any work (an unknown device, key or task names itself)."""
    settings = {**dict.fromkeys(PLAN_KEYS), "method": "flops", **(compare.get("plan") or {})}
    unknown = set(settings) - set(PLAN_KEYS)
    if unknown:
        raise KeyError(f"compare.plan: unknown key(s) {sorted(unknown)}; keys: {', '.join(PLAN_KEYS)}")
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
    for name in lengths:
        if name and name != "pretrain" and name not in TASKS.names():
            close = did_you_mean(name, ["pretrain", *TASKS.names()])
            raise KeyError(f"compare.plan.text_len.{name}: no task {name!r}{close}; keys: pretrain or a task "
                           f"({', '.join(TASKS.names())})")
    settings["lengths"] = _stated_lengths(settings["lengths"])
    return settings


def _stated_lengths(lengths: Any) -> dict[str, tuple[float, Spread, Spread]]:
    """``compare.plan.lengths`` checked: per data set its ``share`` of the steps and its ``text`` and ``regions``
    lengths, each ``[mean, sd, min, max]`` (`vlkit.flops.buckets.Spread`)."""
    out: dict[str, tuple[float, Spread, Spread]] = {}
    for name, entry in (lengths or {}).items():
        key = f"compare.plan.lengths.{name}"
        if not isinstance(entry, dict) or set(entry) != {"share", "text", "regions"}:
            raise ValueError(f"{key}={entry!r}: a mapping of share (of the steps), text and regions, each of these "
                             f"two [{', '.join(SPREAD)}] (tokens with [CLS] / [SEP]; regions or patches)")
        share = entry["share"]
        if not isinstance(share, (int, float)) or isinstance(share, bool) or share <= 0:
            raise ValueError(f"{key}.share={share!r}: a positive number (the data set's weight among the steps)")
        spreads = []
        for part in ("text", "regions"):
            value = list(entry[part]) if isinstance(entry[part], (list, tuple)) else None
            if value is None or len(value) != 4 or not all(isinstance(v, (int, float)) for v in value) \
                    or not 1 <= value[2] <= value[0] <= value[3] or value[1] < 0:
                raise ValueError(f"{key}.{part}={entry[part]!r}: [{', '.join(SPREAD)}] with 1 <= min <= mean <= max "
                                 "and sd >= 0")
            spreads.append(Spread(float(value[0]), float(value[1]), int(value[2]), int(value[3])))
        out[str(name)] = (float(share), *spreads)
    return out


def cost_device(settings: dict[str, Any], gpus_per_unit: int, threads: int, precisions: tuple[str, ...]) -> Device:
    """The device priced on (`vlkit.flops.devices.choose_device`); this machine's CPU measured on ``threads``."""
    name = choose_device(settings["device"], gpus_per_unit)
    return cpu_device(threads, precisions) if name == "cpu" else DEVICES[name]


def text_positions(model: Any) -> int | None:
    """The most text tokens ``model`` takes: its text position embeddings (RoBERTa's start after its padding id);
    None when it has none."""
    words = model.get_input_embeddings()
    for module in model.modules():
        positions = getattr(module, "position_embeddings", None)
        if getattr(module, "word_embeddings", None) is words and isinstance(positions, nn.Embedding):
            pad = positions.padding_idx
            return positions.num_embeddings - (pad + 1 if pad is not None else 0)
    return None


def bucket_shapes(settings: dict[str, Any], trainer: dict[str, Any], devices: int) -> StepShapes:
    """A ``batching: units`` step from ``compare.plan.lengths``: the official token-bucket sampler simulated per
    data set (`vlkit.flops.buckets.stated_buckets`, each device filling its own ``max_units``), the data sets
    weighted by their share of the steps; tokens per example are the padded ones a batch feeds the model."""
    max_units = int(trainer.get("max_units") or 10240)
    bucket, multiple = int(trainer.get("bucket_size") or 8192), int(trainer.get("size_multiple") or 8)
    steps = [(share, stated_buckets(text, regions, max_units, bucket, multiple))
             for share, text, regions in settings["lengths"].values()]
    total = sum(share for share, _ in steps)
    examples = sum(share * s.examples for share, s in steps) / total
    text_len = sum(share * s.examples * s.text_len for share, s in steps) / (examples * total)
    units = sum(share * s.examples * s.units for share, s in steps) / (examples * total)
    return StepShapes(round(examples * devices * int(trainer.get("grad_accum") or 1)), round(text_len),
                      max(1, round(units - text_len)))


def unit_shapes(comparison: Any, unit: Any, settings: dict[str, Any], model: Any, devices: int = 1,
                task_cfg: dict[str, Any] | None = None) -> StepShapes:
    """A unit's step shapes: its trainer's global batch times its gradient accumulation (an optimizer step's
    examples), ``compare.plan.text_len`` (a number, or one per ``pretrain`` and task name; else the task's or the
    data's ``max_len``: batches pad to their longest, so this is their ceiling) and ``compare.plan.regions`` (else
    ``data.image.num_bb``, else ``max_bb``). ``batching: units`` (UNITER's token buckets, ``max_units`` per device
    on each of ``devices``): from ``compare.plan.lengths`` when set (`bucket_shapes`), else full batches at those
    shapes. A text longer than the model's positions, or more regions than the data's ``max_bb``, is refused.
    ``task_cfg``: the fine-tuning's task config when already read."""
    spec = comparison.specs[unit.run]
    data = run_data(comparison.cfg["data"], spec)
    task = None if unit.is_pretrain else task_cfg or comparison.task_cfg(unit.task, spec)
    text_len = settings["text_len"]
    if isinstance(text_len, dict):
        text_len = text_len.get("pretrain" if unit.is_pretrain else unit.task)
    text_len = text_len or int((task or {}).get("max_len") or data.get("max_len") or 40)
    image = data.get("image") or {}
    regions = settings["regions"] or int(image.get("num_bb") or image.get("max_bb") or 36)
    trainer = comparison.unit_trainer(unit)
    if trainer.get("batching") == "units" and settings["lengths"]:
        shapes = bucket_shapes(settings, trainer, devices)
        _check_fits(spec, model, image, shapes.text_len, shapes.regions)
        return shapes
    _check_fits(spec, model, image, text_len, regions)
    batch = int(trainer.get("batch_size") or 32)
    if trainer.get("batching") == "units":
        image_tokens = regions if model.image_input == "regions" else (model.image_size // model.patch_size) ** 2 + 1
        batch = devices * max(1, int(trainer.get("max_units") or 10240) // (text_len + image_tokens))
    return StepShapes(batch * int(trainer.get("grad_accum") or 1), text_len, regions)


def _check_fits(spec: Any, model: Any, image: dict[str, Any], text_len: int, regions: int) -> None:
    """Refuse shapes the run's model or data cannot hold, naming the key and the limit."""
    positions = text_positions(model)
    if positions is not None and text_len > positions:
        raise ValueError(f"compare.plan.text_len={text_len} for run {spec.name!r}: its model takes at most {positions} "
                         "text tokens (its position embeddings); set compare.plan.text_len (or the data's max_len) "
                         "within it")
    max_bb = image.get("max_bb")
    if model.image_input == "regions" and max_bb and regions > int(max_bb):
        raise ValueError(f"compare.plan.regions={regions} for run {spec.name!r}: its data hold at most "
                         f"data.image.max_bb={max_bb} regions an image; set compare.plan.regions within it")


def _count_unit(comparison: Any, unit: Any, settings: dict[str, Any], models: dict[Any, Any],
                counted: dict[str, float], devices: int) -> tuple[str, StepShapes, str]:
    """``unit``'s kind (the sha256 of what its count depends on), shapes and precision; its FLOPs per step counted
    into ``counted`` unless a unit of its kind was; ``models``: what is read once per comparison (each distinct
    model, built on the meta device, and each run's mix and task configs)."""
    spec = comparison.specs[unit.run]
    data = run_data(comparison.cfg["data"], spec)
    model_key = json.dumps([spec.model, data], sort_keys=True, default=str)
    if model_key not in models:
        name, preset, overrides = split_model_config(spec.model)
        cls = MODELS.get(name)
        sizes = model_sizes(cls, overrides, data, cls.config_class.from_preset(preset, **overrides))
        models[model_key] = on_meta(lambda: build_model({**spec.model, **sizes}))
    if ("mix", unit.run) not in models:
        models["mix", unit.run] = objective_mix(spec)
    mix = models["mix", unit.run]
    task_cfg = None
    if not unit.is_pretrain:
        if ("task", unit.run, unit.task) not in models:
            models["task", unit.run, unit.task] = comparison.task_cfg(unit.task, spec)
        task_cfg = models["task", unit.run, unit.task]
    shapes = unit_shapes(comparison, unit, settings, models[model_key], devices, task_cfg)
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
    return kind, shapes, precision


def count_costs(comparison: Any, settings: dict[str, Any], gpus_per_unit: int = 0, threads: int = 1,
              slurm_nodes: int = 1, counted: dict[str, float] | None = None) -> Costs:
    """Every unit of ``comparison`` with its FLOPs per step, steps and device-hours. Each distinct model, mix or
    task at each shape is counted once (``counted``: what earlier counts counted, by the sha256 of what was counted;
    the counts are added to it); models are built on the meta device."""
    models: dict[Any, Any] = {}
    counted = {} if counted is None else counted
    devices = max(1, gpus_per_unit) * slurm_nodes if gpus_per_unit else 1
    seen: dict[tuple[Any, ...], tuple[str, StepShapes, str]] = {}  # a unit's count is its seed-mates'
    rows: list[UnitCost] = []
    for unit in comparison.all_units():
        same = (unit.run, unit.is_pretrain, unit.task, unit.variant)
        if same not in seen:
            seen[same] = _count_unit(comparison, unit, settings, models, counted, devices)
        kind, shapes, precision = seen[same]
        rows.append(UnitCost(unit, comparison.key(unit), comparison.unit_steps(unit), counted[kind], shapes, precision,
                             devices))
    device = cost_device(settings, gpus_per_unit, threads, tuple(dict.fromkeys(r.precision for r in rows)))
    mfu = float(settings["mfu"] or device.mfu)
    source = "compare.plan.mfu" if settings["mfu"] else device.mfu_source
    for row in rows:
        row.hours = row.flops / (device.peak(row.precision) * mfu) / 3600
    return Costs(rows, device, mfu, source)


def model_sizes(cls: Any, overrides: Mapping[str, Any], data: Mapping[str, Any], config: Any) -> dict[str, Any]:
    """The model sizes the data decides (`vlkit.environment.data_sizes`), read without the data: the
    vocabulary of a tokenizer on this machine (``shapes``, a folder, the local hub cache; else the family's
    preset keeps its own), the feature size and classes of the shapes world's detector or of a feature store's
    header (else the preset's)."""
    name = str(data.get("tokenizer") or tokenizers.family_tokenizer(cls, config))
    local = tokenizers.on_this_machine(name)
    vocab = range(_vocabulary(name)) if local else ()
    store = _store_header(data) if cls.image_input == "regions" else None
    sizes = data_sizes(cls, overrides, vocab, SimpleNamespace(store=store))
    if not local:  # the preset keeps its own vocabulary
        sizes.pop(cls.data_fields(overrides).get("vocab_size"), None)
    return sizes


@functools.lru_cache(maxsize=None)
def _vocabulary(name: str) -> int:
    """The size of tokenizer ``name``'s vocabulary (read once per process)."""
    return len(tokenizers.build_tokenizer(name))


def _store_header(data: Mapping[str, Any]) -> Any:
    """``feature_dim`` / ``num_classes`` of the run's region features: the shapes detector's, a store's on disk, or
    None."""
    image = data.get("image") or {}
    if data.get("name") == "shapes" and image.get("source", "shapes") == "shapes":
        return _shapes_detector()
    path = image.get("path")
    if path and Path(path).is_file():
        with FeatureStore(path) as store:
            return SimpleNamespace(feature_dim=store.feature_dim, num_classes=store.num_classes)
    return None


@functools.lru_cache(maxsize=None)
def _shapes_detector() -> Any:
    """The shapes world's detector's ``feature_dim`` / ``num_classes`` (read once per process)."""
    from vlkit.features.detector.weights import shapes_detector_config

    cfg = shapes_detector_config()
    return SimpleNamespace(feature_dim=cfg.feature_dim, num_classes=cfg.num_classes)


def seed_costs(comparison: Any, made: Costs | None = None) -> dict[str, Any]:
    """What one more seed of each run costs on the priced device (``compare.plan``): device-hours per run, the mean
    over its seeds of its units' hours; with the device and MFU they assume. ``made``: the comparison's costs
    already counted, used when they are on that device."""
    compare = comparison.compare
    gpus = int(compare.get("gpus_per_unit") or 0)
    settings = cost_settings(compare)
    wanted = choose_device(settings["device"], gpus)
    costs = made if made is not None and wanted == made.device.name else \
        count_costs(comparison, settings, gpus, unit_threads(comparison.cfg),
                  unit_nodes(compare))
    return {"device": costs.device.name, "mfu": costs.mfu, "mfu_source": costs.mfu_source,
            "seed_hours": seed_hours(comparison, [(row.unit, row.hours) for row in costs.units])}


def seed_hours(comparison: Any, priced: list[tuple[Any, float]]) -> dict[str, float]:
    """Run name -> the device-hours of one seed of it: the mean over its seeds of the sum of its units' hours
    (``priced``: (unit, hours) pairs)."""
    hours: dict[str, dict[int, float]] = {}
    for unit, unit_hours in priced:
        per_seed = hours.setdefault(comparison.specs[unit.run].name, {})
        per_seed[unit.seed] = per_seed.get(unit.seed, 0.0) + unit_hours
    return {run: sum(v.values()) / len(v) for run, v in hours.items()}


__all__ = ["Costs", "UnitCost", "bucket_shapes", "cost_device", "cost_settings", "count_costs", "model_sizes",
           "seed_costs", "seed_hours", "text_positions", "unit_shapes"]
