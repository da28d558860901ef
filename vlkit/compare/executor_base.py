"""The contract of an executor, as code: `Executor`, the base class of every place a comparison's units run (the
built-ins in `vlkit.compare.executors`, a plugin's anywhere), and what derives from the registered executors:
their ``compare.<name>`` blocks (`blocks`, `config_node`, `notes`), the keys a resume may change (`run_keys`) and the
nodes a unit spans (`unit_nodes`). It imports nothing of the comparison, so every room of it may ask."""
from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, Callable

from vlkit.config import store_configs
from vlkit.registry import EXECUTORS, RegistrationError, describe_entry, plugin_of

OUTCOME_STATES = ("finished", "failed", "died")  # how a unit ends, as `Executor.wait` reports it


class ExecutorContractError(RuntimeError):
    """An executor broke its contract at run time (what `Executor.wait` returned): the message names the executor,
    its class and its plugin package."""


class Executor(abc.ABC):
    """Where units run: a subclass registered with `vlkit.register_executor` (``compare.executor=<name>``), in vlkit or
    in a plugin. It is built as ``cls(plan_path, settings)`` (`vlkit.compare.executors.ExecutorSettings`; ``self.options`` is its own block),
    sets ``slots`` (units at once), starts a unit with `submit` and reports ended units with `wait`; `close` stops
    what still runs. Its class declares ``config``, the keys of its ``compare.<name>`` block with their defaults
    (the composed config carries the block, a key it does not declare is refused), ``notes`` (each key's meaning,
    for ``vlkit compare --help``) and ``resume_safe`` (the keys a resumed comparison may change; None: all of them).
    `check` refuses settings it cannot run with before anything is written; `planned_slots` and `estimate_line`
    are its line of the dry run."""

    name: str = ""  # the registered name (set when it registers)
    config: dict[str, Any] = {}
    notes: dict[str, str] = {}
    resume_safe: tuple[str, ...] | None = None
    slots: int = 1

    def __init__(self, plan_path: Path | str, settings: Any):
        self.plan_path, self.settings = str(plan_path), settings
        self.options = settings.block(self.name)

    @classmethod
    def check_contract(cls, name: str) -> None:
        """The registration's checks (`vlkit.registry.RegistrationError` naming the class and the rule)."""
        what = f"executor {name!r} ({describe_entry(cls)})"
        if cls.__abstractmethods__:
            raise RegistrationError(f"{what}: define {', '.join(sorted(cls.__abstractmethods__))}")
        if not isinstance(cls.config, dict) or not all(isinstance(k, str) and k.isidentifier() for k in cls.config):
            raise RegistrationError(f"{what}: config is a dict of key -> default (its compare.{name} block)")
        stray = sorted(set(cls.resume_safe or ()) - set(cls.config)) + sorted(set(cls.notes) - set(cls.config))
        if stray:
            raise RegistrationError(f"{what}: resume_safe / notes name key(s) {', '.join(stray)} that its config lacks")
        cls.name = name

    @classmethod
    def check(cls, settings: Any) -> None:
        """Refuse settings this executor cannot run with (a missing extra, a bad key), before any file is written."""

    @classmethod
    def planned_slots(cls, settings: Any) -> int:
        """Units at once, as the dry run plans them (no machine is asked)."""
        return settings.workers

    @classmethod
    def nodes(cls, block: dict[str, Any]) -> int:
        """Nodes one unit spans with the block ``block``."""
        return 1

    @classmethod
    def estimate_line(cls, settings: Any, wall_hours: Callable[[int], str]) -> str:
        """The dry run's line of this executor; ``wall_hours(n)``: the plan's wall time with ``n`` units at once."""
        n = cls.planned_slots(settings)
        return f"- executor {cls.name}: {n} unit(s) at once -> about {wall_hours(n)} h wall"

    @abc.abstractmethod
    def submit(self, key: str) -> None:
        """Start unit ``key``."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> list[tuple[str, dict[str, Any]]]:
        """The units that ended within ``timeout`` seconds: ``(key, outcome)``, its ``state`` finished, failed or
        died (`vlkit.compare.executors.outcome_on_disk` reads what a unit recorded)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop what still runs."""


def checked_wait(executor: Executor, timeout: float, running: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """``executor.wait(timeout)``, held to its contract: a list of ``(unit key, outcome)`` pairs of units it runs
    (``running``), each outcome a mapping whose ``state`` is one of `OUTCOME_STATES`; anything else is an
    `ExecutorContractError` naming the executor and its plugin (not a ``TypeError`` inside the scheduler)."""
    result = executor.wait(timeout=timeout)
    problem = None if isinstance(result, (list, tuple)) else f"returned {_shown(result)}, not a list"
    for item in result if problem is None else ():
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            problem = f"returned the item {_shown(item)}, not a (unit key, outcome) pair"
        elif item[0] not in running:
            problem = f"reported unit {item[0]!r}, which it does not run (running: " \
                      f"{', '.join(sorted(running)) or 'none'})"
        elif not isinstance(item[1], dict) or item[1].get("state") not in OUTCOME_STATES:
            problem = f"reported unit {item[0]}'s outcome as {_shown(item[1])}, not a mapping whose state is " \
                      f"{', '.join(OUTCOME_STATES)}"
        if problem:
            break
    if problem is None:
        return list(result)
    cls = type(executor)
    raise ExecutorContractError(
        f"executor {cls.name!r} ({describe_entry(cls)}{plugin_of(cls)}): wait() {problem}. Its contract "
        "(vlkit.compare.executor_base.Executor.wait): a list of (unit key, outcome) pairs for the units that ended, "
        "each outcome a mapping whose state is finished, failed or died. No further unit starts; what ran is kept: "
        "fix the executor, then go on with resume=true")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def executors() -> dict[str, type[Executor]]:
    """The registered executors, built-ins first."""
    return EXECUTORS.entries()


def blocks(compare: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each executor's ``compare.<name>`` block, its defaults filled in; a key it does not declare is refused."""
    out = {}
    for name, cls in executors().items():
        given = dict(compare.get(name) or {})
        unknown = sorted(set(given) - set(cls.config))
        if unknown:
            raise KeyError(f"compare.{name}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(cls.config))}")
        out[name] = {**cls.config, **given}
    return out


