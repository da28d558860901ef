"""The glue of a run: data environment (`vlkit.environment`) -> model -> pre-training or fine-tuning with the `Trainer`.

`vlkit pretrain | finetune | evaluate` (``commands.py``) and `vlkit compare` call these functions,
so a comparison runs exactly what the single commands run. Each runs the preflight
(`vlkit.train.preflight`) before step 1: every problem of the output folder, the mix, the task and the
data against the model is reported at once, before anything is trained or written.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

import torch

from vlkit.config import plain
from vlkit.data.images import image_index
from vlkit.environment import Environment
from vlkit.io import load_weights
from vlkit.models.base import VLModel, build_model, from_pretrained
from vlkit.models.recipe import recipe_of
from vlkit.objectives import Pretraining, build_pretraining
from vlkit.registry import DATASETS, TASKS
from vlkit.runs import PRETRAINING_WEIGHTS, RUN_INFO, read_run_info, save_run
from vlkit.tasks import build_task
from vlkit.train.preflight import Preflight
from vlkit.train.resume import run_record
from vlkit.train.trainer import NonFiniteLossError, Trainer, TrainerConfig
from vlkit.validate import DataError, nonfinite_parameters


def build_run_model(env: Environment, init: str | None = None) -> VLModel:
    """The model of a run: ``from_pretrained(init/model)`` when ``init`` names a pre-training run (or a
    saved model directory), else built from a copy of the environment's resolved configuration (``env.model``:
    a model keeps its config and may change it, e.g. NLVR2's extra image token type)."""
    if init:
        init_path = Path(init)
        return from_pretrained(init_path / "model" if (init_path / "model").is_dir() else init_path)
    return build_model(copy.deepcopy(env.model))


def pretraining_dataset(env: Environment):
    """The image-text pairs of ``env.data`` (registered dataset ``data.name``), built once per environment."""
    if env.pairs is None:
        env.pairs = DATASETS.get(env.data["name"])(env.data)
    return env.pairs


def load_pretraining(directory: str | Path, model: VLModel | None = None):
    """The `Pretraining` module (model + objective heads) saved by a pre-training run."""
    directory = Path(directory)
    info = read_run_info(directory)
    if "objectives" not in info:
        raise DataError(f"{directory / RUN_INFO} records no objective mix: {directory} is not a pre-training run")
    model = model or from_pretrained(directory / "model")
    pre = rebuild_pretraining(model, {"objectives": info["objectives"], "seed": info.get("seed")})
    load_weights(pre, directory / PRETRAINING_WEIGHTS)
    return pre


def rebuild_pretraining(model: VLModel, recorded: Mapping[str, Any]):
    """A `Pretraining` module of the recorded ``{objectives, seed}`` around ``model``, its weights to be loaded."""
    pre = build_pretraining(model, recorded["objectives"], seed=recorded.get("seed"))
    _fit_tokenizers(pre, None)
    return pre


def _fit_tokenizers(pre, dataset, samples: int = 256) -> None:
    """Fit data-dependent objective parts (MIM's k-means codebook) on the first training images."""
    for objective in pre.objectives.values():
        if objective.needs_fit:
            if dataset is None:  # loading saved weights: the codebook comes from the checkpoint
                objective.fitted_from_checkpoint()
                continue
            if isinstance(dataset, torch.utils.data.IterableDataset):  # a stream: its first examples
                import itertools

                first = [e for e in itertools.islice(iter(dataset), samples) if e is not None]
            else:
                first = [dataset[i] for i in range(min(samples, len(dataset)))]
            pixels = torch.stack([e["pixel_values"] for e in first])
            objective.fit(pixels)


class RecordingLoader:
    """A training loader that remembers the id of every example it hands out (identical-data audit). Its
    state travels with the trainer's checkpoints, so a resumed run reports every id since step 0."""

    def __init__(self, loader: Any, seen: list[str]):
        self.loader, self.seen = loader, seen
        self._replayed = 0  # batches a resume skips over again (already in ``seen``)

    def state_dict(self) -> dict[str, Any]:
        return {"seen": list(self.seen)}

    def load_state_dict(self, state: Mapping[str, Any], replayed: int = 0) -> None:
        self.seen[:] = state["seen"]
        self._replayed = replayed

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    @property
    def num_workers(self) -> int:
        return self.loader.num_workers

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.loader.batch_sampler, "set_epoch"):
            self.loader.batch_sampler.set_epoch(epoch)

    def __iter__(self):
        for batch in self.loader:
            if self._replayed:
                self._replayed -= 1
            else:
                self.seen.extend(batch.ids or [])
            yield batch


