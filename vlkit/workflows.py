"""Training, evaluation and comparison as functions: `pretrain`, `finetune`, `evaluate`, `compare`.

The Python door, beside the command line's (`vlkit.cli`), neither going through the other: each function builds
its command's typed spec (`vlkit.train.spec`, `vlkit.compare.spec.CompareSpec`) from its keyword arguments and
objects, and runs the command on it, so the same settings on the command line give an equal spec and bit-identical
results. The defaults are the YAML's (``conf/<command>.yaml`` and the group options an argument names:
``mix="uniter"``, ``trainer="uniter"``, ``data="coco"``, ``task="vqa"``, ``preset="smoke"``); a dict (or a
dataclass) of keys merges into them (``trainer={"max_steps": 10}``, ``data={"on_error": "skip"}``: the data
source stays), every key checked by its owner. A model built in Python, a processor, image-text pairs and a mix
are taken as objects; the command returns the result (`RunResult`, `ComparisonResult`). An error names a key as
the caller wrote it (``finetune(data={"on_error": ...})``, `ARGUMENTS`).

    pre = vlkit.pretrain(model, [("cat.png", "a cat"), ...], mix={"mlm": 1, "itm": 1}, trainer={"max_steps": 20})
    ft = vlkit.finetune(pre, task={"name": "vqa", "source": "files", "files": {...}})
    print(vlkit.evaluate(ft, split="val").metrics)
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import yaml

from vlkit.compare.command import ComparisonResult
from vlkit.compare.command import main as compare_command
from vlkit.compare.config import REPLACED_KEYS, comparison_file
from vlkit.compare.spec import CompareSpec, register_configs
from vlkit.config import Problem, SpecError, compose_errors, defaults, merge_known, python_spelling
from vlkit.environment import cache_dir as cache_root
from vlkit.io import atomic_write_text, config_dir, read_yaml
from vlkit.models.base import MODELS, ModelConfig, VLModel, model_name
from vlkit.models.recipe import recipe_of
from vlkit.processor import VLProcessor, load_model_and_processor
from vlkit.registry import TASKS, did_you_mean
from vlkit.runs import PATH_KEYS, given_paths, read_run_info, run_data
from vlkit.train import commands
from vlkit.train import spec as specs
from vlkit.train.spec import EvaluateSpec, FinetuneSpec, PretrainSpec

# How each function names the config keys it takes under another name (`vlkit.config.python_spelling`); any other
# ``a.b.c`` is ``a={"b": {"c": ...}}``. docs/python.md tabulates them.
ARGUMENTS = {
    "pretrain": {"objectives": "mix", "trainer.output_dir": "output_dir", "trainer.seed": "seed", "init": "model"},
    "finetune": {"trainer.output_dir": "output_dir", "trainer.seed": "seed", "init": "model"},
    "evaluate": {"checkpoint": "run"},
    "compare": {"compare": "", "compare.runs": "runs"},
}
_quiet = False


@dataclass
class RunResult(specs.RunResult):
    """The result of a `pretrain` / `finetune` / `evaluate` (`vlkit.train.spec.RunResult`: ``output_dir``,
    ``metrics``, ``history``, ``record``, ``paths``), and its model with its processor (`load`)."""

    def load(self) -> tuple[Any, Any]:
        """(model, processor) of the run (`vlkit.load_model_and_processor`)."""
        return load_model_and_processor(self.output_dir)


def _loadable(result: specs.RunResult) -> RunResult:
    return RunResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(result)})


def set_quiet(quiet: bool = True) -> None:
    """Whether `pretrain`, `finetune`, `evaluate` and `compare` print their summaries (a notebook's cells stay
    short: the results are returned either way); each call's ``quiet=`` overrides it."""
    global _quiet
    _quiet = bool(quiet)