def run_keys() -> tuple[str, ...]:
    """The executors' keys a resumed comparison (or a manifest's rerun) may change: where units run, not what
    they compute (each executor's ``resume_safe``)."""
    keys: list[str] = []
    for name, cls in executors().items():
        if cls.config:
            keys += [f"compare.{name}"] if cls.resume_safe is None else [f"compare.{name}.{k}" for k in cls.resume_safe]
    return tuple(keys)


def unit_nodes(compare: dict[str, Any]) -> int:
    """The nodes a unit spans as the plan counts them: the most any executor's block asks (the slurm block's
    ``nodes`` among the built-ins), whichever executor runs (a dry run plans for the cluster)."""
    found = blocks(compare)
    return max([cls.nodes(found[name]) for name, cls in executors().items()] or [1])


def config_node() -> dict[str, Any]:
    """The executors' blocks as the composed ``compare`` config carries them (`register_hydra_configs`)."""
    return {name: dict(cls.config) for name, cls in executors().items() if cls.config}


def notes() -> dict[str, str]:
    """``compare.<name>.<key>`` -> its meaning, for ``vlkit compare --help``."""
    return {f"compare.{name}.{k}": text for name, cls in executors().items() for k, text in cls.notes.items()}


def register_hydra_configs() -> None:
    """Store the executors' blocks (plugins included) as ``executors: registered`` at package ``compare`` (the
    defaults list of ``conf/compare.yaml``)."""
    store_configs("executors", {"registered": config_node()}, package="compare")


EXECUTORS.base = Executor  # a registration of anything else is refused
