"""The typed specs of ``pretrain``, ``finetune`` and ``evaluate``, and what each returns (`RunResult`).

A spec is what a command runs: the command line builds it from its composed config (`vlkit.cli`), Python from
keyword arguments and objects (`vlkit.workflows`); the same settings give equal specs, and so the same numbers.
Each block is checked by its owner, once: ``trainer`` is a `TrainerConfig`, ``model`` a family's config node
(`vlkit.config.model_problems`), ``data`` the data block (`vlkit.data.spec`), ``objectives`` the mix
(`vlkit.objectives.load_mix`), ``task`` a registered task; the command's own keys (``threads``, ``resume``,
``eval_splits`` ...) by the spec here. Every problem is raised at once (`vlkit.config.SpecError`), each naming
its key as the command line writes it (``data.max_len``), which the Python face writes as its argument path.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from vlkit.config import COUNT, SWITCH, Problem, SpecError, check_rules, model_problems, plain, register_model_configs
from vlkit.data.spec import data_problems
from vlkit.models.base import VLModel
from vlkit.objectives import load_mix
from vlkit.registry import TASKS, did_you_mean
from vlkit.train.trainer import TrainerConfig, register_hydra_configs

# The keys of the commands themselves (not of a block): their rules.
COMMAND_RULES = {"threads": COUNT, "resume": SWITCH}


def register_configs() -> None:
    """The config nodes derived from code (each family's ``model`` node, each recipe's ``trainer``), stored for
    the YAML's config groups (`vlkit.config.defaults`, the command line)."""
    register_model_configs()
    register_hydra_configs()


@dataclass
class RunResult:
    """What a `pretrain` / `finetune` / `evaluate` left: ``output_dir`` (the run; for `evaluate` the evaluated
    run), ``metrics`` (fine-tuning and evaluation: ``<split>/<metric>``; pre-training: the last logged step's),
    ``history`` (this run's per-step records, as ``metrics.jsonl`` has them), ``record`` (``run.json``) and
    ``paths`` (the files written). (The Python face's `vlkit.RunResult` adds ``load()``: the model and its
    processor.)"""

    kind: str
    output_dir: Path
    metrics: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)

    def __fspath__(self) -> str:  # a result stands for its folder: finetune(pretrain(...)), evaluate(finetune(...))
        return str(self.output_dir)


def _problems_of(build: Any) -> tuple[Any, list[Problem]]:
    try:
        return build(), []
    except SpecError as err:
        return None, list(err.problems)


@dataclass
class _RunSpec:
    """The keys every command of a run shares."""

    cache_dir: str | None = None
    threads: int | None = None
    explicit: frozenset[str] = field(default=frozenset(), compare=False)  # the keys the caller set
    quiet: bool = field(default=False, compare=False)  # no summary printed (the result is returned either way)
    invocation: str = field(default="", compare=False)  # how the caller ran it (the lock's record)
    spell: Any = field(default=None, compare=False)  # spell(key): how the caller writes a key (None: key=VALUE)


