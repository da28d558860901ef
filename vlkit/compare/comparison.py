"""A comparison as a plan of units: its runs, each run's seeds, and every unit of work (one pre-training, or one
fine-tuning of one variant on one task) with its trainer, folder and identity (the hash of everything that decides
its result). It checks a comparison before any work; the work itself is `vlkit.compare.unit_work`."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from vlkit.compare.config import RunSpec, objective_mix, run_data, run_specs, task_cfg
from vlkit.config import framework_errors
from vlkit.digests import input_digests
from vlkit.flops.count import on_meta
from vlkit.compare.units import Unit, config_hash
from vlkit.environment import Environment, prepare_environment
from vlkit.models.base import build_model, split_model_config
from vlkit.objectives.mix import build_pretraining, check_mix
from vlkit.registry import MODELS, TASKS
from vlkit.tasks.base import IncompatibleTask, task_source
from vlkit.train.trainer import TrainerConfig


class Comparison:
    """The units of a resolved comparison config, in ``output_dir``: every run is pre-trained on the same examples
    in the same order with the same seeds and step budget, then fine-tuned and evaluated on the same tasks, next to
    a no-pre-training baseline of the same model. Every unit seeds itself and a fine-tuning starts from the
    pre-training saved on disk, so results do not depend on where or in which order units run
    (`vlkit.compare.scheduler`). Each run's data (`environment`) is prepared once per process."""

    def __init__(self, cfg: dict[str, Any], output_dir: Path, progress: bool = True):
        self.cfg = cfg
        self.compare = cfg["compare"]
        self.output_dir = Path(output_dir)
        self.progress = progress
        self.specs = run_specs(self.compare)
        self._environments: dict[str, Environment] = {}
        self._hashes: dict[Unit, str] = {}
        self.run_seeds: dict[int, list[int]] = {}  # compare.until=decided: a run's seeds at the current look

    # -- seeds -------------------------------------------------------------------------------------
    def seeds_of(self, index: int) -> list[int]:
        """Run ``index``'s seeds: ``compare.seeds``, more once ``compare.until=decided`` added some (`add_seeds`)."""
        return self.run_seeds.get(index, list(self.compare["seeds"]))

    def candidate_seeds(self) -> list[int]:
        """Every seed a run may get: ``compare.seeds``, then with ``compare.until=decided`` the next integers up to
        ``compare.max_seeds`` seeds in all."""
        seeds = list(self.compare["seeds"])
        if self.compare.get("until") == "decided":
            start = max(seeds) + 1
            seeds += list(range(start, start + int(self.compare["max_seeds"]) - len(seeds)))
        return seeds

    def all_seeds(self) -> list[int]:
        """The seeds some run has now, in `candidate_seeds` order."""
        have = {seed for i in range(len(self.specs)) for seed in self.seeds_of(i)}
        return [seed for seed in self.candidate_seeds() if seed in have]

    def add_seeds(self, runs: set[int], count: int) -> bool:
        """Give each run of ``runs`` the first ``count`` candidate seeds (a next look); False when none gained any."""
        grown = False
        for i in runs:
            seeds = self.candidate_seeds()[:count]
            grown |= len(seeds) > len(self.seeds_of(i))
            self.run_seeds[i] = seeds
        return grown

    # -- helpers ---------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        if self.progress:
            print(f"[compare {time.strftime('%H:%M:%S')}] {message}", flush=True)

    def environment(self, spec: RunSpec) -> Environment:
        data = run_data(self.cfg["data"], spec)
        key = MODELS.get(spec.family).image_input + json.dumps([spec.model, data], sort_keys=True)
        if key not in self._environments:
            self._environments[key] = prepare_environment(spec.model, data, self.cfg.get("cache_dir"),
                                                          progress=self.progress)
        return self._environments[key]

    def trainer_cfg(self, stage: str, steps: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """A unit's trainer: the comparison's, checkpointed every ``compare.checkpoint_every`` steps so that
        a killed unit resumes where it was (``resume`` always on: a fresh folder starts at step 0)."""
        base = dict(self.compare["trainer"]["common"])
        base.update(self.compare["trainer"].get(stage) or {})
        base.update(extra or {})
        base.update(max_steps=steps, progress=False, save_every=int(self.compare.get("checkpoint_every") or 0),
                    keep_checkpoints=1, resume=True, log_every=1)
        if int(self.compare.get("gpus_per_unit") or 0) > 0:
            base["cpu"] = False
        return base

    def unit_trainer(self, unit: Unit, steps: int | None = None) -> dict[str, Any]:
        """A unit's trainer (`trainer_cfg`) at ``steps`` (None: its budget). Overrides apply in this order:
        ``compare.trainer.tasks.<task>``, the run's ``finetune_trainer``, then its ``finetune_trainer.tasks.<task>``;
        a pre-training takes the run's ``trainer``."""
        spec = self.specs[unit.run]
        steps = self.unit_steps(unit) if steps is None else steps
        if unit.is_pretrain:
            return self.trainer_cfg("pretrain", steps, spec.trainer)
        own = dict(spec.finetune_trainer)
        own_tasks = own.pop("tasks", None) or {}
        shared = (self.compare["trainer"].get("tasks") or {}).get(unit.task) or {}
        return self.trainer_cfg("finetune", steps, {**shared, **own, **(own_tasks.get(unit.task) or {})})

    def check_trainers(self) -> None:
        """Refuse, before any work, a trainer override that no unit could train with (an unknown key, a
        negative rate ...), naming the run and the stage. A trainer depends on the run and the task only, so
        one unit of each is checked."""
        for unit in {(u.run, u.task): u for u in self.all_units()}.values():
            try:
                TrainerConfig.from_cfg(self.unit_trainer(unit))
            except (*framework_errors(), ValueError) as err:
                stage = "pre-training" if unit.is_pretrain else f"{unit.task} fine-tuning"
                raise ValueError(f"compare: run {self.specs[unit.run].name}, {stage} trainer: "
                                 f"{str(err).splitlines()[0]}") from None

    def task_cfg(self, name: str, spec: RunSpec | None = None) -> dict[str, Any]:
        return task_cfg(self.compare, name, spec)

    def tasks_for(self, spec: RunSpec) -> list[str]:
        """The comparison's tasks that the run's model can serve (a task refuses a model kind with
        `IncompatibleTask`, e.g. refexp a pixel model without region proposals)."""
        tasks = []
        for name in spec.tasks or self.compare["tasks"]:
            try:
                TASKS.get(name).check(MODELS.get(spec.family))
            except IncompatibleTask:
                continue
            tasks.append(name)
        return tasks

    def check_models(self) -> None:
        """Refuse, before any work, a run whose model (family, preset, fields) or objective mix cannot be built,
        naming the run: a typo in a comparison file fails here, not after the plan is written. The mix is built
        for the run's model (on the meta device, as the plan and the account build it), so an objective the model
        cannot serve (MIM on a region family) is refused here, not after the units ran."""
        for spec in self.specs:
            try:
                name, preset, overrides = split_model_config(spec.model)
                MODELS.get(name).config_class.from_preset(preset, **overrides)
                mix = objective_mix(spec)
                if mix is not None:
                    check_mix(mix)
                    model = on_meta(lambda: build_model(spec.model))
                    on_meta(lambda: build_pretraining(model, mix))
            except (LookupError, ValueError, TypeError, OSError) as err:
                raise ValueError(f"compare: run {spec.name}: {describe(err)}") from None

    def check_task_sources(self) -> None:
        """Refuse, before any work, a fine-tuning that reads the shapes world's annotations (``source: shapes``,
        the default) in a run whose data is not the shapes world: it would fail only after its pre-training."""
        for spec in self.specs:
            data = run_data(self.cfg["data"], spec).get("name")
            if data == "shapes":
                continue
            bad = [t for t in self.tasks_for(spec) if task_source(self.task_cfg(t, spec)) == "shapes"]
            if bad:
                raise ValueError(f"compare: run {spec.name} reads data={data}, but task(s) {', '.join(bad)} read the "
                                 "shapes world (task source=shapes, the default); give each task its own files in "
                                 f"compare.task_overrides.<task>: {{source: files, ...}} (docs/datasets.md)")

    # -- units of work -----------------------------------------------------------------------------
    def variants(self, spec: RunSpec) -> list[str]:
        out = ["pretrained"] if spec.objectives is not None else []
        return out + (["scratch"] if spec.baseline or spec.objectives is None else [])

    def finetune_units(self, index: int, seed: int, variant: str) -> list[Unit]:
        return [Unit(index, seed, variant, task) for task in self.tasks_for(self.specs[index])]

    def all_units(self) -> list[Unit]:
        """Every unit in the order they are started: pre-trainings, the scratch baselines, then the
        fine-tunings of each pre-training (which wait for it); each run at its seeds (`seeds_of`)."""
        runs = [(seed, i, spec) for seed in self.all_seeds() for i, spec in enumerate(self.specs)
                if seed in self.seeds_of(i)]
        pretrain = [Unit(i, seed) for seed, i, spec in runs if spec.objectives is not None]
        scratch = [u for seed, i, spec in runs if "scratch" in self.variants(spec)
                   for u in self.finetune_units(i, seed, "scratch")]
        return pretrain + scratch + [u for p in pretrain for u in self.finetune_units(p.run, p.seed, "pretrained")]

    def unit_of(self, key: str) -> Unit:
        """The unit whose key is ``key`` (`key`), at any seed the comparison may give its run; `KeyError` otherwise."""
        name, _, rest = key.partition("/seed")
        seed, _, stage = rest.partition("/")
        index = next((i for i, spec in enumerate(self.specs) if spec.name == name), None)
        if index is not None and seed.isdigit() and int(seed) in self.candidate_seeds():
            spec, (variant, _, task) = self.specs[index], stage.partition("-")
            if stage == "pretrain" and spec.objectives is not None:
                return Unit(index, int(seed))
            if variant in self.variants(spec) and task in self.tasks_for(spec):
                return Unit(index, int(seed), variant, task)
        raise KeyError(f"{key!r} is not a unit of the comparison in {self.output_dir}")

    def key(self, unit: Unit) -> str:
        return unit.key(self.specs[unit.run].name)

    def unit_steps(self, unit: Unit) -> int:
        """The unit's training steps: the budget's pre-training steps, or its task's fine-tuning steps."""
        budget = self.compare["budget"]
        return budget["pretrain_steps"] if unit.is_pretrain else budget["finetune_steps"][unit.task]

    def unit_dir(self, unit: Unit) -> Path:
        return self.output_dir / "runs" / self.key(unit)

    def unit_config(self, unit: Unit) -> dict[str, Any]:
        """Everything that decides a unit's result (its hash is the unit's identity on disk): its settings and the
        content of every file they name (``inputs``: path -> sha256, `vlkit.digests`; absent when they name none,
        as in the shapes world); a fine-tuning of the pre-trained variant includes its pre-training's."""
        spec = self.specs[unit.run]
        common = {"model": spec.model, "data": run_data(self.cfg["data"], spec), "seed": unit.seed, "threads": self.cfg.get("threads"),
                  "gpus_per_unit": self.compare.get("gpus_per_unit") or 0, "eval_split": self.compare.get("eval_split", "val")}
        if unit.is_pretrain:
            zero_shot = "retrieval" in self.compare["tasks"] and self.compare.get("zero_shot", True)
            config = {**common, "kind": "pretrain", "mix": objective_mix(spec),
                      "trainer": self.unit_trainer(unit),
                      "itm_pairs": self.compare.get("itm_pairs", 2000),
                      "zero_shot": self.task_cfg("retrieval", spec) if zero_shot else None}
            return _with_inputs(config)
        parent = unit.depends_on()
        return _with_inputs({**common, "kind": "finetune", "variant": unit.variant, "task": self.task_cfg(unit.task, spec),
                             "trainer": self.unit_trainer(unit),
                             "pretraining": self.unit_config(parent) if parent else None})

    def unit_hash(self, unit: Unit) -> str:
        """The hash of `unit_config`, computed once per unit (it reads every task's YAML)."""
        if unit not in self._hashes:
            self._hashes[unit] = config_hash(self.unit_config(unit))
        return self._hashes[unit]

def describe(err: BaseException) -> str:
    """An error's message (a `KeyError`'s without its quotes)."""
    return str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)


def _with_inputs(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with ``inputs``: the digest of every file its settings name (a pre-training's are in its own)."""
    inputs = input_digests({k: v for k, v in config.items() if k != "pretraining"})
    return {**config, "inputs": inputs} if inputs else config


