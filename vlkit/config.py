"""The config framework: the one module below the command line that knows OmegaConf and Hydra (both imported
lazily, on first use). The rest of vlkit reads configs as plain Python containers (`plain`), derives the command
configs' nodes from its dataclasses (`hydra_node`) and stores them (`store_configs`, `register_model_configs`)."""
from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path
from typing import Any, Iterable, Mapping

from vlkit.registry import MODELS, did_you_mean


def framework_errors() -> tuple[type[Exception], ...]:
    """The exception classes of the config framework (a config it cannot compose, merge or read)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return HydraException, OmegaConfBaseException


def is_config(value: Any) -> bool:
    """Whether ``value`` is a framework config node (a DictConfig or a ListConfig)."""
    from omegaconf import DictConfig, ListConfig

    return isinstance(value, (DictConfig, ListConfig))


def is_mapping_node(value: Any) -> bool:
    """Whether ``value`` is a framework mapping node (a DictConfig)."""
    from omegaconf import DictConfig

    return isinstance(value, DictConfig)


def to_container(cfg: Any, resolve: bool = True) -> Any:
    """A config node as plain Python containers (interpolations resolved unless ``resolve=False``; a
    mandatory ``???`` value stays ``"???"``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=resolve)


def plain(cfg: Any) -> Any:
    """A config node (or anything) as plain Python containers; anything else is deep-copied."""
    return to_container(cfg) if is_config(cfg) else copy.deepcopy(cfg)


def unwrap(cfg: Any) -> Any:
    """A config node as plain Python containers; anything else as it is (no copy)."""
    return to_container(cfg) if is_config(cfg) else cfg


def load_yaml(path: str | Path, *layers: Any) -> Any:
    """The YAML file ``path`` with each of ``layers`` (mappings) merged over it in turn, as plain containers
    (interpolations resolved). A file is parsed once per process while it keeps its size and time (a comparison
    reads each task's file once per unit)."""
    from omegaconf import OmegaConf

    stat = Path(path).stat()
    return to_container(OmegaConf.merge(_parsed(str(path), stat.st_mtime_ns, stat.st_size), *layers))


@functools.lru_cache(maxsize=256)
def _parsed(path: str, mtime_ns: int, size: int) -> Any:
    """``path`` parsed (`load_yaml`; merging copies it, so the cached node is never changed)."""
    from omegaconf import OmegaConf

    return OmegaConf.load(path)


