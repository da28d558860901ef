"""`vlkit pretrain | finetune | evaluate`: each runs its typed spec (`vlkit.train.spec`) and returns a `RunResult`.

The command line builds the spec from ``conf/{pretrain,finetune,evaluate}.yaml`` and its ``key=value`` settings,
Python from keyword arguments (`vlkit.pretrain` ...); the command itself knows neither. Every training run writes
``<output_dir>/metrics.jsonl``, ``<output_dir>/checkpoints/`` and ``<output_dir>/preflight.json`` (``skipped.jsonl``
too when ``data.on_error=skip`` left examples out), holding its folder's lock (`vlkit.locks`: one writer) while it
runs. With ``init`` the model (its family and sizes) comes from the saved run or the model object; ``model`` keys
the caller set (``spec.explicit``) must agree with it (the preflight says which do not).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from vlkit.config import plain
from vlkit.data.tokenizers import run_tokenizer
from vlkit.environment import prepare_environment
from vlkit.io import atomic_write_text, load_weights
from vlkit.locks import hold
from vlkit.registry import TASKS
from vlkit.runs import PATH_KEYS, TASK_WEIGHTS, given_paths, run_data
from vlkit.runtime import set_threads
from vlkit.tasks import build_task
from vlkit.tasks.predictions import PREDICTIONS, check_predictions_path, write_predictions
from vlkit.train import checkpoint as ckpt, pipeline
from vlkit.train.preflight import Preflight, read_init
from vlkit.train.spec import EvaluateSpec, FinetuneSpec, PretrainSpec, RunResult
from vlkit.train.trainer import CHECKPOINTS

def _announce(spec: Any, what: str, payload: dict) -> None:
    if not spec.quiet:
        print(json.dumps({what: payload}, indent=2, sort_keys=True, default=str))


def _saved_init(spec: Any) -> str | None:
    """``init`` when it names a folder (a run or a saved model); None for none or a model object."""
    return spec.init if isinstance(spec.init, str) else None


def _model_and_preflight(spec: Any):
    """(the model config of the run: ``init``'s when given, else ``spec.model``; a `Preflight` holding the
    ``init`` checks)."""
    check = Preflight()
    check.check_output_dir(spec.trainer.output_dir, spec.trainer.resume)
    if spec.init is not None and not isinstance(spec.init, str):  # a model built in Python: its own config
        model_cfg = {"name": spec.init.family, **spec.init.config.to_dict()}
        if spec.processor is not None and spec.processor.family != spec.init.family:
            check.problem(f"the processor was built for {spec.processor.family}, not {spec.init.family}: "
                          f"build the processor for {spec.init.family} (vlkit.build_processor)")
            check.finish()
        return model_cfg, check
    model_cfg = copy.deepcopy(spec.model)
    before = len(check.problems)
    saved = check.check_init(spec.init, model_cfg, spec.explicit)
    _check_init_on_resume(check, spec)
    if spec.processor is not None and model_cfg and spec.processor.family != model_cfg.get("name") and saved is None:
        check.problem(f"the processor was built for {spec.processor.family}, not {model_cfg.get('name')}: build "
                      f"the processor for {model_cfg.get('name')} (vlkit.build_processor), or the model by name")
    if len(check.problems) > before:
        check.finish()  # the model to build is unclear: stop before preparing any data for it
    return (saved if saved is not None else model_cfg), check


def _check_init_on_resume(check: Any, spec: Any) -> None:
    """``init`` with ``resume``: a resumed run continues from its own checkpoint, so an ``init`` it did not start
    from would be ignored (and its tokenizer differ): a problem about init= and resume=, not the tokenizer."""

    init, out = _saved_init(spec), spec.trainer.output_dir
    if not (init and spec.trainer.resume and out):
        return
    path = ckpt.latest_checkpoint(Path(out) / CHECKPOINTS)
    if path is None:
        return  # nothing to resume: init= starts the run
    try:
        started = ((ckpt.read_state(path, verify=False).get("run") or {}).get("data") or {}).get("tokenizer")
    except ckpt.CheckpointError:
        return  # check_resume names the damaged checkpoint
    ours = spec.data.get("tokenizer") if "data.tokenizer" in spec.explicit else run_tokenizer(init)
    if started is None or ours is None or str(started) == str(ours):
        return  # the run started from this init= (the same command again): resume it
    check.problem(f"init={init} with resume=true: trainer.output_dir={out} holds a run ({path}) that did not start "
                  f"from init={init} (its tokenizer is {started!r}, init='s {ours!r}); resume=true continues that run "
                  "from its own checkpoint, so init= would be ignored: drop init= to resume it, or drop resume=true "
                  "and choose another trainer.output_dir to start a run from init=")


def _run_data(data_cfg: Any, run: str | Path | None, explicit: set[str] | frozenset[str]) -> dict[str, Any]:
    """``data_cfg`` with the tokenizer a saved ``run`` (``init`` / ``checkpoint``) uses
    (`vlkit.data.tokenizers.run_tokenizer`), unless the caller sets ``data.tokenizer``."""
    data = plain(data_cfg)
    saved = run_tokenizer(run) if run else None
    if saved and "data.tokenizer" not in explicit:
        data["tokenizer"] = saved
    return data


def _prepare(spec: Any, model_cfg: dict[str, Any], check: Any):
    """(environment, model) of a pretrain / finetune run; the tokenizer checked against the model and ``init``."""
    from accelerate.utils import set_seed

    init = _saved_init(spec)
    data = _run_data(spec.data, init, spec.explicit)
    env = prepare_environment(model_cfg, data, spec.cache_dir, init=spec.init)  # a model: its own sizes
    set_seed(spec.trainer.seed)  # after the environment: a first feature extraction draws from the global RNG
    if init is None and spec.init is not None:  # a model built in Python: a copy of it (the caller's stays as it is)
        model = pipeline.build_run_model(env)
        model.load_state_dict(spec.init.state_dict())
    else:
        model = pipeline.build_run_model(env, init)
    if spec.processor is not None:
        model.processor = spec.processor  # saved beside the run's model
    check.check_tokenizer(env.tokenizer, env.data["tokenizer"], model, init)
    return env, model


def _result(kind: str, output_dir: str | Path, history: list, metrics: dict) -> RunResult:
    """The result of the run in ``output_dir``: its ``metrics`` and ``history`` as computed, its record and files."""
    output_dir = Path(output_dir)
    record = pipeline.read_run_info(output_dir)
    files = {"model": output_dir / "model", "tokenizer": output_dir / "tokenizer", "run": output_dir / "run.json",
             "metrics": output_dir / "metrics.jsonl", "checkpoints": output_dir / "checkpoints"}
    return RunResult(kind, output_dir, dict(metrics), list(history), record,
                     {k: v for k, v in files.items() if v.exists()})


def pretrain(spec: PretrainSpec) -> RunResult:
    """Pre-train ``spec.model`` (or ``spec.init``'s) on ``spec.data`` with the objective mix ``spec.objectives``
    (default: the family's own)."""
    with hold(spec.writes(), command=spec.invocation or "vlkit pretrain"):  # one writer per output folder
        model_cfg, check = _model_and_preflight(spec)
        set_threads(spec.threads, model_cfg.get("preset"))
        env, model = _prepare(spec, model_cfg, check)
        trainer_cfg = spec.trainer.to_dict()
        _, result = pipeline.pretrain_model(env, model, spec.objectives, trainer_cfg, spec.output_dir,
                                            spec.trainer.seed, preflight=check)
    last = result.history[-1] if result.history else {}
    _announce(spec, "pretrain", {"output_dir": spec.output_dir, "steps": result.step, "last": last})
    return _result("pretrain", spec.output_dir, result.history, last)


def finetune(spec: FinetuneSpec) -> RunResult:
    """Fine-tune ``spec.model`` (from scratch, or from a pre-training run or model with ``spec.init``) on
    ``spec.task``."""
    with hold(spec.writes(), command=spec.invocation or "vlkit finetune"):
        model_cfg, check = _model_and_preflight(spec)
        set_threads(spec.threads, model_cfg.get("preset"))
        env, model = _prepare(spec, model_cfg, check)
        init = _saved_init(spec)
        if init and (Path(init) / pipeline.PRETRAINING_WEIGHTS).exists():
            model = pipeline.load_pretraining(init, model)  # its heads: retrieval starts from the ITM head
        trainer_cfg = spec.trainer.to_dict()
        _, _, result, metrics = pipeline.finetune_task(env, model, spec.task, trainer_cfg, spec.output_dir,
                                                       spec.trainer.seed, tuple(spec.eval_splits), preflight=check)
    _announce(spec, "finetune", {"output_dir": spec.output_dir, "metrics": metrics})
    return _result("finetune", spec.output_dir, result.history, metrics)


def evaluate(spec: EvaluateSpec) -> RunResult:
    """Evaluate a fine-tuning run (``spec.checkpoint``: its output_dir), or a pre-training run zero-shot on
    ``task`` (retrieval with the pre-training ITM head). A converted official checkpoint (``vlkit convert``)
    records no data: ``data`` and ``task`` name them.

    ``split`` evaluates that split alone (else ``eval_splits``); the ``task.<key>`` values the caller sets
    override the run's task config (e.g. the files of a test split); ``eval_options`` the task's scoring options
    (VQA ``rules``, RefExp ``iou_boxes`` / ``iou_comparison``, retrieval ``ties`` / ``uniter_ir_rows``).
    ``predictions`` writes the split's predictions in its leaderboard format (`vlkit.tasks.predictions`);
    metrics are computed too when the split has labels.
    """
    with hold(spec.writes(), command=spec.invocation or "vlkit evaluate"):
        return _evaluate(spec)


def _evaluate(spec: EvaluateSpec) -> RunResult:
    directory = Path(spec.checkpoint)
    splits = (spec.split,) if spec.split else tuple(spec.eval_splits)
    if spec.predictions and len(splits) != 1:
        raise ValueError(f"predictions={spec.predictions} writes one split: name it with split= (eval_splits has "
                         f"{len(splits)})")
    for key in ("predictions", "output"):  # files to write, checked before the split is predicted
        if getattr(spec, key):
            check_predictions_path(getattr(spec, key), key)
    info = pipeline.read_run_info(directory)
    if info["kind"] not in ("pretrain", "finetune"):
        raise ValueError(f"{directory} holds a {info['kind']} without heads: fine-tune it (init={directory}) first")
    _, model_cfg = read_init(directory)  # the run's model config: its input geometry
    set_threads(spec.threads, model_cfg.get("preset"))
    eval_options = dict(spec.eval_options)
    name = spec.task.get("name")
    if info["kind"] == "finetune":
        if name is not None and name != info["task"]:
            raise ValueError(f"task={name}: {directory} is a {info['task']} run; task={info['task']} (or no "
                             f"task=) evaluates it, task.<key>= overriding its recorded task config")
        task_cfg = info["task_cfg"] if info.get("task_cfg") is not None else plain(spec.task)
        if task_cfg.get("name") != info["task"]:
            raise ValueError(f"{directory} holds a {info['task']} task that records no data: pass task={info['task']} "
                             "and data= for it")
        task_cfg = _override_task(task_cfg, spec.task, spec.explicit)
    elif name != "retrieval":
        raise ValueError(f"{directory} is a pre-training run: only zero-shot retrieval evaluates one (task=retrieval)")
    else:
        task_cfg = plain(spec.task)
    _check_eval_options(task_cfg["name"], eval_options)
    if spec.predictions:
        fmt = PREDICTIONS.get(task_cfg["name"])  # an unknown format fails before any work
    recorded = spec.data  # a run that records no data: the caller's; else the run's, its paths read by vlkit.runs
    if info.get("data") is not None:  # (gone / not-own paths refused), a path the caller sets replacing the recorded
        names = {key: spec.spell(key) for key in PATH_KEYS.values()} if spec.spell else None
        recorded = run_data(directory, given_paths(spec.data, spec.explicit), spec.cache_dir, names)
    data_cfg = _run_data(recorded, directory, spec.explicit)
    env = prepare_environment(model_cfg, data_cfg, spec.cache_dir, init=directory)
    if info["kind"] == "finetune":
        model = pipeline.from_pretrained(directory / "model")
        if info.get("pretraining"):  # a task that kept pre-training heads (retrieval's ITM head)
            model = pipeline.rebuild_pretraining(model, info["pretraining"])
        task = build_task(info["task"], model, **{**info["options"], **eval_options})
        load_weights(task, directory / TASK_WEIGHTS)
    else:
        task = TASKS.get("retrieval").zero_shot(pipeline.load_pretraining(directory), **eval_options)
    data = type(task).build_data(task_cfg, env.tokenizer, env.image_source, env.world)
    check = Preflight()
    check.check_tokenizer(env.tokenizer, env.data["tokenizer"], task, directory)
    pipeline.check_task_data(check, task.name, _without_train(data), task, splits, task_cfg, none=False)
    check.finish()
    batch_size = task_cfg.get("eval_batch_size", 64)
    announced: dict[str, Any] = {"checkpoint": str(directory)}
    paths: dict[str, Path] = {}
    metrics: dict[str, Any] = {}
    scored = splits
    if spec.predictions:
        announced["predictions"] = write_predictions(task, data.eval[splits[0]], spec.predictions, batch_size)
        paths["predictions"] = Path(spec.predictions)
        scored = splits if fmt.labelled(data.eval[splits[0]]) else ()
    if scored:
        metrics = pipeline.evaluate_task(task, data, scored, batch_size)
        out = Path(spec.output or directory / "eval.json")
        atomic_write_text(out, json.dumps(metrics, indent=2, sort_keys=True))
        announced.update(metrics=metrics, written=str(out))
        paths["eval"] = out
    _announce(spec, "evaluate", announced)
    result = _result("evaluate", directory, [], metrics)
    result.paths.update(paths)
    return result


def _check_eval_options(task: str, options: dict) -> None:
    """``eval_options.<key>`` must be an option of the task's constructor."""
    import inspect

    accepted = inspect.signature(TASKS.get(task)).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        scoring = [k for k in ("rules", "iou_boxes", "iou_comparison", "ties", "uniter_ir_rows") if k in accepted]
        raise ValueError(f"eval_options.{unknown[0]} does not apply to task {task} (its scoring options: "
                         f"{', '.join(scoring) or 'none'})")


def _override_task(recorded: dict, given: dict, keys: Any) -> dict:
    """The run's task config with the ``task.<key>`` values the caller sets (not ``task.name``)."""
    out = copy.deepcopy(recorded)
    for key in sorted(k for k in keys if k.startswith("task.") and k != "task.name"):
        *parents, leaf = key.split(".")[1:]
        value = given
        for part in (*parents, leaf):
            value = value[part]
        node = out
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = copy.deepcopy(value)
    return out


def _without_train(data: Any) -> Any:
    """A copy of a `TaskData` without its training set (evaluation checks only the evaluation splits)."""
    import dataclasses

    return dataclasses.replace(data, train=None)

