"""What a resume may change: the configuration a checkpoint was saved with against the one continuing it.

Every checkpoint records the trainer config (``config``) and, from the run commands, the run it belongs
to (``run``: the model family and config, the data config and its number of training examples, the
objective mix or the task, the seed). ``resume=true`` with any other value is refused, each key named
with both values, before anything is loaded or written. Only the keys of `SAFE_TO_CHANGE` may differ:
they change neither the data order, the batches, the model, the optimiser nor the schedule's state.
``trainer.max_steps`` lengthens or shortens the run: the schedule (and a fractional warm-up) follows
the new total from the resumed step on.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

SAFE_TO_CHANGE = ("trainer.max_steps", "trainer.output_dir", "trainer.resume", "trainer.log_every",
                  "trainer.eval_every", "trainer.save_every", "trainer.keep_checkpoints", "trainer.trackers",
                  "trainer.progress", "trainer.num_workers", "trainer.activation_checkpointing")


class ResumeMismatchError(ValueError):
    """``resume=true`` with a configuration that differs from the checkpoint's; ``problems`` lists each key."""

    def __init__(self, checkpoint: Any, problems: list[str]):
        self.checkpoint, self.problems = checkpoint, list(problems)
        super().__init__(resume_message(checkpoint, problems))


def run_record(model: Any, data: Mapping[str, Any] | None, examples: int | None = None, **parts: Any) -> dict[str, Any]:
    """The ``run`` a checkpoint records: ``model`` (family and config), ``data`` (config and example count)
    and ``parts`` (``objectives=`` the mix or ``task=`` the task config, ``seed=``)."""
    inner = model
    while not hasattr(inner, "family") and hasattr(inner, "model"):
        inner = inner.model
    record: dict[str, Any] = {"model": {"family": inner.family, **inner.config.to_dict()},
                              "data": {**dict(data or {}), **({"examples": examples} if examples is not None else {})},
                              **parts}
    return json.loads(json.dumps(record, default=str))  # as trainer_state.json holds it


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}"))
        return out
    return {prefix: value}


_UNSET = object()


def _show(value: Any) -> str:
    return "<not set>" if value is _UNSET else repr(value)


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``key=<now> (the checkpoint has <then>)`` for every differing key outside `SAFE_TO_CHANGE`. Trainer keys
    and run sections an older checkpoint did not record are not compared; another model family is one
    difference (not one per model field)."""
    current = json.loads(json.dumps(dict(current), default=str))  # as trainer_state.json would hold it
    then = {**_flatten(saved.get("config") or {}, "trainer"), **_flatten(saved.get("run") or {}, "")}
    now = {**_flatten(current.get("config") or {}, "trainer"), **_flatten(current.get("run") or {}, "")}
    then, now = ({k.lstrip("."): v for k, v in d.items()} for d in (then, now))
    sections = {k.split(".")[0] for k in then} & {k.split(".")[0] for k in now}
    problems = []
    family = then.get("model.family"), now.get("model.family")
    other_family = None not in family and family[0] != family[1]
    if other_family:
        problems.append(f"model={family[1]}: the checkpoint holds a {family[0]} model (resume with model={family[0]})")
    for key in sorted(set(then) | set(now)):
        section = key.split(".")[0]
        if key in SAFE_TO_CHANGE or section not in sections or (other_family and section == "model"):
            continue
        if section == "trainer" and not (key in then and key in now):
            continue
        if then.get(key, _UNSET) != now.get(key, _UNSET):
            problems.append(f"{key}={_show(now.get(key, _UNSET))} (the checkpoint has {_show(then.get(key, _UNSET))})")
    return problems


def resume_message(checkpoint: Any, problems: list[str]) -> str:
    lines = "\n".join(f"  - {p}" for p in problems)
    return (f"resume=true continues {checkpoint}, which was saved with another configuration:\n{lines}\n"
            f"Resume with the checkpoint's values, or start a new run in another trainer.output_dir. Safe to "
            f"change on resume: {', '.join(SAFE_TO_CHANGE)}")


__all__ = ["SAFE_TO_CHANGE", "ResumeMismatchError", "run_record", "differences", "resume_message"]
