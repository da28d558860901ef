"""The work of a comparison's units: `UnitWork(comparison).run(unit)` pre-trains a run at a seed (then scores held-out
ITM and zero-shot retrieval) or fine-tunes one variant on one task, and returns the unit's result (metrics, costs,
data digests, ids seen). Each task's data and the held-out pairs are built once per process and shared by its units
(read-only: every random choice comes from the unit's seed)."""
from __future__ import annotations

import json
import time
from typing import Any, Iterable

import torch

from vlkit.compare.comparison import Comparison
from vlkit.compare.config import RunSpec, objective_mix
from vlkit.compare.units import Unit, digest
from vlkit.environment import Environment
from vlkit.registry import DATASETS, TASKS
from vlkit.tasks.probes import inference_latency, itm_accuracy, zero_shot_retrieval
from vlkit.train import pipeline
from vlkit.train.trainer import read_metrics


class UnitWork:
    """Runs the units of ``comparison`` in this process (`vlkit.compare.worker` keeps one per plan)."""

    def __init__(self, comparison: Comparison):
        self.comparison = comparison
        self.compare = comparison.compare
        self._eval_pairs: dict[str, Any] = {}
        self._task_data: dict[str, Any] = {}

    def run(self, unit: Unit) -> dict[str, Any]:
        return self.pretrain(unit) if unit.is_pretrain else self.finetune(unit)

    def pretrain(self, unit: Unit) -> dict[str, Any]:
        """Pre-train a run at a seed (saved for its fine-tunings), then score held-out ITM and zero-shot retrieval."""
        from accelerate.utils import set_seed

        comparison, spec, seed = self.comparison, self.comparison.specs[unit.run], unit.seed
        env = comparison.environment(spec)
        set_seed(seed)
        model = pipeline.build_run_model(env)
        seen: list[str] = []
        start = time.perf_counter()
        out_dir = comparison.unit_dir(unit)
        pre, result = pipeline.pretrain_model(env, model, objective_mix(spec), comparison.unit_trainer(unit), out_dir,
                                              seed, seen)
        wall = time.perf_counter() - start
        dataset = pipeline.pretraining_dataset(env)
        curve = read_metrics(out_dir)  # every step since step 0, also after a resume
        out = {"ids": digest(seen), "curve": curve,
               "data": {"pretrain": _pretraining_digest(dataset)},
               "stats": {"pretrain_wall_s": wall, "train_samples_per_s": len(seen) / wall if wall else float("nan"),
                         "pretrain_final_loss": curve[-1]["loss"] if curve else float("nan")},
               "metrics": {}}
        if pre.scorer() is not None and self.compare.get("itm_pairs", 2000):  # 0: no held-out ITM accuracy
            pairs = self.eval_pairs(spec)
            out["metrics"].update(itm_acc=itm_accuracy(pre, pairs, self.compare.get("itm_pairs", 2000), seed=0),
                                  itm_acc_chance=0.5)
        if "retrieval" in self.compare["tasks"] and self.compare.get("zero_shot", True) and pre.scorer() is not None:
            task_cfg = comparison.task_cfg("retrieval", spec)
            out["metrics"].update(zero_shot_retrieval(pre, task_cfg, self.task_data(env, task_cfg),
                                                      self.compare.get("eval_split", "val")))
        out["wall_s"] = time.perf_counter() - start
        out["stats"]["pretrain_eval_wall_s"] = out["wall_s"] - wall  # held-out ITM and zero-shot retrieval
        return out

    def eval_pairs(self, spec: RunSpec) -> Any:
        """The image-text pairs of the evaluation split (held-out ITM accuracy), built once per environment."""
        env = self.comparison.environment(spec)
        key = json.dumps(env.data, sort_keys=True, default=str)
        if key not in self._eval_pairs:
            self._eval_pairs[key] = DATASETS.get(env.data["name"])({**env.data, "split": self.compare.get("eval_split", "val")})
        return self._eval_pairs[key]

    def task_data(self, env: Environment, task_cfg: dict[str, Any]) -> Any:
        """A task's data on ``env``, built once per process and shared by its fine-tunings."""
        key = json.dumps([id(env), task_cfg], sort_keys=True, default=str)
        if key not in self._task_data:
            self._task_data[key] = TASKS.get(task_cfg["name"]).build_data(task_cfg, env.tokenizer, env.image_source,
                                                                           env.world)
        return self._task_data[key]

    def finetune(self, unit: Unit) -> dict[str, Any]:
        """Fine-tune the pre-trained (``variant="pretrained"``) or freshly initialised model on the unit's task."""
        from accelerate.utils import set_seed

        comparison = self.comparison
        spec, seed, task = comparison.specs[unit.run], unit.seed, unit.task
        env = comparison.environment(spec)
        task_cfg = comparison.task_cfg(task, spec)
        start = time.perf_counter()
        data = self.task_data(env, task_cfg)  # before the seed: only this process's first unit of a task builds it
        set_seed(seed)
        parent = unit.depends_on()
        model = pipeline.load_pretraining(comparison.unit_dir(parent)) if parent else pipeline.build_run_model(env)
        out_dir = comparison.unit_dir(unit)
        seen: list[str] = []
        module, data, _, raw = pipeline.finetune_task(env, model, task_cfg, comparison.unit_trainer(unit), out_dir,
                                                      seed, (self.compare.get("eval_split", "val"),), seen, data=data)
        metrics = {_metric_name(task, k.split("/", 1)[1]): v for k, v in raw.items()}
        out = {"wall_s": time.perf_counter() - start, "task": task, "metrics": metrics,
               "params": _parameters(module.model),
               "finetune_ids": {str(out_dir.relative_to(comparison.output_dir)): digest(seen)},
               "data": {task: digest(_dataset_keys(data.train))}}
        if task == "vqa":
            out["latency_ms"] = inference_latency(module.model, data.train)
        return out


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _pretraining_digest(dataset: Any) -> str:
    """The identity of the pre-training pairs: every (id, image, caption), or a stream's shard manifest."""
    if hasattr(dataset, "manifest"):
        return digest([dataset.manifest])
    return digest((r["id"], r["image_id"], r["caption"]) for r in dataset.data)


def _dataset_keys(dataset: Any) -> Iterable[Any]:
    data = getattr(dataset, "data", None)
    if data is not None and hasattr(data, "column_names"):
        columns = [c for c in ("id", "image_id") if c in data.column_names]
        return zip(*(data[c] for c in columns))
    return (str(i) for i in range(len(dataset)))


def _metric_name(task: str, key: str) -> str:
    """Task metrics as record keys: the task's own name for its main metric (``vqa``, ``refexp``,
    ``nlvr2``), retrieval's ``ir_r1`` ..., anything else prefixed with the task."""
    return key if task == "retrieval" or key == task or key.startswith(f"{task}_") else f"{task}_{key}"
