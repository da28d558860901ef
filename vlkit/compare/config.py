"""A comparison's configuration: its runs (`RunSpec`), the resolved config (or a manifest's), each run's
objective mix and task configs."""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from vlkit.compare.executor_base import run_keys
from vlkit.config import load_yaml, plain
from vlkit.io import config_dir, read_json, read_yaml
from vlkit.objectives import load_mix
from vlkit.registry import TASKS, did_you_mean
from vlkit.stats.sequential import look_sizes


@dataclass
class RunSpec:
    """One contestant: a model, an objective mix (None: no pre-training) and its overrides."""

    name: str
    model: dict[str, Any]
    objectives: Any = None
    mix: dict[str, Any] = field(default_factory=dict)  # overrides of the mix (masking, sampling ...)
    trainer: dict[str, Any] = field(default_factory=dict)  # overrides of the pre-training trainer
    finetune_trainer: dict[str, Any] = field(default_factory=dict)  # of the fine-tuning trainer ({tasks: {<task>: ...}})
    baseline: bool = True  # also fine-tune the same model without pre-training
    task_overrides: dict[str, Any] = field(default_factory=dict)  # task -> config overrides for this run only
    tasks: list[str] | None = None  # a subset of the comparison's tasks for this run (None: all of them)
    add_objectives: dict[str, Any] = field(default_factory=dict)  # compare.add_objectives, for every mix
    data: dict[str, Any] = field(default_factory=dict)  # {image: ...}: this run's image source (the captions stay shared)

    @property
    def family(self) -> str:
        return self.model["name"]


# compare.<key>s whose value in a comparison file (or a `vlkit.compare` argument) replaces the inherited one instead
# of merging into it: a merge keeps every inherited entry, so the default comparison's add_objectives ({itc: ...})
# would survive a file's ``add_objectives: {}`` (no objective added) or ``{mim: ...}`` (that one alone).
REPLACED_KEYS = ("add_objectives",)
# the config node (Hydra's ConfigStore, `vlkit.compare.spec.register_configs`) that clears them: `comparison_file`
# lists it just before the file's own values; a shipped preset that inherits another and sets one lists it too
CLEARED = "compare_replaced"
CLEARED_NODE = {"compare": dict.fromkeys(REPLACED_KEYS)}


# Keys a command line may set beside ``manifest=``: where and how the units run, not what they compute (and each
# executor's resume-safe keys of its block, `manifest_run_keys`).
MANIFEST_RUN_KEYS = ("output_dir", "resume", "dry_run", "workers", "progress", "cache_dir", "compare.retries",
                     "compare.executor", "compare.heartbeat_s")


def manifest_run_keys() -> tuple[str, ...]:
    return MANIFEST_RUN_KEYS + run_keys()


def _select(config: Any, key: str, default: Any = None) -> Any:
    for part in key.split("."):
        if not isinstance(config, dict) or part not in config:
            return default
        config = config[part]
    return config


def resolve_config(cfg: Any, explicit: set[str] | None = None) -> dict[str, Any]:
    """The comparison as plain data: from ``manifest=`` when given, else the composed config. With a manifest the
    command line's `manifest_run_keys` apply; any other key it sets (``explicit``) to a value the manifest does not
    hold is refused, named with both values: the manifest's comparison is what runs."""
    cfg = plain(cfg)
    if not cfg.get("manifest"):
        return cfg
    allowed = manifest_run_keys()
    manifest = read_json(cfg["manifest"], "manifest= names the manifest.json of a finished comparison")
    resolved = manifest["config"]
    unset = object()
    conflicts = []
    for key in sorted(explicit or ()):
        if key == "manifest" or any(key == k or key.startswith(k + ".") for k in allowed):
            continue
        given, recorded = _select(cfg, key, unset), _select(resolved, key, unset)
        if given is not unset and json.dumps(given, sort_keys=True, default=str) != \
                json.dumps(recorded, sort_keys=True, default=str):
            shown = "not set" if recorded is unset else json.dumps(recorded, default=str)
            conflicts.append(f"{key}={json.dumps(given, default=str)} (the manifest has {shown})")
    if conflicts:
        raise ValueError(f"manifest={cfg['manifest']} reruns the comparison it records, and the command line changes "
                         f"it: {'; '.join(conflicts)}. Drop those keys to rerun the manifest, or run the changed "
                         f"comparison without manifest=. Beside manifest= you may set: {', '.join(allowed)}")
    for key in allowed:  # how to run it, from the command line (the first five always, as before)
        given = any(k == key or k.startswith(key + ".") for k in explicit or ())
        value = _select(cfg, key, unset)
        if value is not unset and (given or key in allowed[:5]):
            node, _, leaf = key.rpartition(".")
            (resolved.setdefault(node, {}) if node else resolved)[leaf] = value
    resolved["expected_data_hash"] = manifest["data"]["hash"]
    return resolved


