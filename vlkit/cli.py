"""The ``vlkit`` console script: ``vlkit <command> [key=value ...]``.

Each command is a Hydra app over ``conf/<command>.yaml``: the overrides are Hydra overrides
(``model=uniter``, ``trainer.max_steps=100``, ``+extra=1``); a config group also takes a path to a YAML
file of its format (``compare=my_runs.yaml``, ``objectives=my_mix.yaml``). Command modules are imported
lazily so that ``vlkit --help`` stays fast.
"""
from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
from pathlib import Path


from vlkit.io import config_dir

CONF_DIR = config_dir()

# command -> (module:function, one-line help)
COMMANDS = {
    "compare": ("vlkit.compare:main", "head-to-head comparison of families on identical data (the main job)"),
    "pretrain": ("vlkit.train.commands:pretrain", "pre-train a model with an objective mix"),
    "finetune": ("vlkit.train.commands:finetune", "fine-tune a model on a downstream task"),
    "evaluate": ("vlkit.train.commands:evaluate", "evaluate a checkpoint on a downstream task"),
    "extract-features": ("vlkit.features.commands:extract_features", "extract region features into an h5 store"),
    "import-features": ("vlkit.features.commands:import_features", "import region features from TSV / npz formats"),
    "make-shapes": ("vlkit.data.shapes:make_shapes_main", "write the embedded shapes world to disk"),
    "convert": ("vlkit.convert.commands:convert", "convert a released ViLBERT / UNITER / METER checkpoint"),
}


def _file_options(overrides: list[str], search_dir: Path, plain_keys: frozenset[str] = frozenset()) -> list[str]:
    """Turn ``group=<path.yaml>`` overrides into options of a search path: each file is copied to
    ``search_dir/<group>/`` under a name no shipped option has, and the override names it. Keys in
    ``plain_keys`` (values of the command's own config, e.g. ``vlkit convert config=``) keep the path."""
    out = []
    for override in overrides:
        key, sep, value = override.partition("=")
        path = Path(value)
        if sep and key.isidentifier() and key not in plain_keys and path.suffix in (".yaml", ".yml") and path.is_file():
            option = f"file_{len(out)}_{path.stem}"
            (search_dir / key).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, search_dir / key / f"{option}.yaml")
            override = f"{key}={option}"
        out.append(override)
    return out


def _plain_keys(command: str) -> frozenset[str]:
    """The top-level keys of ``conf/<command>.yaml`` that are values, not config groups."""
    import yaml

    path = CONF_DIR / f"{command}.yaml"
    values = yaml.safe_load(path.read_text()) if path.is_file() else None
    return frozenset(k for k in (values or {}) if k != "defaults" and not (CONF_DIR / k).is_dir())


def compose(command: str, overrides: list[str] | None = None):
    """The composed config of ``command`` with Hydra ``overrides`` (also handy in tests)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from vlkit.models.base import register_hydra_configs
    from vlkit.train import register_hydra_configs as register_trainer_configs

    register_hydra_configs()
    register_trainer_configs()
    with tempfile.TemporaryDirectory(prefix="vlkit-conf-") as search_dir:
        overrides = _file_options(list(overrides or []), Path(search_dir), _plain_keys(command))
        if any(Path(search_dir).iterdir()):
            overrides.append(f"hydra.searchpath=[file://{search_dir}]")
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=f"vlkit-{command}"):
            return hydra_compose(config_name=command, overrides=overrides)


def _usage() -> str:
    lines = ["usage: vlkit <command> [key=value ...]", "", "commands:"]
    lines += [f"  {name:<18} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Show a command's composed config with: vlkit <command> --cfg"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    command, overrides = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"vlkit: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    show_cfg = "--cfg" in overrides
    overrides = [o for o in overrides if o != "--cfg"]
    cfg = compose(command, overrides)
    if show_cfg:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(cfg))
        return 0
    target, _ = COMMANDS[command]
    module, func = target.split(":")
    result = getattr(importlib.import_module(module), func)(cfg)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
