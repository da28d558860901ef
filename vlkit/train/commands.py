"""`vlkit pretrain | finetune | evaluate`: Hydra apps over ``conf/{pretrain,finetune,evaluate}.yaml``.

Every command accepts ``model=``, ``model.preset=``, ``objectives=``, ``data=``, ``task=``,
``trainer.max_steps=``, ``trainer.seed=``, ``trainer.output_dir=`` and ``resume=``; every training
run writes ``<output_dir>/metrics.jsonl`` and ``<output_dir>/checkpoints/``.
"""
from __future__ import annotations

import json
from pathlib import Path

from vlkit.train import pipeline


def _announce(what: str, payload: dict) -> None:
    print(json.dumps({what: payload}, indent=2, sort_keys=True, default=str))


def pretrain(cfg) -> int:
    """Pre-train ``model`` on ``data`` with the objective mix ``objectives`` (default: the family's own)."""
    from accelerate.utils import set_seed

    pipeline.set_threads(cfg.get("threads"), cfg.model.get("preset"))
    seed = cfg.trainer.seed
    env = pipeline.prepare_environment(cfg.model, cfg.data, cfg.get("cache_dir"))
    set_seed(seed)  # after the environment: a first feature extraction draws from the global RNG
    model = pipeline.build_run_model(env, cfg.model, cfg.get("init"))
    trainer_cfg = pipeline.plain(cfg.trainer) | {"resume": bool(cfg.resume)}
    _, result = pipeline.pretrain_model(env, model, cfg.get("objectives"), trainer_cfg, cfg.trainer.output_dir, seed)
    last = result.history[-1] if result.history else {}
    _announce("pretrain", {"output_dir": cfg.trainer.output_dir, "steps": result.step, "last": last})
    return 0


def finetune(cfg) -> int:
    """Fine-tune ``model`` (from scratch, or from a pre-training run with ``init=``) on ``task``."""
    from accelerate.utils import set_seed

    if cfg.task.name is None:
        from vlkit.registry import TASKS

        raise ValueError(f"vlkit finetune needs a task: task={' | '.join(TASKS.names())}")
    seed = cfg.trainer.seed
    model_cfg = pipeline.saved_model_config(cfg.init) if cfg.get("init") else cfg.model  # the model comes from init
    pipeline.set_threads(cfg.get("threads"), model_cfg.get("preset"))
    env = pipeline.prepare_environment(model_cfg, cfg.data, cfg.get("cache_dir"))
    set_seed(seed)  # after the environment: a first feature extraction draws from the global RNG
    model = pipeline.build_run_model(env, cfg.model, cfg.get("init"))
    if cfg.get("init") and (Path(cfg.init) / pipeline.PRETRAINING_WEIGHTS).exists():
        model = pipeline.load_pretraining(cfg.init, model)  # its heads: retrieval starts from the ITM head
    trainer_cfg = pipeline.plain(cfg.trainer) | {"resume": bool(cfg.resume)}
    *_, metrics = pipeline.finetune_task(env, model, cfg.task, trainer_cfg, cfg.trainer.output_dir, seed,
                                         tuple(cfg.eval_splits))
    _announce("finetune", {"output_dir": cfg.trainer.output_dir, "metrics": metrics})
    return 0


def evaluate(cfg) -> int:
    """Evaluate a fine-tuning run (``checkpoint=`` its output_dir), or a pre-training run zero-shot
    on ``task`` (retrieval with the pre-training ITM head). A converted official checkpoint
    (``vlkit convert``) records no data: ``data=`` and ``task=`` name them."""
    from safetensors.torch import load_model

    from vlkit.tasks import build_task

    directory = Path(cfg.checkpoint)
    info_path = directory / pipeline.RUN_INFO
    if not info_path.is_file():
        raise FileNotFoundError(f"{info_path} is missing: checkpoint= must name a vlkit pretrain or finetune output_dir")
    info = json.loads(info_path.read_text())
    if info["kind"] not in ("pretrain", "finetune"):
        raise ValueError(f"{directory} holds a {info['kind']} without heads: fine-tune it (init={directory}) first")
    model_dir = directory / "model"
    model_cfg = pipeline.saved_model_config(directory)  # the run's model config: its input geometry
    pipeline.set_threads(cfg.get("threads"), model_cfg.get("preset"))
    data_cfg = info["data"] if info.get("data") is not None else cfg.data
    env = pipeline.prepare_environment(model_cfg, data_cfg, cfg.get("cache_dir"))
    if info["kind"] == "finetune":
        task_cfg = info["task_cfg"] if info.get("task_cfg") is not None else pipeline.plain(cfg.task)
        if task_cfg.get("name") != info["task"]:
            raise ValueError(f"{directory} holds a {info['task']} task that records no data: pass task={info['task']} "
                             "and data= for it")
        model = pipeline.from_pretrained(model_dir)
        if info.get("pretraining"):  # a task that kept pre-training heads (retrieval's ITM head)
            model = pipeline.rebuild_pretraining(model, info["pretraining"])
        task = build_task(info["task"], model, **info["options"])
        load_model(task, str(directory / pipeline.TASK_WEIGHTS), strict=True)
    else:
        if cfg.task.name != "retrieval":
            raise ValueError(f"{directory} is a pre-training run: only zero-shot retrieval evaluates one (task=retrieval)")
        task_cfg = pipeline.plain(cfg.task)
        task = build_task("retrieval", pipeline.load_pretraining(directory), scorer="itm")
    data = type(task).build_data(task_cfg, env.tokenizer, env.image_source, env.world)
    metrics = pipeline.evaluate_task(task, data, tuple(cfg.eval_splits), task_cfg.get("eval_batch_size", 64))
    out = Path(cfg.get("output") or directory / "eval.json")
    out.write_text(json.dumps(metrics, indent=2, sort_keys=True))
    _announce("evaluate", {"checkpoint": str(directory), "metrics": metrics, "written": str(out)})
    return 0