def unit_threads(cfg: dict[str, Any]) -> int:
    """Torch threads of each unit's process (``threads``; null: 1, tiny models gain nothing from more and two
    workers of two threads each on two cores run many times slower)."""
    return int(cfg.get("threads") or 1)


def comparison_file(path: str | Path) -> str:
    """A comparison file of the user's (``compare=<path.yaml>``) as the text of a ``compare`` group option.

    Three layouts are read: a list of runs (``- {name: ..., model: ...}``) or the ``compare:`` node alone
    (``runs:``, ``seeds:``, ``budget:`` ... at the top), both merged over the default comparison
    (``conf/compare/default.yaml``) unless the node names its own ``defaults:``; or a shipped preset's
    layout (``compare:`` / ``data:`` at the top, its own ``defaults:``). A `REPLACED_KEYS` key the file sets
    replaces the inherited value (``add_objectives: {}``: none added). Anything else raises `ValueError` naming the
    file."""
    import yaml

    conf_dir = config_dir()

    path = Path(path)
    body = read_yaml(path, "comparison file")  # a broken file: its line named (vlkit.io.ConfigFileError)
    if isinstance(body, list):
        body = {"defaults": ["default", "_self_"], "compare": {"runs": body}}
    elif not isinstance(body, dict):
        raise ValueError(f"comparison file {path}: expected a list of runs or a mapping (runs:, seeds:, budget: "
                         f"...), found {type(body).__name__}")
    elif not {"compare", "data"} & set(body):
        known = set(yaml.safe_load((conf_dir / "compare.yaml").read_text(encoding="utf-8"))["compare"])  # executors ...
        for preset in (conf_dir / "compare").glob("*.yaml"):
            known |= set((yaml.safe_load(preset.read_text(encoding="utf-8")) or {}).get("compare") or {})
        unknown = sorted(set(body) - known - {"defaults"})
        if unknown:
            raise ValueError(f"comparison file {path}: unknown key(s) {', '.join(map(str, unknown))}; a comparison "
                             f"sets {', '.join(sorted(known))}")
        body = {"defaults": body.pop("defaults", ["default", "_self_"]), "compare": body}
    node = body.get("compare") or {}
    if set(REPLACED_KEYS) & set(node):  # its value replaces the inherited one: cleared first
        defaults = [d for d in body.get("defaults") or [] if d != f"/{CLEARED}"]
        if "_self_" not in defaults:
            defaults.append("_self_")
        defaults.insert(defaults.index("_self_"), f"/{CLEARED}")
        body["defaults"] = defaults
    if "runs" in node:  # a preset's title and claims name the preset's runs, not these
        node.update({key: empty for key, empty in RUN_BOUND_KEYS.items() if key not in node})
    runs = node.get("runs") or []
    if not isinstance(runs, list):
        raise ValueError(f"comparison file {path}: runs must be a list of runs, found {type(runs).__name__}")
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or not {"name", "model"} <= set(run):
            raise ValueError(f"comparison file {path}: runs[{i}] = {run!r} needs at least 'name' and 'model' "
                             "(e.g. {name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter})")
    return "# @package _global_\n" + yaml.safe_dump(body, sort_keys=False)


