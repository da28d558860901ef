"""Training, evaluation and comparison as functions: `pretrain`, `finetune`, `evaluate`, `compare`.

Each composes the config of its command (`vlkit.cli.compose`, the same Hydra config tree as ``vlkit <command>``)
from its arguments and runs the command's own implementation on it (`vlkit.train.commands`,
`vlkit.compare.main`), so the same settings on the command line give bit-identical results. Arguments take
what the YAML takes, as names (``mix="uniter"``, ``trainer="uniter"``, ``data="coco"``, ``task="vqa"``) or as
plain dicts / dataclasses of the same keys (``mix={"mlm": 2, "itm": 1}``, ``trainer={"max_steps": 10}``,
``task={"name": "vqa", "source": "files", "files": {...}}``); ``overrides``: any further ``key=value`` strings
of the command line. A result holds the run's folder, metrics and records.

    pre = vlkit.pretrain(model, [("cat.png", "a cat"), ...], mix={"mlm": 1, "itm": 1}, trainer={"max_steps": 20})
    ft = vlkit.finetune(pre, task={"name": "vqa", "source": "files", "files": {...}})
    print(vlkit.evaluate(ft, split="val").metrics)
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence


@dataclass
class RunResult:
    """What a `pretrain` / `finetune` / `evaluate` left: ``output_dir`` (the run; for `evaluate` the evaluated
    run), ``metrics`` (fine-tuning and evaluation: ``<split>/<metric>``; pre-training: the last logged step's),
    ``history`` (the records of ``metrics.jsonl``), ``record`` (``run.json``) and ``paths`` (the files written)."""

    kind: str
    output_dir: Path
    metrics: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)

    def load(self) -> tuple[Any, Any]:
        """(model, processor) of the run (`vlkit.load_model_and_processor`)."""
        from vlkit.processor import load_model_and_processor

        return load_model_and_processor(self.output_dir)

    def __fspath__(self) -> str:  # a result stands for its folder: finetune(pretrain(...)), evaluate(finetune(...))
        return str(self.output_dir)


@dataclass
class ComparisonResult:
    """What `compare` left: ``output_dir``, ``table`` (``results.md``), ``records`` (every metric of every run and
    seed, ``results.json``'s records) and ``summary`` (the rest of ``results.json``: means, CIs, tests)."""

    output_dir: Path
    table: str
    records: list[dict[str, Any]]
    summary: dict[str, Any]


class _Config:
    """A command's overrides: group choices and ``key=value`` strings for `vlkit.cli.compose`, and values set on
    the composed config afterwards (dicts, lists, paths), each also named as set on the command line."""

    def __init__(self, overrides: Sequence[str] | None = None):
        self.groups: list[str] = list(overrides or ())
        self.values: list[tuple[str, Any, bool, bool | str]] = []  # (key, value, merge, strict)

    def set(self, key: str, value: Any, merge: bool = True, strict: bool | str = True) -> None:
        """``key`` takes ``value`` (merged into a mapping there with ``merge``); ``strict``: every key of ``value``
        must be one the command knows, as on the command line (a free-form node, null or ``{}``, takes any);
        ``"key"``: ``key`` itself must be (its value is a free-form mapping: ``compare.task_overrides``)."""
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        self.values.append((key, value, merge, strict))

    def group(self, group: str, value: Any) -> None:
        """``group=<name>`` for a string, the group's keys for a mapping (``name`` choosing the option)."""
        if value is None:
            return
        if isinstance(value, (str, os.PathLike)):
            self.groups.append(f"{group}={os.fspath(value)}")
            return
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        value = dict(value)
        if value.get("name") is not None and group != "trainer":
            self.groups.append(f"{group}={value['name']}")
        self.set(group, value)

    def compose(self, command: str) -> tuple[Any, list[str]]:
        """(the composed config, the overrides the command reads its explicit keys from)."""
        from vlkit.cli import compose
        from vlkit.config import set_key

        cfg = compose(command, self.groups)
        explicit = list(self.groups)
        for key, value, merge, strict in self.values:
            if strict == "key" or (strict and merge):
                _check_keys(command, cfg, key, None if strict == "key" else value)
            set_key(cfg, key, value, merge=merge)
            explicit += [f"{leaf}=" for leaf in _leaves(key, value)]
        from vlkit.settings import check_settings

        check_settings(command, cfg)  # as the console does: every value before any data work
        return cfg, explicit


def _check_keys(command: str, cfg: Any, key: str, value: Any) -> None:
    """Every key of ``value`` (set at ``key``) is a key of the composed config, or lies under a free-form node."""
    from vlkit.cli import UsageError
    from vlkit.config import is_mapping_node, is_missing
    from vlkit.registry import did_you_mean

    for leaf in _leaves(key, value):
        node, parts = cfg, leaf.split(".")
        for depth, part in enumerate(parts):
            if not is_mapping_node(node) or not node:
                break
            if part not in node.keys():  # (`in` is False for a ??? value)
                where = ".".join(parts[:depth])
                raise UsageError(f"vlkit {command}: unknown key {leaf!r}{did_you_mean(part, list(node))} (keys of "
                                 f"{where or 'the command'}: {', '.join(map(str, node))})")
            node = None if is_missing(node, part) else node[part]


def _leaves(prefix: str, value: Any) -> list[str]:
    if isinstance(value, Mapping) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(f"{prefix}.{k}", v)]
    return [prefix]


def _output_dir(command: str, output_dir: Any) -> str:
    if output_dir is not None:
        return os.fspath(output_dir)
    return str(Path("outputs") / command / datetime.now().strftime("%Y%m%d-%H%M%S-%f"))


def _model(config: _Config, model: Any, stack: ExitStack) -> tuple[Any, str | None]:
    """Set the model of a pretrain / finetune: a name or model config (``model=``), a run's folder or result
    (``init=``), or a model built in Python (saved into a temporary folder that ``init=`` names). Returns (the
    model's processor or None, the run's folder or None)."""
    from vlkit.models.base import ModelConfig, VLModel

    if isinstance(model, ModelConfig):
        model = {"name": model.family, **model.to_dict()}
    if isinstance(model, VLModel):
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="vlkit-model-"))
        model.save_pretrained(folder)
        config.set("init", folder)
        return getattr(model, "processor", None), None
    if isinstance(model, RunResult) or (isinstance(model, (str, os.PathLike)) and Path(model).is_dir()):
        config.set("init", os.fspath(model))
        return None, os.fspath(model)
    if isinstance(model, str):
        config.groups.append(f"model={model}")
    else:
        config.group("model", model)
    return None, None


