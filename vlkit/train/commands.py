"""`vlkit pretrain | finetune | evaluate`: Hydra apps over ``conf/{pretrain,finetune,evaluate}.yaml``.

Every command accepts ``model=``, ``model.preset=``, ``objectives=``, ``data=``, ``task=``,
``trainer.max_steps=``, ``trainer.seed=``, ``trainer.output_dir=`` and ``resume=``; every training
run writes ``<output_dir>/metrics.jsonl``, ``<output_dir>/checkpoints/`` and ``<output_dir>/preflight.json``
(``skipped.jsonl`` too when ``data.on_error=skip`` left examples out). With ``init=`` the model (its
family and sizes) comes from the saved run; ``model=`` / ``model.<field>=`` given on the command line
must agree with it (the preflight says which do not). ``overrides``: the command line's ``key=value``
strings, from which the explicitly set keys are read.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from vlkit.config import plain
from vlkit.environment import prepare_environment
from vlkit.runtime import set_threads
from vlkit.train import pipeline


def _announce(what: str, payload: dict) -> None:
    print(json.dumps({what: payload}, indent=2, sort_keys=True, default=str))


def explicit_keys(overrides: Sequence[str] | None) -> set[str]:
    """The config keys a command line sets (``model=uniter`` -> ``model``, ``+a.b=1`` -> ``a.b``)."""
    keys = set()
    for override in overrides or ():
        key, sep, _ = override.partition("=")
        if sep:
            keys.add(key.lstrip("+~"))
    return keys


def _model_and_preflight(cfg, overrides: Sequence[str] | None):
    """(the model config of the run: ``init``'s when given, else ``cfg.model``; a `Preflight` holding the
    ``init=`` checks)."""
    from vlkit.train.preflight import Preflight

    check = Preflight()
    check.check_output_dir(cfg.trainer.output_dir, bool(cfg.resume))
    model_cfg = plain(cfg.model)
    before = len(check.problems)
    saved = check.check_init(cfg.get("init"), model_cfg, explicit_keys(overrides))
    _check_init_on_resume(check, cfg, explicit_keys(overrides))
    if len(check.problems) > before:
        check.finish()  # the model to build is unclear: stop before preparing any data for it
    return (saved if saved is not None else model_cfg), check


def _check_init_on_resume(check: Any, cfg: Any, explicit: set[str]) -> None:
    """``init=`` with ``resume=true``: a resumed run continues from its own checkpoint, so an ``init=`` it did not
    start from would be ignored (and its tokenizer differ): a problem about init= and resume=, not the tokenizer."""
    from vlkit.data.tokenizers import run_tokenizer
    from vlkit.train import checkpoint as ckpt
    from vlkit.train.trainer import CHECKPOINTS

    init, out = cfg.get("init"), cfg.trainer.get("output_dir")
    if not (init and cfg.resume and out):
        return
    path = ckpt.latest_checkpoint(Path(out) / CHECKPOINTS)
    if path is None:
        return  # nothing to resume: init= starts the run
    try:
        started = ((ckpt.read_state(path, verify=False).get("run") or {}).get("data") or {}).get("tokenizer")
    except ckpt.CheckpointError:
        return  # check_resume names the damaged checkpoint
    ours = cfg.data.get("tokenizer") if "data.tokenizer" in explicit else run_tokenizer(init)
    if started is None or ours is None or str(started) == str(ours):
        return  # the run started from this init= (the same command again): resume it
    check.problem(f"init={init} with resume=true: trainer.output_dir={out} holds a run ({path}) that did not start "
                  f"from init={init} (its tokenizer is {started!r}, init='s {ours!r}); resume=true continues that run "
                  "from its own checkpoint, so init= would be ignored: drop init= to resume it, or drop resume=true "
                  "and choose another trainer.output_dir to start a run from init=")


def _run_data(data_cfg: Any, run: str | Path | None, given: Any, explicit: set[str]) -> dict[str, Any]:
    """``data_cfg`` with the tokenizer a saved ``run`` (``init=`` / ``checkpoint=``) uses
    (`vlkit.data.tokenizers.run_tokenizer`), unless the command line sets ``data.tokenizer`` (``given``)."""
    from vlkit.data.tokenizers import run_tokenizer

    data = plain(data_cfg)
    saved = run_tokenizer(run) if run else None
    if "data.tokenizer" in explicit:
        data["tokenizer"] = given
    elif saved:
        data["tokenizer"] = saved
    return data


def _prepare(cfg, model_cfg: dict[str, Any], check: Any, overrides: Sequence[str] | None):
    """(environment, model) of a pretrain / finetune run; the tokenizer checked against the model and ``init=``."""
    from accelerate.utils import set_seed

    data = _run_data(cfg.data, cfg.get("init"), cfg.data.get("tokenizer"), explicit_keys(overrides))
    env = prepare_environment(model_cfg, data, cfg.get("cache_dir"), init=cfg.get("init"))
    set_seed(cfg.trainer.seed)  # after the environment: a first feature extraction draws from the global RNG
    model = pipeline.build_run_model(env, cfg.get("init"))
    check.check_tokenizer(env.tokenizer, env.data["tokenizer"], model, cfg.get("init"))
    return env, model


def pretrain(cfg, overrides: Sequence[str] | None = None) -> int:
    """Pre-train ``model`` on ``data`` with the objective mix ``objectives`` (default: the family's own)."""
    seed = cfg.trainer.seed
    model_cfg, check = _model_and_preflight(cfg, overrides)
    set_threads(cfg.get("threads"), model_cfg.get("preset"))
    env, model = _prepare(cfg, model_cfg, check, overrides)
    trainer_cfg = plain(cfg.trainer) | {"resume": bool(cfg.resume)}
    _, result = pipeline.pretrain_model(env, model, cfg.get("objectives"), trainer_cfg, cfg.trainer.output_dir, seed,
                                        preflight=check)
    last = result.history[-1] if result.history else {}
    _announce("pretrain", {"output_dir": cfg.trainer.output_dir, "steps": result.step, "last": last})
    return 0


def finetune(cfg, overrides: Sequence[str] | None = None) -> int:
    """Fine-tune ``model`` (from scratch, or from a pre-training run with ``init=``) on ``task``."""
    if cfg.task.name is None:
        from vlkit.registry import TASKS

        raise ValueError(f"vlkit finetune needs a task: task={' | '.join(TASKS.names())}")
    seed = cfg.trainer.seed
    model_cfg, check = _model_and_preflight(cfg, overrides)
    set_threads(cfg.get("threads"), model_cfg.get("preset"))
    env, model = _prepare(cfg, model_cfg, check, overrides)
    if cfg.get("init") and (Path(cfg.init) / pipeline.PRETRAINING_WEIGHTS).exists():
        model = pipeline.load_pretraining(cfg.init, model)  # its heads: retrieval starts from the ITM head
    trainer_cfg = plain(cfg.trainer) | {"resume": bool(cfg.resume)}
    *_, metrics = pipeline.finetune_task(env, model, cfg.task, trainer_cfg, cfg.trainer.output_dir, seed,
                                         tuple(cfg.eval_splits), preflight=check)
    _announce("finetune", {"output_dir": cfg.trainer.output_dir, "metrics": metrics})
    return 0


def evaluate(cfg, overrides: Sequence[str] | None = None) -> int:
    """Evaluate a fine-tuning run (``checkpoint=`` its output_dir), or a pre-training run zero-shot
    on ``task`` (retrieval with the pre-training ITM head). A converted official checkpoint
    (``vlkit convert``) records no data: ``data=`` and ``task=`` name them.

    ``split=NAME`` evaluates that split alone (else ``eval_splits``); ``task=<the run's task> task.<key>=``
    given on the command line overrides the run's task config (e.g. the files of a test split); ``eval_options.<key>=``
    the task's scoring options (VQA ``rules``, RefExp ``iou_boxes`` / ``iou_comparison``, retrieval
    ``ties`` / ``uniter_ir_rows``). ``predictions=PATH`` writes the split's predictions in its leaderboard format
    (`vlkit.tasks.predictions`); metrics are computed too when the split has labels.
    """
    from vlkit.io import atomic_write_text, load_weights
    from vlkit.registry import TASKS
    from vlkit.tasks import build_task
    from vlkit.train.preflight import Preflight, read_init

    directory = Path(cfg.checkpoint)
    splits = (str(cfg.split),) if cfg.get("split") else tuple(cfg.eval_splits)
    if cfg.get("predictions") and len(splits) != 1:
        raise ValueError(f"predictions={cfg.predictions} writes one split: name it with split= (eval_splits has "
                         f"{len(splits)})")
    from vlkit.tasks.predictions import check_predictions_path

    for key in ("predictions", "output"):  # files to write, checked before the split is predicted
        if cfg.get(key):
            check_predictions_path(cfg[key], key)
    info = pipeline.read_run_info(directory)
    if info["kind"] not in ("pretrain", "finetune"):
        raise ValueError(f"{directory} holds a {info['kind']} without heads: fine-tune it (init={directory}) first")
    _, model_cfg = read_init(directory)  # the run's model config: its input geometry
    set_threads(cfg.get("threads"), model_cfg.get("preset"))
    eval_options = {k: v for k, v in (plain(cfg.get("eval_options")) or {}).items() if v is not None}
    if info["kind"] == "finetune":
        if cfg.task.name is not None and cfg.task.name != info["task"]:
            raise ValueError(f"task={cfg.task.name}: {directory} is a {info['task']} run; task={info['task']} (or no "
                             f"task=) evaluates it, task.<key>= overriding its recorded task config")
        task_cfg = info["task_cfg"] if info.get("task_cfg") is not None else plain(cfg.task)
        if task_cfg.get("name") != info["task"]:
            raise ValueError(f"{directory} holds a {info['task']} task that records no data: pass task={info['task']} "
                             "and data= for it")
        task_cfg = _override_task(task_cfg, plain(cfg.task), explicit_keys(overrides))
    elif cfg.task.name != "retrieval":
        raise ValueError(f"{directory} is a pre-training run: only zero-shot retrieval evaluates one (task=retrieval)")
    else:
        task_cfg = plain(cfg.task)
    _check_eval_options(task_cfg["name"], eval_options)
    if cfg.get("predictions"):
        from vlkit.tasks.predictions import PREDICTIONS

        fmt = PREDICTIONS.get(task_cfg["name"])  # an unknown format fails before any work
    data_cfg = _run_data(info["data"] if info.get("data") is not None else cfg.data, directory,
                         cfg.data.get("tokenizer"), explicit_keys(overrides))
    env = prepare_environment(model_cfg, data_cfg, cfg.get("cache_dir"), init=directory)
    if info["kind"] == "finetune":
        model = pipeline.from_pretrained(directory / "model")
        if info.get("pretraining"):  # a task that kept pre-training heads (retrieval's ITM head)
            model = pipeline.rebuild_pretraining(model, info["pretraining"])
        task = build_task(info["task"], model, **{**info["options"], **eval_options})
        load_weights(task, directory / pipeline.TASK_WEIGHTS)
    else:
        task = TASKS.get("retrieval").zero_shot(pipeline.load_pretraining(directory), **eval_options)
    data = type(task).build_data(task_cfg, env.tokenizer, env.image_source, env.world)
    check = Preflight()
    check.check_tokenizer(env.tokenizer, env.data["tokenizer"], task, directory)
    pipeline.check_task_data(check, task.name, _without_train(data), task, splits)
    check.finish()
    batch_size = task_cfg.get("eval_batch_size", 64)
    announced: dict[str, Any] = {"checkpoint": str(directory)}
    scored = splits
    if cfg.get("predictions"):
        from vlkit.tasks.predictions import write_predictions

        announced["predictions"] = write_predictions(task, data.eval[splits[0]], cfg.predictions, batch_size)
        scored = splits if fmt.labelled(data.eval[splits[0]]) else ()
    if scored:
        metrics = pipeline.evaluate_task(task, data, scored, batch_size)
        out = Path(cfg.get("output") or directory / "eval.json")
        atomic_write_text(out, json.dumps(metrics, indent=2, sort_keys=True))
        announced.update(metrics=metrics, written=str(out))
    _announce("evaluate", announced)
    return 0


def _check_eval_options(task: str, options: dict) -> None:
    """``eval_options.<key>`` must be an option of the task's constructor."""
    import inspect

    from vlkit.registry import TASKS

    accepted = inspect.signature(TASKS.get(task)).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        scoring = [k for k in ("rules", "iou_boxes", "iou_comparison", "ties", "uniter_ir_rows") if k in accepted]
        raise ValueError(f"eval_options.{unknown[0]} does not apply to task {task} (its scoring options: "
                         f"{', '.join(scoring) or 'none'})")


def _override_task(recorded: dict, given: dict, keys: set[str]) -> dict:
    """The run's task config with the ``task.<key>`` values the command line sets (not ``task.name``)."""
    import copy

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

