"""Type and range checks of a command's keys, on its composed config, before any data is read or written.

`check_settings` runs in `vlkit.cli.run` between composing a command's config and calling the command: every
value of `RULES` present in the config is checked (a whole number, a number, true / false, and its range),
and ``trainer.*`` through `vlkit.train.trainer.TrainerConfig` for the training commands, so that
``trainer.max_steps=abc`` is refused at once, not after a feature extraction. Each problem names the key as
the user writes it on the command line (``compare.checkpoint_every``, not the trainer field it becomes), and
every problem is listed at once (`SettingsError`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class SettingsError(ValueError):
    """Values of a command's keys that the command cannot run with; ``problems`` lists each, naming its key."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class Rule:
    """A key's value: ``kind`` int (a whole number), float (a finite number) or bool; at least ``low`` (above it
    when ``above``), at most ``high``; null allowed (the key's documented default) unless ``null`` is false."""

    kind: type
    low: float | None = None
    high: float | None = None
    above: bool = False
    null: bool = True

    def problem(self, key: str, value: Any) -> str | None:
        if value is None:
            return None if self.null else f"{key} needs a value"
        if self.kind is bool:
            return None if isinstance(value, bool) else f"{key}={value!r}: give true or false"
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if self.kind is int and not (number and float(value).is_integer()):
            return f"{key}={value!r}: give a whole number"
        if self.kind is float and not (number and math.isfinite(value)):
            return f"{key}={value!r}: give a finite number"
        if self.low is not None and (value <= self.low if self.above else value < self.low):
            return f"{key} must be {'>' if self.above else '>='} {_fmt(self.low)}, got {value}"
        if self.high is not None and value > self.high:
            return f"{key} must be <= {_fmt(self.high)}, got {value}"
        return None


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


COUNT, NATURAL, FRACTION, SWITCH = Rule(int, 1), Rule(int, 0), Rule(float, 0, 1), Rule(bool, null=False)
# Keys by their dotted name in a composed config; a command is checked on the ones its config has.
RULES: dict[str, Rule] = {
    # every command
    "threads": COUNT, "workers": COUNT, "processes": COUNT, "batch_size": COUNT, "resume": SWITCH,
    "overwrite": SWITCH, "dry_run": SWITCH, "progress": SWITCH,
    "min_boxes": COUNT, "max_boxes": COUNT, "conf_th": FRACTION,
    "shard_size": COUNT, "row_group_size": COUNT, "num_images": COUNT, "image_size": COUNT,
    "val_images": NATURAL, "test_images": NATURAL, "eval_rounds": COUNT, "train_rounds": COUNT,
    # data
    "data.max_len": Rule(int, 3), "data.num_images": COUNT, "data.val_images": NATURAL, "data.test_images": NATURAL,
    "data.image_size": COUNT, "data.eval_rounds": COUNT, "data.train_rounds": COUNT, "data.filter_long": SWITCH,
    "data.image.num_bb": COUNT, "data.image.conf_th": FRACTION, "data.image.max_bb": COUNT,
    "data.image.min_bb": COUNT, "data.image.size": COUNT, "data.image.patch_size": COUNT,
    # compare
    "compare.checkpoint_every": NATURAL, "compare.itm_pairs": NATURAL, "compare.retries": NATURAL,
    "compare.gpus_per_unit": NATURAL, "compare.heartbeat_s": Rule(float, 0, above=True), "compare.round_seeds": COUNT,
    "compare.max_seeds": COUNT, "compare.baseline": SWITCH, "compare.zero_shot": SWITCH,
    "compare.probe.warmup_steps": NATURAL, "compare.probe.steps": COUNT, "compare.probe.batch_size": COUNT,
    "compare.probe.finetune_batch_size": COUNT, "compare.plan.mfu": Rule(float, 0, 1, above=True),
}
TRAINING_COMMANDS = ("pretrain", "finetune")  # their trainer.* is a `TrainerConfig`
# A model config field's annotation -> its rule (``model.hidden_size=abc`` is refused before the model is built).
FIELD_RULES = {"int": Rule(int), "float": Rule(float), "bool": Rule(bool), "Optional[int]": Rule(int),
               "Optional[float]": Rule(float), "int | None": Rule(int), "float | None": Rule(float)}


def _get(cfg: Any, key: str) -> tuple[bool, Any]:
    node = cfg
    for part in key.split("."):
        if not hasattr(node, "keys") or part not in node:
            return False, None
        node = node[part]
    return True, node


def problems(command: str, cfg: Any) -> list[str]:
    """Every value of the composed config ``cfg`` of ``command`` it cannot run with, each naming its key."""
    from vlkit.config import to_container

    plain = to_container(cfg)
    out = []
    for key, rule in RULES.items():
        found, value = _get(plain, key)
        if found and value != "???":
            problem = rule.problem(key, value)
            if problem:
                out.append(problem)
    out += _model_problems(plain.get("model"))
    if command in TRAINING_COMMANDS and isinstance(plain.get("trainer"), dict):
        from vlkit.train.trainer import TrainerConfig, TrainerConfigError

        try:
            TrainerConfig.from_cfg(plain["trainer"])
        except TrainerConfigError as err:
            out += err.problems
    return out


def _model_problems(model: Any) -> list[str]:
    """The ``model.<field>`` values whose type the family's config field does not take."""
    import dataclasses

    from vlkit.registry import MODELS

    if not isinstance(model, dict) or not isinstance(model.get("name"), str) or model["name"] not in MODELS:
        return []
    config_class = MODELS.get(model["name"]).config_class
    if not dataclasses.is_dataclass(config_class):
        return []
    rules = {f.name: FIELD_RULES.get(str(f.type)) for f in dataclasses.fields(config_class)}
    return [problem for key, value in model.items() if rules.get(key) and value != "???"
            for problem in [rules[key].problem(f"model.{key}", value)] if problem]


def check_settings(command: str, cfg: Any) -> None:
    """Raise `SettingsError` listing every problem of `problems`; nothing is read or written before."""
    found = problems(command, cfg)
    if found:
        raise SettingsError(found)