# -- the arguments -------------------------------------------------------------------------------------------------
class _Call:
    """One call's config under construction: the command's defaults with the option of each config group an
    argument names, the values merged into them, and the keys the caller set."""

    def __init__(self, function: str, choices: Mapping[str, str | None] | None = None):
        self.function, self.choices = function, dict(choices or {})
        self.values: list[tuple[str, Any, bool | str]] = []  # (dotted key, value, whether its keys must be known:
        # True, False, or "key": the key itself, its value free-form)
        self.explicit: set[str] = set()

    def spell(self, key: str) -> str:
        return python_spelling(self.function, ARGUMENTS[self.function])(key)

    def choose(self, group: str, option: str) -> None:
        self.choices[group] = option
        self.explicit.add(group)

    def set(self, key: str, value: Any, known: bool | str = True, explicit: bool = True) -> None:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        self.values.append((key, value, known))
        if explicit:
            self.explicit.update(_leaves(key, value))

    def group(self, group: str, value: Any, argument: str) -> None:
        """``argument`` (a name, or a mapping of the group's keys whose ``name`` chooses the option) for ``group``."""
        if value is None:
            return
        if isinstance(value, str):
            self.choose(group, value)
            return
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if not isinstance(value, Mapping):
            raise TypeError(f"{self.function}({argument}={value!r}): give a {group} name or a dict of its keys "
                            f"(conf/{group}/*.yaml)")
        value = dict(value)
        if value.get("name") is not None and group != "trainer":
            self.choose(group, value["name"])
        self.set(group, value)

    def config(self) -> dict[str, Any]:
        """The defaults with every value merged in (a key the command lacks raises `SpecError`)."""
        register_configs(self.function)
        try:
            cfg = defaults(config_dir(), self.function, self.choices)
        except compose_errors()[0] as err:  # an option the group lacks: name the argument that chose it
            raise self._unknown_option(err) from None
        problems: list[Problem] = []
        for key, value, known in self.values:
            *parents, leaf = key.split(".")
            node = cfg
            for part in parents:
                node = node.setdefault(part, {})
            if known == "key" and leaf not in node:
                problems.append(Problem(key, f" is not a known key{did_you_mean(leaf, list(node))}"))
                continue
            try:
                node[leaf] = merge_known(node.get(leaf), value, key, known is True)
            except SpecError as err:
                problems += err.problems
        if problems:
            raise SpecError(problems)
        return cfg

    def _unknown_option(self, err: Exception) -> ValueError:
        """The argument whose group option ``err`` (Hydra's missing config) names, with the closest options."""
        found = re.search(r"Could not find '([^']+)'", str(err))
        group, _, option = (getattr(err, "missing_cfg_file", None) or (found.group(1) if found else "")).strip("/") \
            .rpartition("/")
        if group.startswith("model/"):  # model=<family>/<preset>
            group, option = "model", f"{group.partition('/')[2]}/{option}"
        options = sorted(o for o in getattr(err, "options", None) or [] if not o.startswith("file_"))
        chosen = self.choices.get(group, option)
        return ValueError(f"{self.spell(_GROUP_KEYS.get(group, group))}: unknown {group} {chosen!r}"
                          f"{did_you_mean(chosen, options)}; {group}: {', '.join(options)}")

    def spec(self, build: Callable[[dict[str, Any]], Any]) -> Any:
        """``build(config)``: the spec, its problems named as the caller wrote each key."""
        try:
            return build(self.config())
        except SpecError as err:
            raise err.spelled(self.spell) from None


_GROUP_KEYS = {"compare": "compare.preset"}  # a group chosen by an argument of another name


def _leaves(prefix: str, value: Any) -> list[str]:
    if isinstance(value, Mapping) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(f"{prefix}.{k}", v)]
    return [prefix]


def _argument(function: str, name: str, value: Any, kinds: tuple[type, ...], wanted: str) -> Any:
    """``value`` when it is one of ``kinds`` (or None), else a `TypeError` naming the argument."""
    if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
        raise TypeError(f"{function}({name}={value!r}): give {wanted}")
    return os.fspath(value) if isinstance(value, os.PathLike) else value


_PATH = (str, os.PathLike)


def _no_overrides(function: str, overrides: Any) -> None:
    """``overrides=`` is gone: every key is an argument (or a key of one), spelled as `ARGUMENTS` says."""
    if overrides is None:
        return
    spell = python_spelling(function, ARGUMENTS[function])
    shown = [f"{o!r} -> {spell(o.partition('=')[0].lstrip('+~'))} = {o.partition('=')[2]}"
             for o in (overrides if isinstance(overrides, (list, tuple)) else [overrides]) if isinstance(o, str)]
    raise TypeError(f"{function}(overrides=...) is not taken: give each key as an argument or a key of one, "
                    f"e.g. {function}(trainer={{'max_steps': 3}}, data={{'on_error': 'skip'}})"
                    + (f": {'; '.join(shown)}" if shown else ""))