def comparison_title(compare: dict[str, Any]) -> str:
    """What a comparison's report and figures are titled: ``compare.title`` when set, else the runs compared
    (``uniter vs meter``). A comparison that replaces a preset's runs without a title of its own gets the
    latter: ``comparison_file``, `drop_preset_run_keys` and ``vlkit.compare(runs=...)`` drop the preset's."""
    names = [str(run["name"]) for run in compare.get("runs") or () if isinstance(run, Mapping) and "name" in run]
    return compare.get("title") or " vs ".join(names) or "comparison"


# The keys of a preset that name its runs (its title, its headline claims): a comparison that replaces the runs
# without setting them has none of the preset's
RUN_BOUND_KEYS: dict[str, Any] = {"title": None, "claims": []}


def drop_preset_run_keys(compare: dict[str, Any], explicit: set[str]) -> None:
    """Drop the preset's `RUN_BOUND_KEYS` (its title and claims) when the caller sets ``compare.runs`` and not them."""
    if "compare.runs" not in explicit:
        return
    for key, empty in RUN_BOUND_KEYS.items():
        if not any(e == f"compare.{key}" or e.startswith(f"compare.{key}.") for e in explicit):
            compare[key] = copy.copy(empty)


def known_tasks(where: str, tasks: Any) -> None:
    """Raise `KeyError` naming ``where`` when the keys of ``tasks`` name a task vlkit does not know (a misspelt
    one would be ignored). A known task the comparison does not run is fine: one file serves several."""
    unknown = set(tasks or {}) - set(TASKS.names())
    if unknown:
        raise KeyError(f"{where}: unknown task(s) {sorted(unknown)}; tasks: {', '.join(TASKS.names())}")


def known_task_keys(where: str, overrides: Any) -> None:
    """Raise `KeyError` naming the key when ``overrides`` (task -> overrides) sets a key its task's config
    (``conf/task/<task>.yaml``) does not have under a mapping, as ``task.<key>=`` on the command line is refused (a
    misspelt key would be ignored). A task without a config file there (a plugin's) is not checked."""
    for task, override in (overrides or {}).items():
        path = task_file(task)
        if path.is_file():
            _known_keys(f"{where}.{task}", override, load_yaml(path))


def _known_keys(where: str, override: Any, base: Any) -> None:
    if not isinstance(override, Mapping) or not isinstance(base, Mapping):
        return
    for key, value in override.items():
        if key not in base:
            raise KeyError(f"{where}: unknown key {key!r}{did_you_mean(key, base)}; known: {', '.join(map(str, base))}")
        _known_keys(f"{where}.{key}", value, base[key])


def run_specs(compare: dict[str, Any]) -> list[RunSpec]:
    known_tasks("compare.trainer.tasks", (compare.get("trainer") or {}).get("tasks"))
    known_tasks("compare.task_overrides", compare.get("task_overrides"))
    known_task_keys("compare.task_overrides", compare.get("task_overrides"))
    known_tasks("compare.budget.finetune_steps", (compare.get("budget") or {}).get("finetune_steps"))
    specs = []
    for entry in compare["runs"]:
        entry = dict(entry)
        if "name" not in entry or "model" not in entry:
            raise KeyError(f"compare.runs entry {entry} needs 'name' and 'model'")
        model = entry.pop("model")
        model = {"name": model} if isinstance(model, str) else dict(model)
        entry.setdefault("baseline", compare.get("baseline", True))
        unknown = set(entry) - {"name", "objectives", "mix", "trainer", "finetune_trainer", "baseline", "task_overrides",
                                "tasks", "data"}
        if unknown:
            raise KeyError(f"compare.runs[{entry['name']}]: unknown key(s) {', '.join(sorted(unknown))}")
        if set(entry.get("data") or {}) - {"image"}:
            raise KeyError(f"compare.runs[{entry['name']}].data: only 'image' may differ between runs (every run "
                           f"reads the same captions), got {', '.join(sorted(entry['data']))}")
        extra = set(entry.get("tasks") or []) - set(compare["tasks"])
        if extra:
            raise KeyError(f"compare.runs[{entry['name']}]: tasks {sorted(extra)} are not among compare.tasks "
                           f"{list(compare['tasks'])}")
        known_tasks(f"compare.runs[{entry['name']}].finetune_trainer.tasks",
                    (entry.get("finetune_trainer") or {}).get("tasks"))
        known_tasks(f"compare.runs[{entry['name']}].task_overrides", entry.get("task_overrides"))
        known_task_keys(f"compare.runs[{entry['name']}].task_overrides", entry.get("task_overrides"))
        specs.append(RunSpec(model=model, add_objectives=dict(compare.get("add_objectives") or {}), **entry))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"compare.runs: run names must be unique, got {names}")
    return specs