def _data(config: _Config, data: Any, processor: Any, init: Any = None, cache_dir: Any = None,
          needs_pairs: bool = False) -> None:
    """Set ``data``: a data set name or config (``data=``), or image-text pairs (a list of ``(image, caption)``, of
    ``{image_id, caption}`` records as the dataset readers give them, or a torch Dataset of either) read through
    ``processor``; the processor's tokenizer and images either way (with no pairs when none are given and none are
    needed: a task's own files). Without either, a run (``init``) keeps the data it was trained on."""
    if data is None and processor is None:
        if init is not None:
            from vlkit.runs import read_run_info

            recorded = read_run_info(init).get("data") if (Path(init) / "run.json").is_file() else None
            if recorded:
                config.groups.append(f"data={recorded['name']}")
                config.set("data", recorded, strict=False)  # the keys the run resolved (image.path ...) too
        return
    if data is None:
        if needs_pairs:
            raise ValueError("pretrain: give the image-text pairs to pre-train on (data=): (image, caption) pairs, "
                             "records, a Dataset, or a data set name or config")
        config.groups.append("data=jsonl")
        config.set("data.path", None)
    elif not isinstance(data, (str, os.PathLike, Mapping)):
        if processor is None:
            raise ValueError("image-text pairs need a processor (vlkit.build_processor) to read their images and "
                             "text: build the model with processor=, or pass processor=")
        config.groups.append("data=jsonl")
        config.set("data.path", str(pairs_file(data, processor, cache_dir)))
    else:
        config.group("data", data)
    if processor is not None:  # keys vlkit resolved (a run's processor may hold its data set's own)
        config.set("data", processor.data_config, strict=False)


