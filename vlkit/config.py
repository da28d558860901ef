"""The config framework: the one module below the command line that knows OmegaConf and Hydra (both imported
lazily, on first use). The rest of vlkit reads configs as plain Python containers (`plain`), derives the command
configs' nodes from its dataclasses (`hydra_node`) and stores them (`store_configs`, `register_model_configs`)."""
from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path
from typing import Any, Iterable, Mapping

from vlkit.registry import MODELS


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
