"""One `Registry` class and the registries every room of vlkit uses.

Built-in entries register themselves when their module is imported: each registry has a home, the
package whose import registers its built-ins (timm/LAVIS style: ``vlkit.models``' ``__init__`` imports its
family files, ``vlkit.tasks``' its tasks ...), imported once on the registry's first look-up. This floor names
no room above it: the homes of the registries made here are set by the package root, the facade that names
the rest lazily (``vlkit/__init__.py``); a registry made in its own room passes ``home=__name__`` or none.
Third-party packages add entries through the ``vlkit.plugins`` entry-point group (each entry point is
imported, and called if it is callable). A plugin that fails to import or to register is left out whole (what it
registered before failing is taken back), reported once (a warning of the ``vlkit.plugins`` logger naming its
package and entry point), and named with its error when a name nobody registered is asked for
(`plugin_failures`): one broken plugin never blocks vlkit or the other plugins. Task heads are keyed by
``(task, family)`` (`HeadRegistry`): a family registers its own heads beside its model, and a task falls back to
the generic heads registered without a family. Converters of released checkpoints are keyed by family with the key signature of its files
(`ConverterRegistry`), which also answers which family a state dict is.

A registration is checked when it happens (`RegistrationError`, naming the entry and the rule): an entry
from outside vlkit first loads the built-in entries of its registry, so that a name it shares with a built-in
is refused at the plugin's own call whichever is imported first; an entry that declares a contract check
(``check_contract(name)``, e.g. `vlkit.models.base.VLModel.check_contract`) is checked before it is admitted;
a converter whose key signature overlaps another's is refused (a state dict would be claimed by both).
"""
from __future__ import annotations

import importlib
import logging
from importlib.metadata import EntryPoint, entry_points, packages_distributions
from typing import Any, Callable, Iterator

PLUGIN_GROUP = "vlkit.plugins"

_plugins_loaded = False
_journal: list[tuple[dict, Any, Any]] | None = None  # while a plugin loads: (table, key, what it held) per change
_ABSENT = object()
_plugin_failures: dict[str, str] = {}  # "<package> (entry point <name> = <value>)" -> why it failed

log = logging.getLogger("vlkit.plugins")


class RegistrationError(ValueError):
    """A declaration a registry refuses when it is registered: a taken name, a broken contract (the message
    names the entry, its module and the rule)."""


def describe_entry(obj: Any) -> str:
    """``module.Name`` of a registered object (how registration messages name a plugin's entry)."""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
    return f"{getattr(obj, '__module__', None) or '?'}.{name}"


def plugin_of(obj: Any) -> str:
    """How messages name where an entry comes from: ``""`` for vlkit's own, else ``", plugin package <name>"`` (the
    installed distribution that holds its module; its top-level module when none does)."""
    if builtin(obj):
        return ""
    top = (getattr(obj, "__module__", None) or "?").split(".")[0]
    packages = packages_distributions().get(top) or [top]
    return f", plugin package {', '.join(dict.fromkeys(packages))}"


def builtin(obj: Any) -> bool:
    """Whether ``obj`` is one of vlkit's own entries (defined in a ``vlkit`` module) rather than a plugin's."""
    module = getattr(obj, "__module__", None) or ""
    return module == "vlkit" or module.startswith("vlkit.")


class UnknownNameError(LookupError):
    """A name that no registry entry answers to; the message lists the registered names."""