def pairs_file(pairs: Any, processor: Any, cache_dir: Any = None) -> Path:
    """``pairs`` (``(image, caption)`` tuples or ``{image_id, caption}`` records, a list or a torch Dataset) as the
    JSON lines ``data=jsonl`` reads, written once into the cache under a name of their content."""
    import hashlib

    from vlkit.io import atomic_write_text
    from vlkit.environment import cache_dir as cache_root

    items = [pairs[k] for k in range(len(pairs))] if not isinstance(pairs, (list, tuple)) else list(pairs)
    lines = []
    for k, item in enumerate(items):
        if isinstance(item, Mapping):
            image, caption = item.get("image_id", item.get("image")), item.get("caption")
        else:
            image, caption = tuple(item) if isinstance(item, (tuple, list)) and len(item) == 2 else (None, None)
        if image is None or not isinstance(caption, str):
            raise ValueError(f"pair {k}: {item!r} is not an (image, caption) pair or an {{image_id, caption}} record")
        lines.append(json.dumps({"id": str(item.get("id", k)) if isinstance(item, Mapping) else str(k),
                                 "image_id": processor.image_id(image), "caption": caption}))
    if not lines:
        raise ValueError("no image-text pairs given")
    text = "\n".join(lines) + "\n"
    path = cache_root(cache_dir) / "pairs" / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
    if not path.is_file():
        atomic_write_text(path, text)
    return path


def _common(config: _Config, command: str, trainer: Any, output_dir: Any, seed: int | None, resume: bool,
            cache_dir: Any, threads: int | None) -> str:
    if isinstance(trainer, str):
        config.groups.append(f"trainer={trainer}")
    elif trainer is not None:
        config.group("trainer", trainer)
    out = _output_dir(command, output_dir)
    config.set("trainer.output_dir", out)
    if seed is not None:
        config.set("trainer.seed", seed)
    if resume:
        config.set("resume", True)
    if cache_dir is not None:
        config.set("cache_dir", os.fspath(cache_dir))
    if threads is not None:
        config.set("threads", threads)
    return out


def _run(command: Any, cfg: Any, overrides: list[str]) -> int:
    """``command(cfg, overrides=...)``, the caller's torch thread count kept (a command sets its own: ``threads=``)."""
    import torch

    threads = torch.get_num_threads()
    try:
        return command(cfg, overrides=overrides)
    finally:
        torch.set_num_threads(threads)


def _run_result(kind: str, output_dir: str | Path, processor: Any = None) -> RunResult:
    """The result of the run in ``output_dir``; the ``processor`` it was given is saved beside its model."""
    from vlkit.runs import read_run_info
    from vlkit.train.trainer import read_metrics

    output_dir = Path(output_dir)
    if processor is not None:
        processor.save_pretrained(output_dir / "model")
    record = read_run_info(output_dir)
    history = read_metrics(output_dir) if (output_dir / "metrics.jsonl").is_file() else []
    metrics = record.get("metrics") or (history[-1] if history else {})
    files = {"model": output_dir / "model", "tokenizer": output_dir / "tokenizer", "run": output_dir / "run.json",
             "metrics": output_dir / "metrics.jsonl", "checkpoints": output_dir / "checkpoints"}
    return RunResult(kind, output_dir, dict(metrics), history, record, {k: v for k, v in files.items() if v.exists()})