def _output_dir(function: str, output_dir: Any) -> str:
    _argument(function, "output_dir", output_dir, _PATH, "a folder path (str or os.PathLike)")
    if output_dir is not None:
        return os.fspath(output_dir)
    return str(Path("outputs") / function / datetime.now().strftime("%Y%m%d-%H%M%S-%f"))


def _model(call: _Call, model: Any) -> tuple[Any, VLProcessor | None, str | None]:
    """The model of a pretrain / finetune: a name or a model config (``model``), a run's folder or result (its
    ``init``), or a model built in Python (the spec's ``init`` object). Returns (the init, the model's processor,
    the run's folder)."""
    if isinstance(model, VLModel):
        return model, getattr(model, "processor", None), None
    if isinstance(model, ModelConfig):
        model = {"name": model.family, **model.to_dict()}
    if isinstance(model, specs.RunResult) or (isinstance(model, _PATH) and Path(model).is_dir()):
        return os.fspath(model), None, os.fspath(model)
    if isinstance(model, str):
        call.choose("model", model)
    elif isinstance(model, Mapping):
        call.group("model", model, "model")
    else:
        raise TypeError(f"{call.function}(model={model!r}): give a model (vlkit.build_model), a name such as "
                        f"'uniter/tiny', a model config, or a run's folder")
    return None, None, None


def _data(call: _Call, data: Any, processor: VLProcessor | None, run: str | None, cache_dir: Any,
          needs_pairs: bool = False) -> None:
    """``data``: a data set name, a dict of ``data`` keys (with its ``name``: that data set; without: merged into
    the run's data, else the default one), or image-text pairs (a list of ``(image, caption)``, of ``{image_id,
    caption}`` records, or a torch Dataset of either) read through ``processor``; the processor's tokenizer and
    images either way. Without ``data`` a run (``run``) keeps the data it was trained on."""
    partial = isinstance(data, Mapping) and data.get("name") is None  # keys merged into the data source
    recorded = None
    if run and (Path(run) / "run.json").is_file() and processor is None and (data is None or partial):
        # the run's data, its paths read by vlkit.runs' rule; a path given in ``data`` replaces the recorded one
        names = {dotted: call.spell(dotted) for dotted in PATH_KEYS.values()}
        recorded = run_data(run, given_paths(data) if partial else None, cache_dir, names)
    if data is None or partial:  # the source: the processor's images, else the run's data, else the default
        if processor is not None:
            if data is None and needs_pairs:
                raise ValueError(f"{call.function}: give the image-text pairs to pre-train on (data=): (image, "
                                 "caption) pairs, records, a Dataset, or a data set name or config")
            call.choose("data", "jsonl")
            call.set("data.path", None, explicit=False)  # no captions: the task's own files
        elif recorded:
            call.choose("data", recorded["name"])
            call.set("data", recorded, known=False, explicit=False)  # the keys the run resolved (image.path ...) too
    elif isinstance(data, (str, Mapping)):
        call.group("data", data, "data")
    elif isinstance(data, (Sequence, torch.utils.data.Dataset)) and not isinstance(data, bytes):
        if processor is None:
            raise ValueError(f"{call.function}(data=...): image-text pairs need a processor (vlkit.build_processor) "
                             "to read their images and text: build the model with processor=, or pass processor=")
        call.choose("data", "jsonl")
        call.set("data.path", str(pairs_file(data, processor, cache_dir)))
    else:
        raise TypeError(f"{call.function}(data={data!r}): give image-text pairs, a data set name or a dict of its keys")
    if processor is not None:  # keys vlkit resolved (a run's processor may hold its data set's own)
        call.set("data", processor.data_config, known=False)
    if partial:
        call.set("data", dict(data))


def pairs_file(pairs: Any, processor: Any, cache_dir: Any = None) -> Path:
    """``pairs`` (``(image, caption)`` tuples or ``{image_id, caption}`` records, a list or a torch Dataset) as the
    JSON lines ``data=jsonl`` reads, written once into the cache under a name of their content."""
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


def _common(call: _Call, trainer: Any, output_dir: Any, seed: Any, resume: Any, cache_dir: Any, threads: Any) -> None:
    function = call.function
    if isinstance(trainer, str):
        call.choose("trainer", trainer)
    elif trainer is not None:
        call.group("trainer", trainer, "trainer")
    call.set("trainer.output_dir", _output_dir(function, output_dir))
    if _argument(function, "seed", seed, (int,), "a whole number") is not None:
        call.set("trainer.seed", seed)
    _top(call, resume=resume, cache_dir=cache_dir, threads=threads)


