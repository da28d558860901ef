"""The ``vlkit`` console script: ``vlkit <command> [key=value ...]``.

Each command is a Hydra app over ``vlkit/conf/<command>.yaml``: the overrides are Hydra overrides
(``model=uniter``, ``trainer.max_steps=100``, ``+extra=1``). Command modules are imported lazily so
that ``vlkit --help`` stays fast.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent / "conf"

# command -> (module:function, one-line help)
COMMANDS = {
    "compare": ("vlkit.compare:main", "head-to-head comparison of families on identical data (the main job)"),
    "pretrain": ("vlkit.train.commands:pretrain", "pre-train a model with an objective mix"),
    "finetune": ("vlkit.train.commands:finetune", "fine-tune a model on a downstream task"),
    "evaluate": ("vlkit.train.commands:evaluate", "evaluate a checkpoint on a downstream task"),
    "extract-features": ("vlkit.features.commands:extract_features", "extract region features into an h5 store"),
    "import-features": ("vlkit.features.commands:import_features", "import region features from TSV / npz formats"),
    "make-shapes": ("vlkit.data.shapes:make_shapes_main", "write the embedded shapes world to disk"),
}


def compose(command: str, overrides: list[str] | None = None):
    """The composed config of ``command`` with Hydra ``overrides`` (also handy in tests)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from vlkit.models.base import register_hydra_configs
    from vlkit.train import register_hydra_configs as register_trainer_configs

    register_hydra_configs()
    register_trainer_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=f"vlkit-{command}"):
        return hydra_compose(config_name=command, overrides=list(overrides or []))


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
