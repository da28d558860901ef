"""One `Registry` class and the registries every room of vlkit uses.

Built-in entries register themselves when their module is imported; third-party packages add
entries through the ``vlkit.plugins`` entry-point group (each entry point is imported, and called
if it is callable).
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, Callable, Iterator

PLUGIN_GROUP = "vlkit.plugins"

# Modules that register the built-in entries of each registry, imported on first look-up so that
# `import vlkit` stays cheap.
_BUILTIN_MODULES = {
    "model": ["vlkit.models.vilbert", "vlkit.models.uniter", "vlkit.models.meter"],
    "encoder": ["vlkit.models.encoders"],
    "objective": ["vlkit.objectives"],
    "task": ["vlkit.tasks.vqa", "vlkit.tasks.retrieval", "vlkit.tasks.nlvr2", "vlkit.tasks.refexp", "vlkit.tasks.snli_ve"],
    "dataset": ["vlkit.data"],
}
_plugins_loaded = False


class UnknownNameError(LookupError):
    """A name that no registry entry answers to; the message lists the registered names."""


def load_plugins() -> None:
    """Import every ``vlkit.plugins`` entry point once (a callable entry point is called)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=PLUGIN_GROUP):
        obj = ep.load()
        if callable(obj):
            obj()


class Registry:
    """A name -> object table with a decorator to fill it and helpful errors on unknown names."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str | None = None, *, override: bool = False) -> Callable[[Any], Any]:
        def decorator(obj: Any) -> Any:
            key = name or getattr(obj, "name", None) or obj.__name__.lower()
            if key in self._entries and self._entries[key] is not obj and not override:
                raise ValueError(f"{self.kind} {key!r} is already registered by {self._entries[key]!r}")
            self._entries[key] = obj
            return obj

        return decorator

    def _populate(self) -> None:
        for module in _BUILTIN_MODULES.get(self.kind, []):
            importlib.import_module(module)
        load_plugins()

    def get(self, name: str) -> Any:
        if name not in self._entries:
            self._populate()
        if name not in self._entries:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; registered {self.kind}s: {', '.join(self.names()) or '(none)'}"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        self._populate()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"


MODELS = Registry("model")
OBJECTIVES = Registry("objective")
TASKS = Registry("task")
ENCODERS = Registry("encoder")
DATASETS = Registry("dataset")

register_model = MODELS.register
register_objective = OBJECTIVES.register
register_task = TASKS.register
register_encoder = ENCODERS.register
register_dataset = DATASETS.register