@dataclass
class _TrainingSpec(_RunSpec):
    """The keys of a training command (pretrain, finetune)."""

    model: dict[str, Any] | None = None  # a family's config node ({name, preset, <field>: ...}); None: init's
    data: dict[str, Any] = field(default_factory=dict)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # ``resume`` is the command's resume=
    init: Any = None  # a run's or a saved model's folder (str), or a `VLModel` built in Python
    processor: Any = field(default=None, compare=False)  # a `VLProcessor` given in Python: saved beside the model

    @property
    def output_dir(self) -> str:
        return self.trainer.output_dir

    def writes(self) -> dict[str, str]:
        """``{key: path}`` of what the command writes (`vlkit.locks` holds each while it runs); the ranks of a
        distributed run after the first write nothing of their own."""
        if int(os.environ.get("RANK", "0") or 0) != 0:
            return {}
        return {"trainer.output_dir": str(self.trainer.output_dir)}

    @classmethod
    def _common(cls, cfg: Mapping[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
        """The shared fields of a composed ``cfg`` (plain), and every problem of them."""
        problems = check_rules(COMMAND_RULES, cfg)
        trainer_cfg = {**(cfg.get("trainer") or {})}
        if isinstance(cfg.get("resume"), bool):
            trainer_cfg["resume"] = cfg["resume"]
        trainer, found = _problems_of(lambda: TrainerConfig.from_cfg(trainer_cfg))
        problems += found
        problems += model_problems(cfg.get("model"))
        problems += data_problems(cfg.get("data"))
        init = cfg.get("init")
        if init is not None and not isinstance(init, (str, os.PathLike, VLModel)):
            problems.append(Problem("init", f"={init!r}: give a run's folder or a saved model's"))
        fields = {"model": cfg.get("model"), "data": dict(cfg.get("data") or {}), "trainer": trainer,
                  "init": os.fspath(init) if isinstance(init, os.PathLike) else init,
                  "cache_dir": _path(cfg.get("cache_dir")), "threads": cfg.get("threads")}
        return fields, problems


def _plain(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``cfg`` as plain containers, its ``init`` as given (a model object is not copied)."""
    out = plain({k: v for k, v in cfg.items() if k != "init"})
    out["init"] = cfg.get("init")
    return out


def _path(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _raise(problems: list[Problem]) -> None:
    if problems:
        raise SpecError(problems)


@dataclass
class PretrainSpec(_TrainingSpec):
    """``vlkit pretrain``: pre-train ``model`` (or ``init``'s) on ``data`` with the objective mix ``objectives``
    (None: the family's own; a mix as `vlkit.objectives.load_mix` reads it)."""

    objectives: Any = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], **given: Any) -> "PretrainSpec":
        """The spec of a composed config (plain containers: the command line's, or the Python face's); ``given``:
        the fields that are no keys (``explicit``, ``quiet``, ``processor``, ``invocation``, ``spell``)."""
        cfg = _plain(cfg)
        fields, problems = cls._common(cfg)
        objectives = cfg.get("objectives")
        if objectives is not None:
            problems += mix_problems(objectives)
        _raise(problems)
        return cls(**fields, objectives=objectives, **given)


def mix_problems(mix: Any, key: str = "objectives") -> list[Problem]:
    """The problems of an objective mix as its reader (`vlkit.objectives.load_mix`) finds them, named ``key``."""
    try:
        load_mix(mix)
    except (KeyError, ValueError, TypeError, OSError) as err:
        text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        return [Problem(key, f": {text}")]
    return []


@dataclass
class FinetuneSpec(_TrainingSpec):
    """``vlkit finetune``: fine-tune ``model`` (or ``init``'s) on ``task`` and evaluate it on ``eval_splits``."""

    task: dict[str, Any] = field(default_factory=dict)
    eval_splits: tuple[str, ...] = ("val",)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], **given: Any) -> "FinetuneSpec":
        """As `PretrainSpec.from_config`."""
        cfg = _plain(cfg)
        fields, problems = cls._common(cfg)
        task = cfg.get("task") or {}
        problems += task_problems(task, required=True)
        splits, found = splits_of(cfg.get("eval_splits"), "eval_splits", empty=True)  # []: a run without evaluation
        _raise(problems + found)
        return cls(**fields, task=task, eval_splits=splits, **given)


def task_problems(task: Any, required: bool = False, key: str = "task") -> list[Problem]:
    """The problems of a ``task`` block: a mapping whose ``name`` is a registered task (None without ``required``)."""
    if not isinstance(task, Mapping):
        return [Problem(key, f"={task!r}: give a task name ({', '.join(TASKS.names())}) or a mapping of its keys")]
    name = task.get("name")
    if name is None:
        return [Problem(key, f" is needed: {key}={' | '.join(TASKS.names())}")] if required else []
    if not isinstance(name, str) or name not in TASKS:
        return [Problem(f"{key}.name", f"={name!r}: unknown task{did_you_mean(name, TASKS.names())}; tasks: "
                                       f"{', '.join(TASKS.names())}")]
    return []


def splits_of(value: Any, key: str, empty: bool = False) -> tuple[tuple[str, ...], list[Problem]]:
    """``value`` as a tuple of split names, or the problem of it; ``empty``: ``[]`` (evaluate none) is allowed."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not (value or empty) \
            or not all(isinstance(s, str) for s in value):
        return (), [Problem(key, f"={value!r}: give a list of split names, e.g. [val]"
                                 + ("" if empty else " (evaluate scores at least one)"))]
    return tuple(value), []


@dataclass
class EvaluateSpec(_RunSpec):
    """``vlkit evaluate``: score the run in ``checkpoint`` on ``split`` (else ``eval_splits``). ``task`` / ``data``
    name them for a run that records none; the ``explicit`` ``task.<key>`` values override the run's recorded task.
    ``predictions``: the leaderboard file to write; ``eval_options``: the task's scoring options; ``output``: the
    metrics file (default ``<checkpoint>/eval.json``)."""

    checkpoint: str = ""
    split: str | None = None
    eval_splits: tuple[str, ...] = ("val",)
    task: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    predictions: str | None = None
    eval_options: dict[str, Any] = field(default_factory=dict)
    output: str | None = None

    def writes(self) -> dict[str, str]:
        """``{key: path}`` of the files the evaluation writes (`vlkit.locks`)."""
        if int(os.environ.get("RANK", "0") or 0) != 0:
            return {}
        default = str(Path(self.checkpoint) / "eval.json") if Path(self.checkpoint).is_dir() else None
        keys = {"output": self.output or default, "predictions": self.predictions}
        return {key: str(path) for key, path in keys.items() if path}

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], **given: Any) -> "EvaluateSpec":
        """As `PretrainSpec.from_config`."""
        cfg = plain(cfg)
        problems = check_rules(COMMAND_RULES, cfg)
        checkpoint = _path(cfg.get("checkpoint"))
        if not isinstance(checkpoint, str) or not checkpoint or checkpoint == "???":
            problems.append(Problem("checkpoint", f"={checkpoint!r}: give the folder of a run to evaluate"))
        split = cfg.get("split")
        if split is not None and not isinstance(split, str):
            problems.append(Problem("split", f"={split!r}: give a split name (val, test ...)"))
        splits, found = splits_of(cfg.get("eval_splits"), "eval_splits")
        task = cfg.get("task") or {}
        problems += found + task_problems(task) + data_problems(cfg.get("data"))
        for key in ("predictions", "output"):
            if cfg.get(key) is not None and not isinstance(_path(cfg[key]), str):
                problems.append(Problem(key, f"={cfg[key]!r}: give a file path"))
        options = cfg.get("eval_options") or {}
        if not isinstance(options, Mapping):
            problems.append(Problem("eval_options", f"={options!r}: give a mapping of the task's scoring options"))
        _raise(problems)
        return cls(checkpoint=checkpoint, split=split, eval_splits=splits, task=task, data=dict(cfg.get("data") or {}),
                   predictions=_path(cfg.get("predictions")), output=_path(cfg.get("output")),
                   eval_options={k: v for k, v in options.items() if v is not None},
                   cache_dir=_path(cfg.get("cache_dir")), threads=cfg.get("threads"), **given)


SPECS = {"pretrain": PretrainSpec, "finetune": FinetuneSpec, "evaluate": EvaluateSpec}
