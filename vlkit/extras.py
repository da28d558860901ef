"""The optional dependencies of vlkit (``pip install 'vlkit[<extra>]'``) and the one way to import them:
`require` imports a module or raises `MissingExtra` naming what needs it and the install command."""
from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = {"submitit": "slurm", "ray": "ray"}  # module -> the extra of pyproject.toml that installs it


class MissingExtra(ImportError, RuntimeError):
    """An optional dependency is not installed (the message names the setting that needs it and the fix)."""


def require(module: str, needed_by: str) -> ModuleType:
    """Import ``module`` (an optional dependency) for ``needed_by`` (e.g. ``compare.executor=ray``)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.split(".")[0]
        extra = EXTRAS.get(top)
        fix = f"pip install 'vlkit[{extra}]'" if extra else f"pip install {top}"
        raise MissingExtra(f"{needed_by} needs {top}, which cannot be imported here ({err}); install it with: "
                           f"{fix}", name=top) from err


__all__ = ["EXTRAS", "MissingExtra", "require"]