def _top(call: _Call, **values: Any) -> None:
    """The command's own keys (``resume``, ``cache_dir``, ``threads`` ...) when given, their types checked."""
    kinds = {"resume": ((bool,), "True or False"), "cache_dir": (_PATH, "a folder path (str or os.PathLike)"),
             "threads": ((int,), "a whole number"), "workers": ((int,), "a whole number"),
             "output": (_PATH, "a file path"), "predictions": (_PATH, "a file path"),
             "split": ((str,), "a split name")}
    for key, value in values.items():
        value = _argument(call.function, key, value, *kinds[key])
        if value is not None and value is not False:
            call.set(key, value)


def _run(command: Callable[[Any], Any], spec: Any) -> Any:
    """``command(spec)``, the caller's torch thread count kept (a command sets its own: ``threads=``)."""
    threads = torch.get_num_threads()
    try:
        return command(spec)
    finally:
        torch.set_num_threads(threads)


def _given(quiet: bool | None) -> dict[str, Any]:
    return {"quiet": _quiet if quiet is None else bool(quiet)}


# -- the functions -------------------------------------------------------------------------------------------------
def pretrain(model: Any, data: Any = None, *, mix: Any = None, trainer: Any = None, output_dir: Any = None,
             processor: VLProcessor | None = None, seed: int | None = None, resume: bool = False,
             cache_dir: Any = None, threads: int | None = None, quiet: bool | None = None,
             overrides: Any = None) -> RunResult:
    """``vlkit pretrain``: pre-train ``model`` (a model built in Python, a name such as ``"uniter/tiny"``, a model
    config, or a run to continue from) on ``data`` (image-text pairs read through the model's processor, a data
    set name or config; None: a run's own data) with the objective mix ``mix`` (None: the family's own; a preset
    name, a YAML path, a mix dict or ``{objective: ratio}``) and ``trainer`` (a `TrainerConfig`, a dict of its
    keys or a recipe name). ``output_dir``: default ``outputs/pretrain/<time>``; ``quiet``: no summary printed
    (`set_quiet`)."""
    _no_overrides("pretrain", overrides)
    call = _Call("pretrain")
    init, attached, run = _model(call, model)
    _argument("pretrain", "processor", processor, (VLProcessor,), "a processor (vlkit.build_processor)")
    processor = processor or attached
    _data(call, data, processor, run, cache_dir, needs_pairs=True)
    if isinstance(mix, str) and Path(mix).suffix in (".yaml", ".yml") and Path(mix).is_file():
        call.set("objectives", read_yaml(Path(mix), "mix= file"), known=False)
    elif isinstance(mix, str):
        call.choose("objectives", mix)
    elif isinstance(mix, Mapping):
        call.set("objectives", dict(mix), known=False)
    elif mix is not None:
        raise TypeError(f"pretrain(mix={mix!r}): give a mix preset name, a YAML path, or a dict ({{'mlm': 2, 'itm': 1}})")
    _common(call, trainer, output_dir, seed, resume, cache_dir, threads)
    return _train(call, PretrainSpec, commands.pretrain, init, processor, quiet)


def finetune(model: Any, data: Any = None, *, task: Any = "vqa", trainer: Any = None, output_dir: Any = None,
             eval_splits: Sequence[str] | None = None, processor: VLProcessor | None = None, seed: int | None = None,
             resume: bool = False, cache_dir: Any = None, threads: int | None = None, quiet: bool | None = None,
             overrides: Any = None) -> RunResult:
    """``vlkit finetune``: fine-tune ``model`` (a `pretrain` result or run folder, a model built in Python, or a
    name / model config to train from scratch) on ``task`` (a task name, or a dict of ``conf/task`` keys with its
    ``name``: ``{"name": "vqa", "source": "files", "files": {"train": {...}, "val": {...}}}``) and evaluate it on
    ``eval_splits``. ``data``: as in `pretrain`; None keeps the pre-training run's data (tokenizer and images)."""
    _no_overrides("finetune", overrides)
    call = _Call("finetune")
    init, attached, run = _model(call, model)
    _argument("finetune", "processor", processor, (VLProcessor,), "a processor (vlkit.build_processor)")
    processor = processor or attached
    _data(call, data, processor, run, cache_dir)
    _task(call, task)
    if eval_splits is not None:
        call.set("eval_splits", _splits("finetune", "eval_splits", eval_splits), known=False)
    _common(call, trainer, output_dir, seed, resume, cache_dir, threads)
    return _train(call, FinetuneSpec, commands.finetune, init, processor, quiet)


