"""The typed spec of ``vlkit compare`` (`CompareSpec`, with its plan settings): the comparison's config, each of
its keys checked once, by its owner, before any file is written (the rules of the comparison's own keys here;
``compare.plan.*`` by `vlkit.compare.costs.cost_settings`, ``compare.heartbeat_s`` by
`vlkit.compare.account.heartbeat_s`, ``compare.until`` / ``max_seeds`` / ``round_seeds`` by
`vlkit.compare.config.look_sizes_of`, the data block by `vlkit.data.spec`)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from vlkit.compare.account import heartbeat_s
from vlkit.compare.config import CLEARED, CLEARED_NODE, drop_preset_run_keys, look_sizes_of, resolve_config
from vlkit.compare.costs import cost_settings
from vlkit.compare.executor_base import register_hydra_configs
from vlkit.config import COUNT, NATURAL, SWITCH, Problem, SpecError, check_rules, store_configs
from vlkit.data.spec import data_problems
from vlkit.train.spec import register_configs as register_training_configs


# The rules of the comparison's own keys (``compare.plan.*`` is `vlkit.compare.costs.cost_settings`'s,
# ``compare.heartbeat_s`` `vlkit.compare.account.heartbeat_s`'s, ``compare.max_seeds`` / ``round_seeds`` / ``until``
# `look_sizes_of`'s, ``compare.seeds`` `seeds_problems`', the trainers' `Comparison.check_trainers`').
COMPARE_RULES = {
    "workers": COUNT, "threads": COUNT, "resume": SWITCH, "dry_run": SWITCH, "progress": SWITCH,
    "compare.checkpoint_every": NATURAL, "compare.itm_pairs": NATURAL, "compare.retries": NATURAL,
    "compare.gpus_per_unit": NATURAL, "compare.baseline": SWITCH, "compare.zero_shot": SWITCH,
    "compare.probe.warmup_steps": NATURAL, "compare.probe.steps": COUNT, "compare.probe.batch_size": COUNT,
    "compare.probe.finetune_batch_size": COUNT,
}


def register_configs(command: str | None = None) -> None:
    """The config nodes derived from code for ``command``'s YAML: the families' and recipes'
    (`vlkit.train.spec.register_configs`), and for ``compare`` each executor's ``compare.<name>`` block and the
    node that clears the keys a comparison file replaces (`vlkit.compare.config.REPLACED_KEYS`)."""
    register_training_configs()
    if command == "compare":
        register_hydra_configs()
        store_configs(None, {CLEARED: CLEARED_NODE}, package="_global_")


def _owned(err: Exception) -> Problem:
    """An owner's error (``compare.plan.mfu=2: ...``) as a `Problem` naming its leading key."""
    text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    found = re.match(r"(compare\.[\w.]+|[a-z_]+\.[\w.]+)(.*)", str(text), re.S)
    return Problem(found.group(1), found.group(2)) if found else Problem("", str(text))


def _checked(problems: list[Problem], check: Any, compare: dict[str, Any]) -> Any:
    """``check(compare)``, its error (the key's owner's) appended to ``problems`` as a `Problem`."""
    try:
        return check(compare)
    except (KeyError, ValueError, TypeError) as err:
        problems.append(_owned(err))
        return None


def seeds_problems(seeds: Any) -> list[Problem]:
    """``compare.seeds``: a non-empty list of distinct whole numbers."""
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                              for s in seeds):
        return [Problem("compare.seeds", f"={seeds!r}: give a non-empty list of seeds, e.g. compare.seeds=[0,1,2]")]
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        return [Problem("compare.seeds", f"={seeds}: seed(s) {repeated} repeated; each seed is one independent "
                                         "replicate")]
    return []


@dataclass
class CompareSpec:
    """``vlkit compare``: the comparison ``config`` as plain data (``compare``, ``data``, ``output_dir``, ``workers``
    ...; a manifest's when ``manifest=`` names one) and its ``plan`` settings (``compare.plan`` with its defaults).
    ``argv``: the command line's settings (the plan's record and the retry command; None from Python)."""

    config: dict[str, Any]
    plan: dict[str, Any]
    explicit: frozenset[str] = field(default=frozenset(), compare=False)
    argv: list[str] | None = field(default=None, compare=False)
    quiet: bool = field(default=False, compare=False)  # no table printed (the result is returned either way)
    started: float | None = field(default=None, compare=False)  # when the command began (the account's session)

    @property
    def compare(self) -> dict[str, Any]:
        return self.config["compare"]

    @property
    def output_dir(self) -> str | None:
        return self.config.get("output_dir")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], explicit: Any = None, **given: Any) -> "CompareSpec":
        """The spec of a composed config (plain containers: the command line's or the Python face's);
        ``explicit``: the keys the caller set (beside ``manifest=`` only the run keys may change)."""
        explicit = frozenset(explicit or ())
        config = resolve_config(cfg, set(explicit))
        compare = config.get("compare")
        if not isinstance(compare, dict):
            raise SpecError([Problem("compare", f"={compare!r}: give a comparison (compare=<preset>)")])
        if not config.get("manifest"):
            drop_preset_run_keys(compare, explicit)
        problems = check_rules(COMPARE_RULES, config) + data_problems(config.get("data"))
        problems += seeds_problems(compare.get("seeds"))
        plan = _checked(problems, cost_settings, compare) or {}
        _checked(problems, heartbeat_s, compare)
        _checked(problems, look_sizes_of, compare)
        if problems:
            raise SpecError(problems)
        return cls(config=config, plan=plan, explicit=explicit, **given)