def did_you_mean(name: Any, names: Any) -> str:
    """``" (did you mean 'x'?)"`` for the registered names closest to ``name``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(n) for n in names], n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


class UnknownHeadError(UnknownNameError, ValueError):
    """A head name that a family does not offer for a task (also a `ValueError`: a bad task option)."""


def plugin_name(ep: EntryPoint) -> str:
    """How messages name a plugin: its package and its entry point."""
    package = ep.dist.name if ep.dist is not None else ep.value.split(":")[0].split(".")[0]
    return f"{package} (entry point {ep.name} = {ep.value})"


def load_plugins() -> None:
    """Import every ``vlkit.plugins`` entry point once (a callable entry point is called). One that raises (on import
    or on registering) is left out: its registrations are taken back, it is reported once (a warning of the
    ``vlkit.plugins`` logger) and kept in `plugin_failures`."""
    global _plugins_loaded, _journal
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=PLUGIN_GROUP):
        _journal = []
        try:
            obj = ep.load()
            if callable(obj):
                obj()
        except Exception as err:  # noqa: BLE001 - any error of a plugin's code: vlkit goes on without it
            for table, key, held in reversed(_journal):  # take back what it registered before failing
                if held is _ABSENT:
                    table.pop(key, None)
                else:
                    table[key] = held
            why = f"{type(err).__name__}: {err}"
            _plugin_failures[plugin_name(ep)] = why
            log.warning("vlkit: plugin %s failed to load and is left out: %s", plugin_name(ep), why)
        finally:
            _journal = None


def _changing(table: dict, key: Any, obj: Any) -> None:
    """``table[key]`` is about to change for ``obj``: while a plugin loads, note what it held (`load_plugins` takes a
    failed plugin's changes back; the built-ins its registration loads stay)."""
    if _journal is not None and not builtin(obj):
        _journal.append((table, key, table.get(key, _ABSENT)))


def failed_plugins_note() -> str:
    """What an unknown-name message adds while a plugin failed to load: ``"; plugin <package> (entry point ...)
    failed to load (<why>) and may be the one that provides it"``, else ``""``."""
    return "".join(f"; plugin {who} failed to load ({why}) and may be the one that provides it"
                   for who, why in _plugin_failures.items())


def plugin_failures() -> dict[str, str]:
    """The ``vlkit.plugins`` entry points that failed to load: ``"<package> (entry point <name> = <value>)"`` -> why."""
    load_plugins()
    return dict(_plugin_failures)


class Registry:
    """A name -> object table with a decorator to fill it and helpful errors on unknown names."""

    def __init__(self, kind: str, home: str | None = None):
        self.kind = kind
        self.home = home  # the module whose import registers the built-in entries (None: they need no import)
        self.base: type | None = None  # the class every entry subclasses, when its home declares one
        self._entries: dict[str, Any] = {}

    def register(self, name: str | None = None, *, override: bool = False) -> Callable[[Any], Any]:
        def decorator(obj: Any) -> Any:
            key = name or getattr(obj, "name", None) or obj.__name__.lower()
            self._admit(obj, key, self._entries.get(key), override)
            _changing(self._entries, key, obj)
            self._entries[key] = obj
            return obj

        return decorator

    def _admit(self, obj: Any, key: Any, existing: Any, override: bool, what: str | None = None) -> None:
        """The checks of a registration (`RegistrationError`): a plugin's entry first loads the built-ins (so that a
        clash with one is found now, whichever registers first), then must not take a registered name (unless
        ``override``) and must pass its own ``check_contract(key)`` when it declares one."""
        what = what or f"{self.kind} {key!r}"
        if not builtin(obj) and existing is None:
            self._load_builtins()
            existing = self._lookup(key)
        if existing is not None and existing is not obj and not override:
            owner = "vlkit's built-in" if builtin(existing) else "the entry"
            raise RegistrationError(f"{what} is already registered by {owner} {describe_entry(existing)}; "
                                    f"{describe_entry(obj)} cannot take its name: register it under another name, or "
                                    "pass override=True to replace that entry on purpose")
        if self.base is not None and not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise RegistrationError(f"{what} ({describe_entry(obj)}): it must subclass "
                                    f"{describe_entry(self.base)}")
        check = getattr(obj, "check_contract", None)
        if callable(check):
            check(key)

    def _lookup(self, key: Any) -> Any:
        return self._entries.get(key)

    def _load_builtins(self) -> None:
        if self.home:
            importlib.import_module(self.home)  # once: later calls find it in sys.modules

    def _populate(self) -> None:
        self._load_builtins()
        load_plugins()

    def get(self, name: str) -> Any:
        if name not in self._entries:
            self._populate()
        if name not in self._entries:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}{did_you_mean(name, self.names())}; registered {self.kind}s: "
                f"{', '.join(self.names()) or '(none)'}{failed_plugins_note()}"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        self._populate()
        return sorted(self._entries)

    def entries(self) -> dict[str, Any]:
        """``name -> entry`` in the order registered (the built-ins first, then the plugins)."""
        self._populate()
        return dict(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"


class HeadRegistry(Registry):
    """``(task, family) -> {name: head class}``: the heads a family offers for a task, one of them its
    default. Heads registered without a family are the generic ones, used for every family that
    registers none for that task."""

    def __init__(self) -> None:
        super().__init__("head")
        self._defaults: dict[tuple[str, str | None], str] = {}

    def register(self, task: str, family: str | None = None, name: str = "default", *, default: bool = False,
                 override: bool = False) -> Callable[[Any], Any]:
        """``@register_head("nlvr2", "uniter", "pair_biattn", default=True)``; the first head registered
        for ``(task, family)`` is its default unless another one says ``default=True``."""
        def decorator(obj: Any) -> Any:
            self._admit(obj, (task, family, name), (self._entries.get((task, family)) or {}).get(name), override,
                        f"head {name!r} of task {task!r} for {family or 'every family'}")
            _changing(self._entries, (task, family), obj)
            heads = self._entries.setdefault((task, family), {})
            _changing(heads, name, obj)
            heads[name] = obj
            if default or (task, family) not in self._defaults:
                _changing(self._defaults, (task, family), obj)
                self._defaults[(task, family)] = name
            return obj

        return decorator

    def _lookup(self, key: Any) -> Any:
        task, family, name = key
        return (self._entries.get((task, family)) or {}).get(name)

    def heads(self, task: str, family: str) -> tuple[str | None, dict[str, Any]]:
        """(the family the heads belong to, or None for the generic ones; {name: head class})."""
        key = (task, family)
        if key not in self._entries:
            self._populate()
        if key in self._entries:
            return family, self._entries[key]
        if (task, None) in self._entries:
            return None, self._entries[(task, None)]
        raise UnknownHeadError(f"no head for task {task!r}: {family!r} registers none and there is no generic one")

    def get(self, task: str, family: str, name: str | None = None) -> Any:  # type: ignore[override]
        """The head class ``name`` (default: the default one) of ``task`` for ``family``."""
        owner, heads = self.heads(task, family)
        name = name or self._defaults[(task, owner)]
        if name not in heads:
            raise UnknownHeadError(f"task {task}: {family} has no head {name!r}; choose one of {', '.join(heads)}")
        return heads[name]

    def names(self, task: str | None = None, family: str | None = None) -> list:  # type: ignore[override]
        """The head names of ``task`` for ``family`` (default first), or every ``(task, family)`` key."""
        if task is None:
            self._populate()
            return sorted(self._entries, key=lambda k: (k[0], k[1] or ""))
        owner, heads = self.heads(task, family)
        default = self._defaults[(task, owner)]
        return [default, *sorted(n for n in heads if n != default)]

    def __contains__(self, key: object) -> bool:
        return key in self.names()


class ConverterRegistry(Registry):
    """``family -> converter`` of the family's released checkpoints, each with its key signature: the key
    prefixes by which a state dict is recognised as that family's (`detect`), checked in registration order
    (the built-in families first, then the plugins)."""

    def __init__(self) -> None:
        super().__init__("converter")
        self._signatures: dict[str, tuple[str, tuple[str, ...]]] = {}

    def register(self, family: str, signature: tuple[str, ...] | list[str] = (),  # type: ignore[override]
                 description: str | None = None, *, override: bool = False) -> Callable[[Any], Any]:
        """``@register_converter("uniter", signature=("uniter.img_embeddings.", ...), description="a UNITER
        checkpoint")`` on a converter class (a `vlkit.convert.OfficialConverter` subclass): a state dict with
        a key starting with one of ``signature`` is this family's."""
        if not signature:
            raise RegistrationError(f"converter {family!r}: give the key prefixes that recognise its checkpoints "
                                    "(signature=)")
        register = super().register(family, override=override)

        def decorator(obj: Any) -> Any:
            previous = self._entries.get(family)
            register(obj)
            overlap = [(other, mine, theirs) for other, (_, prefixes) in self._signatures.items() if other != family
                       for mine in signature for theirs in prefixes if mine.startswith(theirs) or theirs.startswith(mine)]
            if overlap:
                if previous is None:
                    self._entries.pop(family)
                else:
                    self._entries[family] = previous
                other, mine, theirs = overlap[0]
                raise RegistrationError(f"converter {family!r} ({describe_entry(obj)}): its signature prefix {mine!r} "
                                        f"overlaps {theirs!r} of converter {other!r}, so a state dict would be claimed "
                                        "by both; give key prefixes only this family's checkpoints carry")
            _changing(self._signatures, family, obj)
            self._signatures[family] = (description or f"a {family} checkpoint", tuple(signature))
            return obj

        return decorator

    def detect(self, keys: Any) -> str | None:
        """The registered family whose signature the state dict keys ``keys`` carry, None when none does."""
        self._populate()
        keys = list(keys)
        return next((family for family, (_, prefixes) in self._signatures.items()
                     if any(k.startswith(prefixes) for k in keys)), None)

    def description(self, family: str) -> str:
        """How messages name a checkpoint of ``family`` (``"a UNITER checkpoint"``)."""
        self._populate()
        return self._signatures[family][0]


MODELS = Registry("model")
OBJECTIVES = Registry("objective")
TASKS = Registry("task")
ENCODERS = Registry("encoder")
DATASETS = Registry("dataset")
CORRUPTIONS = Registry("corruption")  # the views a pass corrupts a batch by (vlkit.objectives.corruption)
EXECUTORS = Registry("executor")  # where the units of a comparison run (vlkit.compare.executors)
HEADS = HeadRegistry()
CONVERTERS = ConverterRegistry()  # released checkpoints of each family (vlkit.convert)

register_model = MODELS.register
register_objective = OBJECTIVES.register
register_task = TASKS.register
register_encoder = ENCODERS.register
register_dataset = DATASETS.register
register_corruption = CORRUPTIONS.register
register_executor = EXECUTORS.register
register_head = HEADS.register
register_converter = CONVERTERS.register