def pretrain(model: Any, data: Any = None, *, mix: Any = None, trainer: Any = None, output_dir: Any = None,
             processor: Any = None, seed: int | None = None, resume: bool = False, cache_dir: Any = None,
             threads: int | None = None, overrides: Sequence[str] | None = None) -> RunResult:
    """``vlkit pretrain``: pre-train ``model`` (a model built in Python, a name such as ``"uniter/tiny"``, a model
    config, or a run to continue from) on ``data`` (image-text pairs read through the model's processor, a data
    set name or config; None: a run's own data, else ``data=shapes``) with the objective mix
    ``mix`` (None: the family's own; a preset name, a YAML path, a mix dict or ``{objective: ratio}``) and
    ``trainer`` (a `TrainerConfig`, a dict of its keys or a recipe name). ``output_dir``: default
    ``outputs/pretrain/<time>``."""
    from vlkit.train.commands import pretrain as command

    config = _Config(overrides)
    with ExitStack() as stack:
        attached, run = _model(config, model, stack)
        processor = processor or attached
        _data(config, data, processor, run, cache_dir, needs_pairs=True)
        if isinstance(mix, (str, os.PathLike)):
            config.groups.append(f"objectives={os.fspath(mix)}")
        elif mix is not None:
            config.set("objectives", dict(mix), merge=False)
        out = _common(config, "pretrain", trainer, output_dir, seed, resume, cache_dir, threads)
        _run(command, *config.compose("pretrain"))
    return _run_result("pretrain", out, processor)


def finetune(model: Any, data: Any = None, *, task: Any = "vqa", trainer: Any = None, output_dir: Any = None,
             eval_splits: Sequence[str] | None = None, processor: Any = None, seed: int | None = None,
             resume: bool = False, cache_dir: Any = None, threads: int | None = None,
             overrides: Sequence[str] | None = None) -> RunResult:
    """``vlkit finetune``: fine-tune ``model`` (a `pretrain` result or run folder, a model built in Python, or a
    name / model config to train from scratch) on ``task`` (a task name, or a dict of ``conf/task`` keys with its
    ``name``: ``{"name": "vqa", "source": "files", "files": {"train": {...}, "val": {...}}}``) and evaluate it on
    ``eval_splits``. ``data``: as in `pretrain`; None keeps the pre-training run's data (tokenizer and images)."""
    from vlkit.train.commands import finetune as command

    config = _Config(overrides)
    with ExitStack() as stack:
        attached, run = _model(config, model, stack)
        processor = processor or attached
        _data(config, data, processor, run, cache_dir)
        config.group("task", {"name": task} if isinstance(task, str) else task)
        if eval_splits is not None:
            config.set("eval_splits", list(eval_splits), merge=False)
        out = _common(config, "finetune", trainer, output_dir, seed, resume, cache_dir, threads)
        _run(command, *config.compose("finetune"))
    return _run_result("finetune", out, processor)


def evaluate(run: Any, *, split: str | None = None, eval_splits: Sequence[str] | None = None, task: Any = None,
             predictions: Any = None, eval_options: Mapping[str, Any] | None = None, output: Any = None,
             data: Any = None, cache_dir: Any = None, threads: int | None = None,
             overrides: Sequence[str] | None = None) -> RunResult:
    """``vlkit evaluate``: score a `finetune` result or run folder (or a pre-training run zero-shot on
    ``task="retrieval"``) on ``split`` (else ``eval_splits``, default the run's ``[val]``). ``task``: a dict of
    ``conf/task`` keys overriding the run's (the files of a test split: ``{"files": {"test": {...}}}``);
    ``predictions``: a path to write the
    split's leaderboard file to; ``eval_options``: the task's scoring options. ``metrics``: ``<split>/<metric>``."""
    from vlkit.train.commands import evaluate as command

    config = _Config(overrides)
    config.set("checkpoint", os.fspath(run))
    if data is not None:
        config.group("data", data)
    if isinstance(task, str):
        config.groups.append(f"task={task}")
    elif task is not None:
        if not task.get("name"):  # keys of the run's own task (``task=<its name>`` on the command line)
            from vlkit.runs import read_run_info

            task = {"name": read_run_info(run).get("task"), **task}
        config.group("task", task)
    for key, value in (("split", split), ("predictions", predictions), ("output", output),
                       ("cache_dir", cache_dir), ("threads", threads)):
        if value is not None:
            config.set(key, os.fspath(value) if isinstance(value, os.PathLike) else value)
    if eval_splits is not None:
        config.set("eval_splits", list(eval_splits), merge=False)
    if eval_options:
        config.set("eval_options", dict(eval_options))
    cfg, explicit = config.compose("evaluate")
    _run(command, cfg, explicit)
    written = Path(cfg.get("output") or Path(cfg.checkpoint) / "eval.json")
    result = _run_result("evaluate", cfg.checkpoint)
    metrics = json.loads(written.read_text(encoding="utf-8")) if written.is_file() else {}
    paths = {"eval": written} if written.is_file() else {}
    if cfg.get("predictions"):
        paths["predictions"] = Path(cfg.predictions)
    return dataclasses.replace(result, kind="evaluate", metrics=metrics, paths={**result.paths, **paths})