def _train(call: _Call, spec_class: Any, command: Callable[[Any], Any], init: Any, processor: VLProcessor | None,
           quiet: bool | None) -> RunResult:
    """Run a training command (pretrain, finetune) on the spec of ``call`` with ``init`` (a folder or a model)."""
    if isinstance(init, str):
        call.set("init", init)
    spec = call.spec(lambda cfg: spec_class.from_config(
        {**cfg, "init": init}, explicit=frozenset(call.explicit), processor=processor,
        invocation=f"vlkit.{call.function}(...)", **_given(quiet)))
    return _loadable(_run(command, spec))


def _task(call: _Call, task: Any) -> None:
    if isinstance(task, str) or (isinstance(task, Mapping) and task.get("name") is not None) or task is None:
        call.group("task", task, "task")
    elif isinstance(task, Mapping):  # keys of the default task
        call.set("task", dict(task))
    else:
        raise TypeError(f"{call.function}(task={task!r}): give a task name ({', '.join(TASKS.names())}) or a dict "
                        "of its keys with its name ({'name': 'vqa', 'source': 'files', ...})")


def _splits(function: str, name: str, splits: Any) -> list[str]:
    if isinstance(splits, str) or not isinstance(splits, Sequence) or not all(isinstance(s, str) for s in splits):
        raise TypeError(f"{function}({name}={splits!r}): give a list of split names, e.g. ['val']")
    return list(splits)


def evaluate(run: Any, *, split: str | None = None, eval_splits: Sequence[str] | None = None, task: Any = None,
             predictions: Any = None, eval_options: Mapping[str, Any] | None = None, output: Any = None,
             data: Any = None, cache_dir: Any = None, threads: int | None = None, quiet: bool | None = None,
             overrides: Any = None) -> RunResult:
    """``vlkit evaluate``: score a `finetune` result or run folder (or a pre-training run zero-shot on
    ``task="retrieval"``) on ``split`` (else ``eval_splits``, default the run's ``[val]``). ``task``: a dict of
    ``conf/task`` keys overriding the run's (the files of a test split: ``{"files": {"test": {...}}}``);
    ``predictions``: a path to write the split's leaderboard file to; ``eval_options``: the task's scoring
    options; ``output``: the metrics file (default ``<run>/eval.json``). ``metrics``: ``<split>/<metric>``."""
    _no_overrides("evaluate", overrides)
    call = _Call("evaluate")
    _argument("evaluate", "run", run, _PATH, "a run's folder (str or os.PathLike) or the result of finetune / pretrain")
    call.set("checkpoint", os.fspath(run))
    if data is not None:
        call.group("data", data, "data")
    if isinstance(task, Mapping) and not task.get("name"):  # keys of the run's own task
        recorded = read_run_info(run).get("task") if (Path(run) / "run.json").is_file() else None
        task = {"name": recorded, **task} if recorded else dict(task)
    if task is not None:
        _task(call, task)
    _top(call, split=split, predictions=predictions, output=output, cache_dir=cache_dir, threads=threads)
    if eval_splits is not None:
        call.set("eval_splits", _splits("evaluate", "eval_splits", eval_splits), known=False)
    if eval_options:
        call.group("eval_options", dict(eval_options), "eval_options")
    spec = call.spec(lambda cfg: EvaluateSpec.from_config(cfg, explicit=frozenset(call.explicit),
                                                          invocation="vlkit.evaluate(...)", spell=call.spell,
                                                          **_given(quiet)))
    return _loadable(_run(commands.evaluate, spec))