def objective_mix(spec: RunSpec) -> dict[str, Any] | None:
    """The run's objective mix: its preset, its ``mix:`` overrides, then the comparison's
    ``add_objectives`` (the same extra objectives for every contestant, e.g. ``itc``)."""
    if spec.objectives is None:
        return None
    mix = load_mix(spec.objectives)
    mix.update(spec.mix)
    clash = set(spec.add_objectives) & set(mix["objectives"])
    if clash:
        raise KeyError(f"compare.add_objectives: {sorted(clash)} already in the mix of run {spec.name!r}")
    mix["objectives"] = {**mix["objectives"], **spec.add_objectives}
    return mix


def mix_label(spec: RunSpec) -> str | None:
    """How the results name a run's pre-training: the preset plus the comparison's added objectives."""
    if spec.objectives is None:
        return None
    return "+".join([str(spec.objectives), *spec.add_objectives])


def task_cfg(compare: dict[str, Any], name: str, spec: RunSpec | None = None) -> dict[str, Any]:
    """The config of task ``name``: ``conf/task/<name>.yaml``, then the comparison's ``task_overrides``,
    then the run's own ``task_overrides`` (e.g. ``{retrieval: {options: {num_negatives: 3}}}``)."""
    layers = [(compare.get("task_overrides") or {}).get(name) or {}]
    if spec is not None:
        layers.append((spec.task_overrides or {}).get(name) or {})
    return load_yaml(task_file(name), *layers)


def task_file(name: str) -> Path:
    """Task ``name``'s config file, ``conf/task/<name>.yaml``."""
    return config_dir() / "task" / f"{name}.yaml"


def look_sizes_of(compare: dict[str, Any]) -> list[int] | None:
    """The looks of ``compare.until=decided`` (`vlkit.stats.sequential.look_sizes`), None for a fixed comparison;
    the keys are checked before any work, naming the one at fault."""
    until = compare.get("until") or "fixed"
    if until not in ("fixed", "decided"):
        raise ValueError(f"compare.until={until!r}: fixed (every run at compare.seeds) or decided (seeds added in "
                         "rounds until each claim is decided)")
    if until == "fixed":
        return None
    if not compare.get("claims"):
        raise ValueError("compare.until=decided adds seeds until the claims are decided, and compare.claims is empty")
    for key in ("max_seeds", "round_seeds"):
        value = compare.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"compare.{key}={value!r}: a positive whole number (compare.until=decided)")
    if compare["max_seeds"] < len(compare["seeds"]):
        raise ValueError(f"compare.max_seeds={compare['max_seeds']} is below the {len(compare['seeds'])} "
                         f"compare.seeds {compare['seeds']}")
    return look_sizes(len(compare["seeds"]), compare["max_seeds"], compare["round_seeds"])


def run_data(data: dict[str, Any], spec: RunSpec) -> dict[str, Any]:
    """The data config of a run: the comparison's, with the run's own image source (``runs[].data.image``:
    e.g. a BUTD feature store for the region families and the image folder for a pixel family)."""
    image = (spec.data or {}).get("image")
    return {**data, "image": {**(data.get("image") or {}), **image}} if image else data