def to_yaml(cfg: Any) -> str:
    """A config node as YAML text (``vlkit <command> --cfg``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(cfg)


def missing_keys(cfg: Any) -> set[str]:
    """The dotted keys of ``cfg`` whose value is the mandatory ``???``."""
    from omegaconf import OmegaConf

    return OmegaConf.missing_keys(cfg)


def is_missing(node: Any, key: str) -> bool:
    """Whether ``node[key]`` is the mandatory ``???``."""
    from omegaconf import OmegaConf

    return OmegaConf.is_missing(node, key)


def select(cfg: Any, key: str) -> Any:
    """The value at dotted ``key``; None for an absent key or a ``???`` value."""
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, default=None, throw_on_missing=False)


def set_key(cfg: Any, key: str, value: Any, merge: bool = False) -> None:
    """Set dotted ``key`` of ``cfg`` to ``value`` (merged into a mapping there when ``merge``), adding the key
    when the config lacks it."""
    from omegaconf import OmegaConf, open_dict

    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, merge=merge, force_add=True)


def set_overrides(cfg: Any, overrides: Iterable[str]) -> None:
    """Set each ``key=value`` of ``overrides`` on ``cfg``, values read as Hydra reads a command line's values
    (an unreadable one raises Hydra's ``OverrideParseException``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict

    parser = OverridesParser.create()
    with open_dict(cfg):
        for override in parser.parse_overrides(list(overrides)):
            OmegaConf.update(cfg, override.key_or_group, override.value(), merge=False)


def compose_errors() -> tuple[type[Exception], type[Exception], type[Exception]]:
    """Hydra's (missing group option, unreadable override, composition failure) exception classes."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    return MissingConfigException, OverrideParseException, ConfigCompositionException


def compose_file(conf_dir: Path, name: str, overrides: list[str], job_name: str) -> Any:
    """The config ``<conf_dir>/<name>.yaml`` composed by Hydra with ``overrides`` (``group=option``, ``key=value``)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3", job_name=job_name):
        return compose(config_name=name, overrides=overrides)


def group_options(conf_dir: Path, groups: Iterable[str], job_name: str) -> dict[str, list[str]]:
    """``{group: its options, sorted}`` of each of ``groups`` that has options under ``conf_dir`` (and Hydra's
    ConfigStore)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3", job_name=job_name):
        loader = GlobalHydra.instance().config_loader()
        return {g: sorted(loader.get_group_options(g)) for g in groups if loader.get_group_options(g)}


def override_error(override: str) -> Exception | None:
    """The exception Hydra raises reading the command-line override ``override``; None when it reads it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        OverridesParser.create().parse_overrides([override])
    except OverrideParseException as err:
        return err
    return None


class UnknownKeyError(KeyError):
    """A key the structured config lacks (``key``: its name)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


class KeyTypeError(ValueError):
    """A value the structured config's field cannot hold (``key``: the dotted key, ``value``: the value)."""

    def __init__(self, key: str, value: Any, message: str):
        super().__init__(message)
        self.key, self.value = key, value


def merge_structured(cls: type, *layers: Any) -> Any:
    """An instance of dataclass ``cls``: its defaults with each of ``layers`` (mappings, dataclasses or config
    nodes) merged over them, each value checked against its field's type. A key the dataclass lacks raises
    `UnknownKeyError`, a value of the wrong type `KeyTypeError`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, ValidationError

    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), *layers)
    except ConfigKeyError as err:
        key = getattr(err, "key", None) or str(err).split("'")[1]
        raise UnknownKeyError(key, str(err)) from None
    except ValidationError as err:
        key, value = getattr(err, "full_key", None) or getattr(err, "key", "?"), getattr(err, "value", None)
        raise KeyTypeError(key, value, str(err)) from None
    return OmegaConf.to_object(merged)


def store_configs(group: str, nodes: Mapping[str, Any], package: str | None = None) -> None:
    """Store ``nodes`` (name -> config node) in Hydra's ConfigStore under ``group`` (``model=<name>``), at
    ``package`` if given."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, node in nodes.items():
        store.store(group=group, name=name, node=node, package=package)


def command_preset(config_class: type) -> str:
    """The preset the commands build unless ``model.preset=`` says otherwise: ``tiny`` when the family has
    one (commands default to CPU-sized models), else its default preset."""
    return "tiny" if "tiny" in config_class.presets else config_class.default_preset


def hydra_node(name: str, preset: str | None = None) -> dict[str, Any]:
    """A family's ``model`` config node, derived from its config dataclass: ``name``, ``preset`` and every
    field as null (null takes the preset's value; set one to override it: ``model.<field>=...``)."""
    config_class = MODELS.get(name).config_class
    fields = [f.name for f in dataclasses.fields(config_class) if f.name != "preset"]
    return {"name": name, "preset": preset or command_preset(config_class), **dict.fromkeys(fields)}


def register_model_configs() -> None:
    """Store every registered family (plugins included) in Hydra's ConfigStore: ``model/<family>``
    (``model=uniter``), ``model/<family>_<preset>`` (``model=uniter_base``) and ``model/<family>/<preset>``
    (``model=uniter/base``: the names `list_presets` gives), all derived from the family's config dataclass
    (`hydra_node`)."""
    for name in MODELS.names():
        presets = MODELS.get(name).config_class.presets
        store_configs("model", {name: hydra_node(name), **{f"{name}_{preset}": hydra_node(name, preset)
                                                          for preset in presets}})
        store_configs(f"model/{name}", {preset: hydra_node(name, preset) for preset in presets})


# -- the keys of a command's spec: problems named in the caller's spelling ------------------------------------------
class Problem(str):
    """One value a command cannot run with: the text as the command line names it (``key`` followed by ``rest``:
    ``trainer.max_steps must be >= 1, got 0``); `SpecError.spelled` names ``key`` as a Python caller wrote it."""

    key: str
    rest: str

    def __new__(cls, key: str, rest: str) -> "Problem":
        text = super().__new__(cls, f"{key}{rest}")
        text.key, text.rest = key, rest
        return text

    def spelled(self, spell: Any) -> "Problem":
        """The problem with its key written ``spell(key)`` (`python_spelling`)."""
        return Problem(spell(self.key), self.rest)


class SpecError(ValueError):
    """Values of a command's keys that the command cannot run with; ``problems`` lists each (a `Problem` naming its
    key), all at once, before any data is read or written."""

    def __init__(self, problems: Iterable[str]):
        self.problems = [p if isinstance(p, Problem) else Problem("", str(p)) for p in problems]
        super().__init__("; ".join(self.problems))

    def spelled(self, spell: Any) -> "SpecError":
        """The same problems, each key written ``spell(key)``."""
        return type(self)([p.spelled(spell) if p.key else p for p in self.problems])


def python_spelling(function: str, arguments: Mapping[str, str] | None = None) -> Any:
    """``spell(key)``: how a caller of the Python function ``function`` writes the dotted config ``key``: its
    argument path (``finetune(data={"on_error": ...})`` for ``data.on_error``). ``arguments``: dotted keys (or
    their first part) a function takes under another name (``{"objectives": "mix", "trainer.output_dir":
    "output_dir"}``; ``""``: the block's keys are arguments themselves, ``{"compare": ""}``)."""
    arguments = dict(arguments or {})

    def spell(key: str) -> str:
        for dotted in sorted(arguments, key=len, reverse=True):
            if key == dotted or key.startswith(dotted + "."):
                name, rest = arguments[dotted], key[len(dotted) + 1:]
                break
        else:
            name, _, rest = key.partition(".")
        if not name:  # a block whose keys are the function's own arguments (compare's compare.<key>)
            name, _, rest = rest.partition(".")
        parts = [p for p in rest.split(".") if p]
        value = "..."
        for part in reversed(parts):
            value = "{" + repr(part).replace("'", '"') + ": " + value + "}"
        return f"{function}({name}={value})"

    return spell


@dataclasses.dataclass(frozen=True)
class Rule:
    """A key's value: ``kind`` int (a whole number), float (a finite number) or bool; at least ``low`` (above it
    when ``above``), at most ``high``; null allowed (the key's documented default) unless ``null`` is false; one of
    ``choices`` when given. The owner of a key holds its rule (`check_rules`)."""

    kind: type | None = None
    low: float | None = None
    high: float | None = None
    above: bool = False
    null: bool = True
    choices: tuple[Any, ...] = ()

    def problem(self, key: str, value: Any) -> Problem | None:
        import math

        if value is None or value == "???":
            return None if self.null or value == "???" else Problem(key, " needs a value")
        if self.choices:
            return None if value in self.choices else Problem(
                key, f"={value!r}: choose one of {', '.join(map(str, self.choices))}")
        if self.kind is bool:
            return None if isinstance(value, bool) else Problem(key, f"={value!r}: give true or false")
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if self.kind is int and not (number and float(value).is_integer()):
            return Problem(key, f"={value!r}: give a whole number")
        if self.kind is float and not (number and math.isfinite(value)):
            return Problem(key, f"={value!r}: give a finite number")
        if self.low is not None and (value <= self.low if self.above else value < self.low):
            return Problem(key, f" must be {'>' if self.above else '>='} {_fmt(self.low)}, got {value}")
        if self.high is not None and value > self.high:
            return Problem(key, f" must be <= {_fmt(self.high)}, got {value}")
        return None


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


COUNT, NATURAL, FRACTION, SWITCH = Rule(int, 1), Rule(int, 0), Rule(float, 0, 1), Rule(bool, null=False)


def check_rules(rules: Mapping[str, Rule], values: Mapping[str, Any], prefix: str = "") -> list[Problem]:
    """The problems of ``values`` (a plain nested mapping) under ``rules`` (dotted keys relative to it), each
    named ``prefix + key``; an absent key is not checked."""
    out = []
    for key, rule in rules.items():
        node: Any = values
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            problem = rule.problem(prefix + key, node)
            if problem:
                out.append(problem)
    return out


# A model config field's annotation -> its rule (``model.hidden_size=abc`` is refused before the model is built).
_FIELD_RULES = {"int": Rule(int), "float": Rule(float), "bool": Rule(bool), "Optional[int]": Rule(int),
                "Optional[float]": Rule(float), "int | None": Rule(int), "float | None": Rule(float)}


def model_problems(model: Any, key: str = "model") -> list[Problem]:
    """The problems of a ``model`` node (`hydra_node`'s keys): an unknown family, a field the family's config
    dataclass lacks, a value its field's type does not take; named ``<key>.<field>``."""
    if model is None:
        return []
    if not isinstance(model, Mapping) or not isinstance(model.get("name"), str):
        return [Problem(key, f"={model!r}: give a model name (uniter/tiny) or a mapping with its name")]
    if model["name"] not in MODELS:
        return [Problem(f"{key}.name", f"={model['name']!r}: unknown model{did_you_mean(model['name'], MODELS.names())}"
                                      f"; models: {', '.join(MODELS.names())}")]
    config_class = MODELS.get(model["name"]).config_class
    if not dataclasses.is_dataclass(config_class):
        return []
    fields = {f.name: _FIELD_RULES.get(str(f.type)) for f in dataclasses.fields(config_class)}
    out = []
    for field, value in model.items():
        if field not in fields and field != "name":
            out.append(Problem(f"{key}.{field}", f" is not a {model['name']} config field"
                                                 f"{did_you_mean(field, list(fields))}"))
        elif fields.get(field) and value != "???":
            problem = fields[field].problem(f"{key}.{field}", value)
            if problem:
                out.append(problem)
    return out


def merge_known(base: Any, given: Any, key: str, known: bool = True) -> Any:
    """``given`` (a mapping, or a dataclass) merged over the plain mapping ``base`` (a copy), every key of it one
    that ``base`` has (unless ``known`` is false), except under a free-form node (null or ``{}`` in ``base``): an
    unknown key raises `SpecError` naming it (``<key>.<name>``) with the closest names. A non-mapping ``given``
    replaces ``base``."""
    if dataclasses.is_dataclass(given) and not isinstance(given, type):
        given = dataclasses.asdict(given)
    if not isinstance(given, Mapping) or not isinstance(base, Mapping) or not base:
        return copy.deepcopy(given)
    out = copy.deepcopy(dict(base))
    problems = []
    for name, value in given.items():
        if name not in out and known:
            close = did_you_mean(name, list(out))
            problems.append(Problem(f"{key}.{name}", f" is not a known key{close}" if close else
                                    f" is not a known key (keys there: {', '.join(map(str, out))})"))
            continue
        try:
            out[name] = merge_known(out.get(name), value, f"{key}.{name}", known)
        except SpecError as err:
            problems += err.problems
    if problems:
        raise SpecError(problems)
    return out


def defaults(conf_dir: Path, command: str, choices: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """The default config of ``command`` (``<conf_dir>/<command>.yaml``) with the option ``choices`` of its config
    groups (``{"data": "coco", "compare": "smoke"}``), as plain containers: the YAML files themselves, the keys
    of each command's spec starting from them in Python as on the command line. No value goes through here."""
    groups = [f"{group}={option}" for group, option in (choices or {}).items() if option is not None]
    return to_container(compose_file(conf_dir, command, groups, job_name=f"vlkit-{command}-defaults"))