def compare(runs: Sequence[Any] | None = None, data: Any = None, *, preset: str = "default",
            tasks: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
            budget: Mapping[str, Any] | None = None, trainer: Mapping[str, Any] | None = None,
            output_dir: Any = None, workers: int | None = None, threads: int | None = None, cache_dir: Any = None,
            resume: bool = False, quiet: bool | None = None, overrides: Any = None,
            **settings: Any) -> ComparisonResult:
    """``vlkit compare``: the comparison ``preset`` (``conf/compare``: ``default``, ``smoke`` ...; or a YAML path)
    with its ``runs`` replaced when given (a list, each a model name such as ``"uniter/tiny"``, pre-trained with
    the family's own mix, a model built with a processor, or a run dict of the comparison format: ``{name, model,
    objectives, ...}``), on ``data`` (a data set name or config, or image-text pairs; default the preset's).
    ``tasks``, ``seeds``, ``budget``, ``trainer`` and any other ``compare.<key>`` (``settings``: ``title=``,
    ``baseline=`` ...) as in the comparison YAML. Call it under ``if __name__ == "__main__":`` in a script: its
    units run in worker processes that import the script."""
    _no_overrides("compare", overrides)
    if isinstance(runs, (str, bytes, VLModel, Mapping)) or (runs is not None and not isinstance(runs, Sequence)):
        raise TypeError(f"compare(runs={runs!r}): give a list of runs, e.g. compare(['uniter/tiny', 'meter/tiny'])")
    _argument("compare", "preset", preset, _PATH, "a comparison preset name (smoke, default ...) or a YAML path")
    call = _Call("compare")
    file = Path(preset) if Path(preset).suffix in (".yaml", ".yml") and Path(preset).is_file() else None
    call.choose("compare", "default" if file else os.fspath(preset))
    if file is not None:  # the user's comparison file, merged over the default one as `vlkit compare` merges it
        layout = yaml.safe_load(comparison_file(file)) or {}
        for key in ("data", "compare"):
            if layout.get(key):
                _clear_replaced(call, layout[key] if key == "compare" else {})
                call.set(key, layout[key], known=False)
    if data is not None:
        processors = [getattr(run, "processor", None) for run in runs or ()]
        _data(call, data, next((p for p in processors if p is not None), None), None, cache_dir)
    if runs is not None:
        call.set("compare.runs", [_run_spec(run) for run in runs], known=False)
    for key, value in (("tasks", tasks), ("seeds", seeds)):
        if value is not None:
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise TypeError(f"compare({key}={value!r}): give a list, e.g. {key}={['vqa'] if key == 'tasks' else [0, 1]}")
            call.set(f"compare.{key}", list(value), known=False)
    for key, value in (("budget", budget), ("trainer", trainer), *settings.items()):
        if value is not None:
            _clear_replaced(call, {key: value})
            call.set(f"compare.{key}", value, known="key")
    call.set("output_dir", _output_dir("compare", output_dir))
    _top(call, workers=workers, threads=threads, cache_dir=cache_dir, resume=resume)
    spec = call.spec(lambda cfg: CompareSpec.from_config(cfg, call.explicit, **_given(quiet)))
    result = _run(compare_command, spec)
    if result.code != 0:
        failed = "".join(f"\n  {unit}: {error}" for unit, error in result.failed.items())
        raise RuntimeError(f"vlkit.compare: {'some units did not finish' if result.code == 1 else f'stopped ({result.code})'}"
                           f"{failed}\nsee {result.output_dir / 'units.md'}; go on with {result.retry}")
    return result


def _clear_replaced(call: _Call, node: Mapping[str, Any]) -> None:
    """The `REPLACED_KEYS` that ``node`` (``compare`` keys) sets, cleared first: its value replaces the preset's."""
    for key in REPLACED_KEYS:
        if key in node:
            call.set(f"compare.{key}", None, known=False, explicit=False)


def _run_spec(run: Any) -> dict[str, Any]:
    """A run of a comparison: a model name (``uniter/tiny``) or a model built in Python (its config, and its
    processor's images), pre-trained with its family's own mix; else the run dict as given."""
    if isinstance(run, VLModel):
        spec = {"name": f"{run.family}_{run.config.preset}", "model": {"name": run.family, **run.config.to_dict()},
                "objectives": recipe_of(run).mix}
        processor = getattr(run, "processor", None)
        return spec if processor is None else {**spec, "data": {"image": processor.data_config["image"]}}
    if isinstance(run, Mapping):
        return dict(run)
    if not isinstance(run, str):
        raise TypeError(f"compare(runs=[..., {run!r}, ...]): each run is a model name ('uniter/tiny'), a model "
                        "built with a processor, or a run dict ({name, model, objectives})")
    family, preset = model_name(run)
    return {"name": run.replace("/", "_"), "model": {"name": family, "preset": preset},
            "objectives": recipe_of(MODELS.get(family)).mix}


__all__ = ["ARGUMENTS", "ComparisonResult", "RunResult", "compare", "evaluate", "finetune", "pairs_file", "pretrain",
           "set_quiet"]
