"""``vlkit compare ... dry_run=true``: every unit with its dependency and resources, and what the comparison
will cost, before anything is spent: by default from each unit's training FLOPs counted on its model at its
shapes (`vlkit.compare.costs`, no data read), or with ``compare.plan.method=probe`` from a short probe measured on
this machine (a few training steps of each distinct model and objective mix, and of each distinct model and task)."""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from vlkit.compare.config import objective_mix
from vlkit.compare.costs import cost_settings, count_costs, seed_costs, seed_hours
from vlkit.compare.executor_base import executors, unit_nodes
from vlkit.compare.looks import looks_plan
from vlkit.compare.report import figure, markdown_table
from vlkit.compare.unit_work import UnitWork
from vlkit.runtime import GEMM_PROBE, gemm_gflops
from vlkit.train import pipeline

PROBE_STEPS = 30  # timed steps per probe (compare.probe.steps)
WARMUP_STEPS = 20  # untimed steps before them (compare.probe.warmup_steps): a run's first steps are slower, as its
# first epoch builds each example and each new shape its kernels (benchmarks/probe_accuracy.py)


def probe(comparison: Any, steps: int = PROBE_STEPS, batch_size: int | None = None,
          finetune_batch_size: int | None = None, warmup_steps: int = WARMUP_STEPS) -> dict[str, float]:
    """Seconds per training step of each distinct (model, mix) pre-training and (model, task) fine-tuning:
    the median of the trainer's ``step_s`` over ``steps`` steps after ``warmup_steps`` untimed ones (set-up and
    end-of-run costs are not steps; the median shrugs off a step that another process slowed).
    Each distinct model is built once and trained on by every probe of it (timing only), one model at a time
    (three base-size models and their optimizer states together outgrow a 24 GB machine). ``batch_size``:
    probe at that batch and scale the time linearly to the unit's own batch (a base-size model on a CPU);
    ``finetune_batch_size``: the same for the fine-tunings (None: their own batch), as a fine-tuning example can hold
    several images or captions (METER-base retrieval: an image and 16 captions, 14.5 GB at batch 2). Without a GPU the
    probe trains in fp32 (`probe_precision`)."""
    import gc
    import json

    precision, work = probe_precision(), UnitWork(comparison)

    kinds: dict[str, Any] = {}  # a fine-tuning costs the same from either variant: probed once
    for unit in comparison.all_units():
        kinds.setdefault(probe_kind(comparison, unit), unit)
    for unit in kinds.values():  # every task's data first: a bad task file fails before a probe trains
        if not unit.is_pretrain:
            spec = comparison.specs[unit.run]
            work.task_data(comparison.environment(spec), comparison.task_cfg(unit.task, spec))
    by_model: dict[str, dict[str, Any]] = {}  # the kinds of each distinct model, in the order first seen
    for kind, unit in kinds.items():
        by_model.setdefault(json.dumps(comparison.specs[unit.run].model, sort_keys=True), {})[kind] = unit
    seconds: dict[str, float] = {}
    for group in by_model.values():
        model = None
        gc.collect()  # the last model's probes are done: free it before building the next
        model = pipeline.build_run_model(comparison.environment(comparison.specs[next(iter(group.values())).run]))
        for kind, unit in group.items():
            batch = batch_size if unit.is_pretrain else finetune_batch_size
            times = step_times(work, unit, model, warmup_steps + steps, batch, precision)
            seconds[kind] = statistics.median(times[warmup_steps:])
    return seconds


def step_times(work: Any, unit: Any, model: Any, steps: int, batch_size: int | None = None,
               precision: dict[str, str] | None = None) -> list[float]:
    """Wall seconds of each of ``steps`` training steps of ``unit``'s kind on ``model`` (the trainer's ``step_s``;
    ``work``: the comparison's `vlkit.compare.unit_work.UnitWork`, which holds its task data),
    at ``batch_size`` (None: the unit's own) scaled linearly to the unit's batch, in a temporary folder."""
    comparison = work.comparison
    spec = comparison.specs[unit.run]
    env = comparison.environment(spec)
    own = comparison.unit_trainer(unit, steps)
    scale = own["batch_size"] / batch_size if batch_size else 1.0
    trainer = {**own, "save_every": 0, **({"batch_size": batch_size} if batch_size else {}), **(precision or {})}
    with tempfile.TemporaryDirectory(prefix="vlkit-probe-") as tmp:
        if unit.is_pretrain:
            _, result = pipeline.pretrain_model(env, model, objective_mix(spec), trainer, Path(tmp), unit.seed)
        else:
            task_cfg = comparison.task_cfg(unit.task, spec)
            result = pipeline.finetune_task(env, model, task_cfg, trainer, Path(tmp), unit.seed, (),
                                            data=work.task_data(env, task_cfg))[2]
    return [scale * r["step_s"] for r in result.history]