def compare(runs: Sequence[Any] | None = None, data: Any = None, *, preset: str = "default",
            tasks: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
            budget: Mapping[str, Any] | None = None,
            trainer: Mapping[str, Any] | None = None, output_dir: Any = None, workers: int | None = None,
            threads: int | None = None, cache_dir: Any = None, resume: bool = False,
            overrides: Sequence[str] | None = None, **settings: Any) -> ComparisonResult:
    """``vlkit compare``: the comparison ``preset`` (``conf/compare``: ``default``, ``smoke`` ...; or a YAML path)
    with its ``runs`` replaced when given (each a model name such as ``"uniter/tiny"``, pre-trained with the
    family's own mix, or a run dict of the comparison format: ``{name, model, objectives, ...}``), on ``data``
    (a data set name or config; default the preset's). ``tasks``, ``seeds``, ``budget``, ``trainer`` and any
    other ``compare.<key>`` (``settings``: ``title=``, ``baseline=`` ...) as in the comparison YAML."""
    from vlkit.compare.command import main

    config = _Config(overrides)
    config.groups.append(f"compare={os.fspath(preset)}")
    processors = [getattr(run, "processor", None) for run in runs or ()]
    _data(config, data, next((p for p in processors if p is not None), None) if data is not None else None,
          cache_dir=cache_dir)
    if runs is not None:
        config.set("compare.runs", [_run_spec(run) for run in runs], merge=False)
        if settings.get("title") is None:  # the preset's title names its own runs
            config.set("compare.title", None)
    for key, value in (("tasks", tasks), ("seeds", seeds)):
        if value is not None:
            config.set(f"compare.{key}", list(value), merge=False)
    for key, value in (("budget", budget), ("trainer", trainer), *settings.items()):
        if value is not None:
            config.set(f"compare.{key}", value, strict="key")
    out = _output_dir("compare", output_dir)
    config.set("output_dir", out)
    for key, value in (("workers", workers), ("threads", threads), ("cache_dir", cache_dir)):
        if value is not None:
            config.set(key, os.fspath(value) if isinstance(value, os.PathLike) else value)
    if resume:
        config.set("resume", True)
    cfg, _ = config.compose("compare")
    code = _run(main, cfg, config.groups)
    output = Path(out)
    results = json.loads((output / "results.json").read_text(encoding="utf-8")) \
        if (output / "results.json").is_file() else {}
    if code != 0:
        raise RuntimeError(f"vlkit compare: {'some units did not finish' if code == 1 else f'stopped ({code})'}; "
                           f"see {output / 'units.md'} and rerun with resume=True")
    records = results.pop("records", [])
    return ComparisonResult(output, (output / "results.md").read_text(encoding="utf-8"), records, results)


def _run_spec(run: Any) -> dict[str, Any]:
    """A run of a comparison: a model name (``uniter/tiny``) or a model built in Python (its config, and its
    processor's images), pre-trained with its family's own mix; else the run dict as given."""
    from vlkit.models.base import MODELS, VLModel, model_name
    from vlkit.models.recipe import recipe_of

    if isinstance(run, VLModel):
        spec = {"name": f"{run.family}_{run.config.preset}", "model": {"name": run.family, **run.config.to_dict()},
                "objectives": recipe_of(run).mix}
        processor = getattr(run, "processor", None)
        return spec if processor is None else {**spec, "data": {"image": processor.data_config["image"]}}
    if not isinstance(run, str):
        return dict(run)
    family, preset = model_name(run)
    return {"name": run.replace("/", "_"), "model": {"name": family, "preset": preset},
            "objectives": recipe_of(MODELS.get(family)).mix}


__all__ = ["ComparisonResult", "RunResult", "compare", "evaluate", "finetune", "pairs_file", "pretrain"]