def _fit(module: torch.nn.Module, dataset: Any, collate: Any, trainer_cfg: Any, output_dir: str | Path, seed: int,
         seen: list[str] | None, lengths: Any = None, data_source: str | None = None, run: Any = None):
    config = TrainerConfig.from_cfg(trainer_cfg, output_dir=str(output_dir), seed=seed)
    trainer = Trainer(module, config, run=run)
    needs_lengths = config.batching == "units" or config.group_by_length
    loader = trainer.loader(dataset, collate, lengths() if needs_lengths and lengths is not None else None)
    try:
        return trainer.fit(loader if seen is None else RecordingLoader(loader, seen))
    except NonFiniteLossError as err:
        if data_source and data_source not in str(err):
            raise NonFiniteLossError(f"{err} [data: {data_source}]") from err
        raise


def _examples(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # a stream
        return None


def _resume(trainer_cfg: Any) -> bool:
    value = trainer_cfg.get("resume", False) if hasattr(trainer_cfg, "get") else getattr(trainer_cfg, "resume", False)
    return bool(value)


def data_source(env: Environment) -> str:
    """The data of ``env`` for messages: the dataset and the feature store or image folder."""
    _, where = image_index(env.image_source)
    return f"data={env.data.get('name')}" + (f", {where}" if where and " " in where else "")


def family_mix(model: VLModel, mix: Any = None) -> Any:
    """``mix``, or the model family's own pre-training mix (its recipe's ``mix``) when it is None."""
    mix = plain(mix)
    if mix is None:
        mix = plain(recipe_of(model).mix)
        if mix is None:
            raise ValueError(f"{model.family} declares no default objective mix: choose one with objectives=<preset>")
    return mix


def pretrain_model(env: Environment, model: VLModel, mix: Any, trainer_cfg: Any, output_dir: str | Path,
                   seed: int = 0, seen: list[str] | None = None, preflight: Any = None):
    """Pre-train ``model`` on ``env``'s pairs with objective mix ``mix`` (None: the family's own); returns
    (module, TrainResult). ``seen`` (a list) receives the id of every training example in the order it was used.
    ``preflight``: a `vlkit.train.preflight.Preflight` already holding the caller's checks (``init=`` ...)."""
    check = preflight or Preflight()
    check.check_output_dir(output_dir, _resume(trainer_cfg))
    mix = family_mix(model, mix)
    check.check_mix(model, mix, env.image_source)
    check.check_tokenizer(env.tokenizer, env.data["tokenizer"], model)
    check.check_masking(mix, env.tokenizer)
    dataset = pretraining_dataset(env)
    check.check_data("pre-training", dataset, model)
    check_unknown_words(check, env, {"pre-training": dataset})
    run = run_record(model, env.data, _examples(dataset), objectives=mix, seed=seed)
    check_run(check, trainer_cfg, output_dir, seed, model, dataset, "pre-training", run)
    check.finish(output_dir)
    pre = build_pretraining(model, mix, tokenizer=env.tokenizer, seed=seed)
    _fit_tokenizers(pre, dataset)
    result = _fit(pre, dataset, dataset.collator(), trainer_cfg, output_dir, seed, seen,
                  getattr(dataset, "lengths", None), data_source(env), run)
    save_run(Path(output_dir), pre, {"kind": "pretrain", "family": model.family, "objectives": mix, "seed": seed,
                                     "data": env.data, "steps": result.step}, env.tokenizer)
    return pre, result


def finetune_task(env: Environment, model: Any, task_cfg: Mapping[str, Any], trainer_cfg: Any,
                  output_dir: str | Path, seed: int = 0, eval_splits: tuple[str, ...] = ("val",),
                  seen: list[str] | None = None, preflight: Any = None, data: Any = None):
    """Fine-tune on the task of ``task_cfg`` and evaluate on ``eval_splits``.

    ``model`` is a `VLModel`, or a `Pretraining` module whose heads a task may start from (retrieval
    initialises its rank head from the ITM head); other tasks take its model. ``data``: the task's data
    (``build_data`` of its class, read-only, so several fine-tunings may share it), else built here. Returns
    ``(task, data, result, metrics)`` with ``metrics`` as ``<split>/<metric>``.
    """
    task_cfg = plain(task_cfg)
    name = task_cfg["name"]
    cls = TASKS.get(name)
    check = preflight or Preflight()
    check.check_output_dir(output_dir, _resume(trainer_cfg))
    check.check_task(cls, model)
    check.check_tokenizer(env.tokenizer, env.data["tokenizer"], model)
    if data is None:
        data = cls.build_data(task_cfg, env.tokenizer, env.image_source, env.world)
    check_task_data(check, name, data, model, eval_splits, task_cfg)
    check_unknown_words(check, env, {f"{name} train": data.train,
                                     **{f"{name} {s}": data.eval[s] for s in eval_splits if s in data.eval}})
    run = run_record(model, env.data, _examples(data.train), task=task_cfg, seed=seed)
    check_run(check, trainer_cfg, output_dir, seed, model, data.train, f"{name} train", run)
    check.finish(output_dir)
    options = {**data.options, **(task_cfg.get("options") or {})}
    pretraining = None
    if isinstance(model, Pretraining):
        if cls.from_pretraining:  # the task keeps some of its heads: recorded to rebuild it for evaluation
            pretraining = {"objectives": model.mix, "seed": model.seed}
        else:
            model = model.model
    task = build_task(name, model, **options)
    collate = data.collate or data.train.collator()
    result = _fit(task, data.train, collate, trainer_cfg, output_dir, seed, seen, getattr(data.train, "lengths", None),
                  data_source(env), run)
    metrics = evaluate_task(task, data, eval_splits, task_cfg.get("eval_batch_size", 64))
    info = {"kind": "finetune", "task": name, "family": task.model.family, "options": recordable_options(options),
            "seed": seed, "data": set_keys(env.data), "task_cfg": task_cfg, "steps": result.step, "metrics": metrics,
            "pretraining": pretraining}
    save_run(Path(output_dir), task, info, env.tokenizer)
    return task, data, result, metrics


def check_run(check: Any, trainer_cfg: Any, output_dir: str | Path, seed: int, model: Any, dataset: Any, name: str,
              run: Mapping[str, Any]) -> None:
    """The preflight of a run's settings: the trainer config against the data, the model's weights, and with
    ``resume=true`` the checkpoint's configuration against ``run`` (`vlkit.train.resume.run_record`)."""
    config = check.check_trainer(trainer_cfg, output_dir, seed, dataset, name)
    check.check_weights(model)
    check.check_resume(output_dir, config, run)


def check_unknown_words(check: Any, env: Environment, sets: Mapping[str, Any]) -> None:
    """The preflight of the text of each named set against the run's tokenizer (``data.max_unk_rate``)."""
    for name, dataset in sets.items():
        if dataset is not None:
            check.check_unknown_words(name, dataset, env.tokenizer, env.data["tokenizer"], env.data.get("max_unk_rate"))


def check_task_data(check: Any, name: str, data: Any, model: Any, eval_splits: tuple[str, ...],
                    task_cfg: Mapping[str, Any] | None = None, none: bool = True) -> None:
    """The preflight of a task's data: its training set (sampled) and the evaluation splits (in full up to a size);
    ``task_cfg`` (when known) tells whether a missing split is given as files (``task.files.<split>``); ``none``:
    whether evaluating no split is a way out (a fine-tuning's, not ``vlkit evaluate``'s)."""
    if data.train is not None:
        check.check_data(f"{name} train", data.train, model)
    for split in eval_splits:
        if split not in data.eval:
            files = (task_cfg or {}).get("files")
            check.missing_split(name, split, list(data.eval), (files or {}).get("train"),
                                files=task_cfg is None or files is not None, none=none)
        else:
            check.check_data(f"{name} {split}", data.eval[split], model, evaluation=True)


def evaluate_task(task: Any, data: Any, splits: tuple[str, ...], batch_size: int = 64) -> dict[str, float]:
    """``<split>/<metric>`` of ``task`` on each split. Never scores NaN: weights that hold NaN / inf, and
    a metric that comes out NaN / inf, are errors naming the parameter or the metric."""
    bad = nonfinite_parameters(task)
    if bad:
        raise FloatingPointError(f"task {task.name!r}: the weights hold NaN or inf ({', '.join(bad[:3])}"
                                 f"{' ...' if len(bad) > 3 else ''}); refusing to evaluate a diverged model")
    out: dict[str, float] = {}
    for split in splits:
        if split not in data.eval:
            raise KeyError(f"task {task.name!r} has no {split!r} evaluation set; it has {', '.join(data.eval)}")
        scores = {f"{split}/{k}": float(v) for k, v in task.evaluate(data.eval[split], batch_size=batch_size).items()}
        nonfinite = [k for k, v in scores.items() if not torch.isfinite(torch.tensor(v))]
        if nonfinite:
            raise FloatingPointError(f"task {task.name!r}: {', '.join(nonfinite)} came out NaN or inf; not reported")
        out.update(scores)
    return out


def set_keys(value: Any) -> Any:
    """``value`` without the keys left unset (``???``: e.g. the caption file of a data set, which a fine-tuning on
    a task's own files does not read), at every depth."""
    if isinstance(value, dict):
        return {k: set_keys(v) for k, v in value.items() if v != "???"}
    return value


def recordable_options(options: dict[str, Any]) -> dict[str, Any]:
    """The task options ``run.json`` records (those JSON holds as they are; the ITM module or the pre-ranking
    data a task was given are rebuilt, not recorded). Metric values are made JSON by `vlkit.train.logging`."""
    return {k: v for k, v in options.items() if isinstance(v, (str, int, float, bool, list, dict, type(None)))}