def probe_precision() -> dict[str, str]:
    """The trainer override of a probe: none on a GPU; on a CPU, fp32. A unit's bf16 is meant for its GPUs, and
    on a CPU without native bf16 (`vlkit.runtime.native_cpu_bf16`) it would make a probe of a bf16 preset take
    hours."""
    import torch

    return {} if torch.cuda.is_available() else {"mixed_precision": "no"}


def probe_kind(comparison: Any, unit: Any) -> str:
    spec = comparison.specs[unit.run]
    model = spec.model.get("preset") and f"{spec.family}_{spec.model['preset']}" or spec.family
    return f"{model} {spec.objectives}" if unit.is_pretrain else f"{model} {unit.task}"


def simulate(durations: dict[str, float], depends: dict[str, str | None], order: list[str], slots: int) -> float:
    """Wall seconds of running ``order`` on ``slots`` side by side, each unit as soon as a slot is free and
    the unit it depends on has ended (the scheduler `vlkit.compare.scheduler.drive`)."""
    free = [0.0] * max(1, slots)
    end: dict[str, float] = {}
    for key in order:
        slot = min(range(len(free)), key=free.__getitem__)
        start = max(free[slot], end.get(depends.get(key) or "", 0.0))
        end[key] = free[slot] = start + durations[key]
    return max(end.values(), default=0.0)


def dry_run(comparison: Any, settings: Any) -> str:
    """The plan as text: one line per unit, then the total and the wall time per executor."""
    costs = cost_settings(comparison.compare)
    if costs["method"] == "flops":
        return flops_estimate(comparison, settings, costs)
    return probe_estimate(comparison, settings)


def executor_lines(settings: Any, wall_hours: Any) -> list[str]:
    """Each registered executor's line (`vlkit.compare.executor_base.Executor.estimate_line`); ``wall_hours(n)``: the
    plan's wall time with ``n`` units at once, as text."""
    return [cls.estimate_line(settings, wall_hours) for cls in executors().values()]


def flops_estimate(comparison: Any, settings: Any, plan_cfg: dict[str, Any]) -> str:
    """The FLOP estimate as text: per unit its FLOPs per step, steps, device-hours and wall; the total FLOPs and
    GPU-hours, and the wall time per executor."""
    nodes = unit_nodes(comparison.compare)
    costs = count_costs(comparison, plan_cfg, settings.gpus_per_unit, settings.threads, nodes)
    units = [row.unit for row in costs.units]
    rows, depends, durations = [], {}, {}
    for row in costs.units:
        parent = row.unit.depends_on()
        depends[row.key] = comparison.key(parent) if parent else None
        durations[row.key] = row.wall_hours * 3600
        rows.append([row.key, depends[row.key] or "–", f"{row.steps:,}", figure(row.flops_per_step / 1e9),
                     figure(row.flops / 1e15), figure(row.hours), f"{row.devices}", figure(row.wall_hours)])
    device = costs.device
    kind = "GPU" if device.name != "cpu" else "CPU"
    peaks = ", ".join(f"{p} {figure(device.peaks[p])}" for p in dict.fromkeys(r.precision for r in costs.units))
    shapes = sorted({(r.shapes.batch_size, r.shapes.text_len, r.shapes.regions) for r in costs.units})
    out = [f"vlkit compare dry run: {len(units)} units ({sum(u.is_pretrain for u in units)} pre-trainings) of "
           f"{len(comparison.specs)} run(s) x {len(comparison.compare['seeds'])} seed(s); nothing is run.", "",
           markdown_table(["unit", "after", "steps", "GFLOP/step", "PFLOP", f"{kind}-hours", "devices", "wall h"],
                          rows), "",
           "FLOPs: each unit's training step (forward and backward of every pass of its objective mix or task) "
           "counted by torch.utils.flop_counter on its model built on the meta device, at (batch, tokens, regions) "
           f"{', '.join(map(str, shapes))} (compare.plan.text_len / regions; patches from the model).",
           f"Device: {device.name}, dense peak {peaks} TFLOPS; MFU {costs.mfu:.1%} ({costs.mfu_source}); hours = FLOPs "
           "/ (peak x MFU), training steps only, evaluation not included.",
           f"Total: {figure(costs.flops / 1e15)} PFLOP = {figure(costs.hours)} {kind}-hours"
           + (f" (units of {settings.threads} thread(s))." if device.name == "cpu" else ".")]
    order = [r.key for r in costs.units]
    out += executor_lines(settings, lambda n: figure(simulate(durations, depends, order, n) / 3600))
    out += looks_plan(comparison, costs.hours, seed_costs(comparison, costs))
    return "\n".join(out)


def probe_estimate(comparison: Any, settings: Any) -> str:
    """The measured estimate (``compare.plan.method=probe``) as text: one line per unit, then device-hours and wall
    time per executor."""
    import torch

    units = comparison.all_units()
    threads = torch.get_num_threads()
    gpus = settings.gpus_per_unit
    nodes = unit_nodes(comparison.compare)
    device = f"{gpus} GPU(s)" if gpus else f"{settings.threads} CPU thread(s)"
    settings_probe = comparison.compare.get("probe") or {}
    probe_steps, probe_batch = int(settings_probe.get("steps") or PROBE_STEPS), settings_probe.get("batch_size")
    warmup = int(settings_probe.get("warmup_steps", WARMUP_STEPS))
    finetune_batch = settings_probe.get("finetune_batch_size") or probe_batch
    measured = probe(comparison, probe_steps, probe_batch, finetune_batch, warmup)
    lines, durations, depends = [], {}, {}
    for unit in units:
        key = comparison.key(unit)
        parent = unit.depends_on()
        depends[key] = comparison.key(parent) if parent else None
        steps = comparison.unit_steps(unit)
        durations[key] = steps * measured[probe_kind(comparison, unit)]
        lines.append([key, depends[key] or "–", str(steps), device, f"{durations[key] / 60:.1f}"])
    total = sum(durations.values())
    unit_devices = max(1, gpus) * nodes if gpus else 1
    order = [comparison.key(u) for u in units]
    hours = total * unit_devices / 3600
    kind = "GPU" if gpus and torch.cuda.is_available() else "CPU-thread" if settings.threads == 1 and not gpus \
        else "device"
    what = f"{kind}-hours" + (" (timed on this CPU, not on the GPUs the units ask for)" if kind == "device" else "")
    probes = ", ".join(f"{k} {v:.3f} s/step" for k, v in measured.items())
    out = [f"vlkit compare dry run: {len(units)} units ({sum(u.is_pretrain for u in units)} pre-trainings) of "
           f"{len(comparison.specs)} run(s) x {len(comparison.compare['seeds'])} seed(s); nothing is run.", "",
           markdown_table(["unit", "after", "steps", "resources", "est. min"], lines), "",
           f"Probe on this machine ({_device_name()}, {threads} torch thread(s), median of {probe_steps} "
           f"timed steps after {warmup} untimed" + _batches(probe_batch, finetune_batch)
           + (", in fp32" if probe_precision() else "") + f"): {probes}.",
           f"This machine's speed at the probe: {gemm_gflops():.0f} GFLOPS ({GEMM_PROBE} on {threads} thread(s)); "
           "a comparison records it after each unit, and its times scale about inversely with it.",
           f"Estimated cost: {total / 3600:.2f} h of unit time = {hours:.2f} {what} "
           f"({unit_devices} device(s) per unit; training steps only, evaluations not included)."]
    out += executor_lines(settings, lambda n: f"{simulate(durations, depends, order, n) / 3600:.2f}")
    priced = [(unit, durations[comparison.key(unit)] * unit_devices / 3600) for unit in units]
    out += looks_plan(comparison, hours, {"device": kind, "seed_hours": seed_hours(comparison, priced)})
    return "\n".join(out)


def _batches(pretrain: int | None, finetune: int | None) -> str:
    """The probe's batches in the plan's words."""
    if finetune == pretrain:
        return f" at batch {pretrain}, scaled linearly to each unit's batch" if pretrain else ""
    return (f", pre-trainings at {f'batch {pretrain}' if pretrain else 'their own batch'} and fine-tunings at "
            f"batch {finetune}, scaled linearly to each unit's batch")


def _device_name() -> str:
    import platform

    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else (platform.processor() or platform.machine())
