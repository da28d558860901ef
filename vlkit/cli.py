"""The ``vlkit`` console script: ``vlkit <command> [key=value ...]``.

Each command is a Hydra app over ``conf/<command>.yaml``: the overrides are Hydra overrides
(``model=uniter``, ``trainer.max_steps=100``, ``+extra=1``); a config group also takes a path to a YAML
file of its format (``compare=my_runs.yaml``, ``objectives=my_mix.yaml``). Command modules are imported
lazily so that ``vlkit --help`` stays fast.

``vlkit <command> --help`` lists the command's keys (defaults and meaning) and the choices of its config
groups (model presets, objective mixes, data sets, tasks ...). A mistake on the command line (an unknown
key, group option or command) answers with the closest names vlkit knows ("did you mean
model=uniter?"), exit status 2, and so does a mandatory key left unset (``data.path`` of ``data=coco``); the
values of every key are checked before the command reads any data (each command's typed spec,
`build_spec`); a broken YAML file given
to a group names the user's file and line; an error in the run (bad data, a missing file, a failed preflight)
prints one paragraph naming its culprit, exit status 1. ``VLKIT_DEBUG=1`` prints the full traceback
instead. An error that is not a user mistake (a bug) always prints its traceback. SIGTERM and SIGINT stop a
command cleanly (`vlkit.runtime`): what is complete is kept, exit status 128 + the signal number.

`main(argv)` called with a list (from Python, tests) raises instead of printing; the console script
calls `console`.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import shlex
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from vlkit.config import (SpecError, check_rules, compose_errors, compose_file, framework_errors, group_options,
                          missing_keys, override_error, select, set_overrides, to_container, to_yaml)
from vlkit.io import ConfigFileError, config_dir, read_yaml
from vlkit.locks import hold
from vlkit.registry import failed_plugins_note
from vlkit.runtime import interrupt_on_signals, process_started, shutdown
from vlkit.validate import DataError
from vlkit.version import __version__

CONF_DIR = config_dir()

# command -> (module:function, one-line help)
COMMANDS = {
    "compare": ("vlkit.compare.command:main", "head-to-head comparison of families on identical data (the main job)"),
    "compare-report": ("vlkit.compare.command:report_main", "rebuild a comparison's report from its folder (also while it runs)"),
    "pretrain": ("vlkit.train.commands:pretrain", "pre-train a model with an objective mix"),
    "finetune": ("vlkit.train.commands:finetune", "fine-tune a model on a downstream task"),
    "evaluate": ("vlkit.train.commands:evaluate", "evaluate a checkpoint on a downstream task"),
    "extract-features": ("vlkit.features.commands:extract_features", "extract region features into an h5 store"),
    "import-features": ("vlkit.features.commands:import_features", "import region features from TSV / npz formats"),
    "merge-features": ("vlkit.features.shards:merge_features", "index a sharded feature store, or join its shards"),
    "make-shapes": ("vlkit.data.shapes:make_shapes_main", "write the embedded shapes world to disk"),
    "make-shards": ("vlkit.data.shards:make_shards_main", "write image-text pairs as Parquet shards to stream"),
    "convert": ("vlkit.convert.commands:convert", "convert a released ViLBERT / UNITER / METER checkpoint"),
}
GROUPS = ("model", "objectives", "data", "task", "trainer", "compare")  # config groups of the commands
SPEC_COMMANDS = ("pretrain", "finetune", "evaluate", "compare")  # commands that take a typed spec (`build_spec`)
RESUME_ADVICE = {  # what an interrupted command left and how to continue it
    "pretrain": "; the checkpoints written are kept: rerun with resume=true to continue from the last one",
    "finetune": "; the checkpoints written are kept: rerun with resume=true to continue from the last one",
    "extract-features": "; the images stored are kept: rerun the same command to continue (resume=true is the default)",
    "import-features": "; the images stored are kept: rerun the same command to continue (resume=true is the default)",
}


def _file_options(overrides: list[str], search_dir: Path) -> tuple[list[str], dict[Path, Path]]:
    """Turn ``group=<path.yaml>`` overrides into options of a search path: each file is read (a broken one is
    refused naming the user's file and line) and copied to ``search_dir/<group>/`` under a name no shipped
    option has, and the override names it. Other keys keep their path (``vlkit convert config=uniter-base.json``).
    Returns the overrides and ``{copy: the user's file}``, so that messages name the user's file."""
    out: list[str] = []
    copies: dict[Path, Path] = {}
    for override in overrides:
        key, sep, value = override.partition("=")
        path = Path(value)
        if sep and key in GROUPS and path.suffix in (".yaml", ".yml") and path.is_file():
            option = f"file_{len(out)}_{path.stem}"
            target = search_dir / key / f"{option}.yaml"
            target.parent.mkdir(parents=True, exist_ok=True)
            if key == "compare":  # a list of runs or a partial comparison merges over the default one
                from vlkit.compare.config import comparison_file

                target.write_text(comparison_file(path), encoding="utf-8")
            else:
                body = read_yaml(path, f"{key}= file")
                if body is not None and not isinstance(body, dict):
                    raise ConfigFileError(f"{key}= file {path}: expected a mapping of keys (as conf/{key}/*.yaml "
                                          f"hold), found a {type(body).__name__}")
                shutil.copyfile(path, target)
            copies[target] = path
            override = f"{key}={option}"
        out.append(override)
    return out, copies


def _plain_keys(command: str, overrides: list[str]) -> tuple[list[str], list[str]]:
    """(overrides for Hydra, overrides of plain keys named like a config group): a command whose config has a
    key ``task`` but no ``task`` group (``vlkit convert task=vqa``) takes ``task=vqa`` as that key's value, which
    Hydra would read as a group choice it has no place for."""
    body = read_yaml(CONF_DIR / f"{command}.yaml") or {}
    chosen = {next(iter(d)) for d in body.get("defaults") or [] if isinstance(d, dict)}
    plain = set(body) & set(GROUPS) - chosen
    split: tuple[list[str], list[str]] = ([], [])
    for override in overrides:
        split[override.partition("=")[0] in plain and "=" in override].append(override)
    return split


def _set_plain(cfg: Any, overrides: list[str]) -> None:
    """Set the plain-key overrides of `_plain_keys` on a composed config, their values read as Hydra reads values."""
    set_overrides(cfg, overrides)


def _name_user_files(err: Exception, copies: dict[Path, Path]) -> Exception:
    """``err`` with the temporary copies it names replaced by the user's files (the same type when it can be)."""
    text = str(err)
    for copy, original in copies.items():
        text = text.replace(str(copy), str(original))
    if text == str(err):
        return err
    try:
        return type(err)(text)
    except Exception:  # noqa: BLE001 - an exception class with another constructor
        return ValueError(text)


class UsageError(ValueError):
    """A command line vlkit cannot read: an unknown command, key or group option (exit status 2)."""


def _register(command: str | None = None) -> None:
    from vlkit.compare.spec import register_configs

    register_configs(command)


def compose(command: str, overrides: list[str] | None = None):
    """The composed config of ``command`` with Hydra ``overrides`` (also handy in tests). A mistake in
    the overrides raises `UsageError` with the closest names vlkit knows. A fine-tuning or evaluation whose task
    reads its own files (``task.source=files``) and that gives its images (``data.image.*``) but no ``data=`` group
    takes ``data=images``: the images and the tokenizer, no captions (unless it sets a key that group lacks, such as
    the default group's ``data.num_images``)."""
    cfg = _compose(command, overrides)
    keys = {o.partition("=")[0].lstrip("+~") for o in overrides or () if "=" in o}
    if (command in ("finetune", "evaluate") and "data" not in keys and any(k.startswith("data.image.") for k in keys)
            and (cfg.get("task") or {}).get("source") == "files"):
        try:
            return _compose(command, ["data=images", *(overrides or [])])
        except UsageError:  # a key of the default data group: it stays
            pass
    return cfg


def _compose(command: str, overrides: list[str] | None = None):
    missing_option, unreadable, not_composed = compose_errors()
    _register(command)
    overrides = list(overrides or [])
    hydra_overrides, plain = _plain_keys(command, overrides)
    with tempfile.TemporaryDirectory(prefix="vlkit-conf-") as search_dir:
        resolved, copies = _file_options(hydra_overrides, Path(search_dir))
        if any(Path(search_dir).iterdir()):
            resolved.append(f"hydra.searchpath=[file://{search_dir}]")
        failure: Exception | None = None
        try:
            cfg = compose_file(CONF_DIR, command, resolved, job_name=f"vlkit-{command}")
        except (missing_option, unreadable, not_composed) as err:
            failure = err
        except Exception as err:  # a file of the user's Hydra cannot merge: name it, not its copy
            raise _name_user_files(err, copies) from None
    if failure is None:
        try:
            _set_plain(cfg, plain)
            return cfg
        except unreadable as err:
            failure = err
    if isinstance(failure, missing_option):
        raise _missing_option(command, failure) from None
    if isinstance(failure, unreadable):
        raise _unreadable_override(command, overrides, failure) from None
    raise _unknown_key(command, overrides, _name_user_files(failure, copies)) from None


def _unreadable_override(command: str, overrides: list[str], err: Exception) -> UsageError:
    """`UsageError` naming the override Hydra cannot parse, the character at fault and the quoting that reads it."""
    for override in overrides:
        failure = override_error(override)
        if failure is not None:
            key, sep, value = override.partition("=")
            lines = str(failure).splitlines()
            column = lines[1].index("^") - (len(lines[0]) - len(override)) if len(lines) > 1 and "^" in lines[1] else -1
            char = f" ({override[column]!r} at column {column + 1})" if 0 <= column < len(override) else ""
            if not sep:
                return UsageError(f"vlkit {command}: cannot read {override!r}{char}; settings are key=value (e.g. "
                                  f"model=uniter trainer.max_steps=100); see vlkit {command} --help")
            quoted = "'" + value.replace("'", "\\'") + "'"
            tilde = " (vlkit does not expand ~: give the full path)" if value.startswith("~") else ""
            return UsageError(f"vlkit {command}: cannot read the value of {key}{char}: {value!r}; quote a value "
                              f"holding ~, spaces or non-ASCII characters: {key}={quoted}, in a shell "
                              f"\"{key}={quoted}\"{tilde}")
    bad = re.search(r"override '([^']*)'", str(err))
    return UsageError(f"vlkit {command}: cannot read {repr(bad.group(1)) if bad else 'an override'}; settings are "
                      f"key=value (e.g. model=uniter trainer.max_steps=100); see vlkit {command} --help")


def _suggest(word: str, choices: list[str], prefix: str = "", n: int = 2) -> str:
    """``"; did you mean <prefix><closest>?"`` (up to ``n``), or ``"."`` when nothing is close."""
    close = difflib.get_close_matches(word, choices, n=n, cutoff=0.75)
    return f"; did you mean {' or '.join(prefix + c for c in close)}?" if close else "."


def _missing_option(command: str, err: Any) -> UsageError:
    """`UsageError` for ``group=option`` naming an option the group lacks."""
    found = re.search(r"Could not find '([^']+)'", str(err))
    missing = (getattr(err, "missing_cfg_file", None) or (found.group(1) if found else "")).strip("/")
    group, _, option = missing.rpartition("/")
    if not group:
        return UsageError(f"vlkit {command}: {str(err).splitlines()[0]}")
    if group.startswith("model/"):  # model=<family>/<preset>
        group, option = "model", f"{group.partition('/')[2]}/{option}"
    options = sorted(o for o in (getattr(err, "options", None) or []) if not o.startswith("file_"))
    if group == "model":
        from vlkit.models.base import list_presets

        options = sorted({*options, *list_presets()})
    extra = " or a path to a .yaml file of that format" if group in ("objectives", "compare") else ""
    return UsageError(f"vlkit {command}: unknown {group} {option!r}{_suggest(option, options, f'{group}=')} "
                      f"Choose {group}= from: {', '.join(options)}{extra}{failed_plugins_note()}.")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: leaf value}`` of a plain nested dict (``hydra`` left out)."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "hydra":
            continue
        if isinstance(item, dict) and item:
            out.update(_flatten(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = item
    return out


def _keys(cfg: Any) -> list[str]:
    """Every key of a composed config, leaves and the nodes above them (``trainer``, ``trainer.lr`` ...)."""
    leaves = list(_flatten(to_container(cfg, resolve=False)))
    nodes = {leaf.rsplit(".", k)[0] for leaf in leaves for k in range(1, leaf.count(".") + 1)}
    return sorted(set(leaves) | nodes)


def _unknown_key(command: str, overrides: list[str], err: Exception) -> UsageError:
    """`UsageError` for ``key=value`` naming a key the command's config lacks."""
    found = re.search(r"Could not override '([^']+)'", str(err)) or re.search(r"Key '([^']+)'", str(err))
    if not found:
        return UsageError(f"vlkit {command}: {str(err).splitlines()[0]}")
    key = found.group(1)
    groups = [o for o in overrides if o.partition("=")[0] in GROUPS]
    cfg, keys = None, []
    if groups != overrides:  # the group choices alone compose (else this failure is theirs: no recursion)
        try:
            cfg = compose(command, groups)
            keys = _keys(cfg)
        except UsageError:
            pass
    group = key.partition(".")[0]
    if cfg is not None and group in GROUPS and (cfg.get(group) or {}).get("name", "") is None:  # the group left unset
        choices = [o for o in _group_options(command).get(group, []) if o != "none"]
        return UsageError(f"vlkit {command}: unknown key {key!r}: the {group}.* keys come with a {group}; name it "
                          f"first, {group}=<name> {key}=..., {group}= taking {', '.join(choices)}")
    suggestion = _suggest(key, keys, n=1).rstrip(".")
    parent = key.rpartition(".")[0]
    near = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent]
    where = f" (keys of {parent or 'the command'}: {', '.join(near)})" if near and not suggestion else ""
    return UsageError(f"vlkit {command}: unknown key {key!r}{suggestion}{where} (vlkit {command} --help lists every key)")


# -- help --------------------------------------------------------------------------------------------
_YAML_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<value>[^#]*?)\s*(#\s?(?P<comment>.*))?$")


def _comments(path: Path, prefix: str = "") -> dict[str, str]:
    """``{dotted key: comment}`` from the ``key: value  # comment`` lines of a YAML file."""
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    stack: list[tuple[int, str]] = []
    last = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("#") and last and line.startswith(" " * 10):  # a comment's continuation
            out[last] += " " + line.strip().lstrip("#").strip()
            continue
        m = _YAML_LINE.match(line)
        if not m or line.strip().startswith("-"):
            continue
        indent = len(m.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([prefix.rstrip(".")] * bool(prefix) + [k for _, k in stack] + [m.group("key")])
        stack.append((indent, m.group("key")))
        last = None
        if m.group("comment"):
            out[key] = m.group("comment").strip()
            last = key
    return out


def _group_options(command: str) -> dict[str, list[str]]:
    _register(command)
    cfg = compose(command, [])
    groups = [g for g in GROUPS if g in cfg or g == "objectives"]
    return group_options(CONF_DIR, groups, job_name=f"vlkit-{command}-help")


def command_help(command: str) -> str:
    """``vlkit <command> --help``: what the command does, its config groups' choices and its keys."""
    target, summary = COMMANDS[command]
    lines = [f"usage: vlkit {command} [key=value ...] [--cfg]", "", summary]
    top = CONF_DIR / f"{command}.yaml"
    examples = [ln[1:].strip() for ln in top.read_text(encoding="utf-8").splitlines()[:4] if ln.startswith("# vlkit")]
    if examples:
        lines += ["", "examples:"] + [f"  {e}" for e in examples]
    options = _group_options(command)
    if options:
        lines += ["", "choices (group=option):"]
        notes = {"model": "  (<family> builds its tiny preset, <family>/<preset> or <family>_<preset> another)",
                 "objectives": "  (or a path to a mix .yaml; null: the family's own mix)",
                 "compare": "  (or a path to a comparison .yaml)"}
        for group, names in options.items():
            lines.append(f"  {group + '=':<12} {', '.join(names)}{notes.get(group, '')}")
    cfg = compose(command, [])
    comments = _comments(top)
    if command == "compare":
        from vlkit.compare.executor_base import notes

        comments.update(notes())
    defaults = to_container(cfg, resolve=False)
    for group in ("data", "task", "trainer", "compare"):
        node = defaults.get(group)
        choice = node.get("name") if isinstance(node, dict) else None
        for name in (choice, "default"):
            if name and (CONF_DIR / group / f"{name}.yaml").is_file():
                comments = {**_comments(CONF_DIR / group / f"{name}.yaml", f"{group}."), **comments}
                break
    lines += ["", "keys (default; set any with key=value):"]
    model_fields = []
    for key, value in _flatten(defaults).items():
        if key.startswith("model.") and key not in ("model.name", "model.preset"):
            model_fields.append(key.split(".", 1)[1])
            continue
        entry = f"  {key}={_fmt(value)}"
        comment = comments.get(key)
        lines.append(f"{entry:<40} {comment}" if comment else entry)
    if model_fields:
        lines.append(f"  {'model.<field>=...':<38} any field of the family's config: {', '.join(model_fields)}")
    lines += ["", f"Show the composed config: vlkit {command} [key=value ...] --cfg. Errors print one paragraph; "
              "VLKIT_DEBUG=1 prints the full traceback."]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


def _usage() -> str:
    lines = ["usage: vlkit <command> [key=value ...]", "", "commands:"]
    lines += [f"  {name:<18} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "A command's keys and choices: vlkit <command> --help. Its composed config: vlkit <command> --cfg",
              "Errors print one paragraph; VLKIT_DEBUG=1 prints the full traceback. vlkit --version: the version."]
    return "\n".join(lines)


# -- running -----------------------------------------------------------------------------------------
def run(argv: list[str], started: float | None = None) -> int:
    """Run ``vlkit <argv>``; errors are raised (`console` prints them). ``started``: when the command began (the
    process's start, for the console script), for the commands that account for their time."""
    if argv[:1] in (["--version"], ["-V"]):
        print(f"vlkit {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help", "help"):
        if len(argv) > 1 and argv[0] == "help" and argv[1] in COMMANDS:
            print(command_help(argv[1]))
        else:
            print(_usage())
        return 0
    command, overrides = argv[0], argv[1:]
    if command not in COMMANDS:
        raise UsageError(f"vlkit: unknown command {command!r}{_suggest(command, list(COMMANDS), 'vlkit ')}\n\n{_usage()}")
    if "-h" in overrides or "--help" in overrides:
        print(command_help(command))
        return 0
    show_cfg = "--cfg" in overrides
    overrides = [o for o in overrides if o != "--cfg"]
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        raise UsageError(f"vlkit {command}: unknown option {flags[0]!r}; settings are key=value, the options are "
                         f"--help and --cfg")
    cfg = compose(command, overrides)
    if show_cfg:
        print(to_yaml(cfg))
        return 0
    _check_missing(command, cfg)
    target, _ = COMMANDS[command]
    module, func = target.split(":")
    fn = getattr(importlib.import_module(module), func)
    if command in SPEC_COMMANDS:  # compose -> spec -> command: the command holds its folders' locks
        result = fn(build_spec(command, cfg, overrides, started))
        return int(getattr(result, "code", 0))
    rules = getattr(sys.modules[fn.__module__], "KEY_RULES", {}).get(command, {})  # the command module's own
    problems = check_rules(rules, to_container(cfg))
    if problems:  # types and ranges of every key, before any data work
        raise SpecError(problems)
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        parameters = {}
    given = {"overrides": overrides, "started": started}
    with hold(output_paths(command, cfg), command=shlex.join(["vlkit", *argv])):  # one writer per output folder
        result = fn(cfg, **{k: v for k, v in given.items() if k in parameters})
    return result if isinstance(result, int) else 0


def explicit_keys(overrides: list[str] | None) -> set[str]:
    """The config keys a command line sets (``model=uniter`` -> ``model``, ``+a.b=1`` -> ``a.b``)."""
    keys = set()
    for override in overrides or ():
        key, sep, _ = override.partition("=")
        if sep:
            keys.add(key.lstrip("+~"))
    return keys


def build_spec(command: str, cfg: Any, overrides: list[str], started: float | None = None) -> Any:
    """The typed spec of ``command`` from its composed config ``cfg`` and the command line's ``overrides`` (the keys
    they set are the explicit ones); every key's problem is raised at once (`vlkit.config.SpecError`), named as the
    command line names it (``data.on_error``)."""
    explicit = frozenset(explicit_keys(overrides))
    plain = to_container(cfg)
    if command == "compare":
        from vlkit.compare.spec import CompareSpec

        return CompareSpec.from_config(plain, explicit, argv=list(overrides), started=started)
    from vlkit.train.spec import SPECS

    return SPECS[command].from_config(plain, explicit=explicit, invocation=shlex.join(["vlkit", command, *overrides]))


def _check_missing(command: str, cfg: Any) -> None:
    """`UsageError` naming every mandatory key (``???``) the command line leaves unset, with its meaning: ``vlkit
    pretrain data=coco`` needs ``data.path`` and ``data.image.path``. (``evaluate`` may take its data from the
    run, ``compare`` its config from ``manifest=`` and its dry run reads no data: their ``data.*`` is not required
    here; a fine-tuning on its task's own files needs only ``data.image.*``.)"""
    unset = missing_keys(cfg)
    missing = [k for k in _flatten(to_container(cfg, resolve=False)) if k in unset]  # in the file's order
    if command == "evaluate" or (command == "compare" and (cfg.get("manifest") or cfg.get("dry_run") is True)):
        missing = [k for k in missing if not k.startswith("data.")]
    elif command == "finetune" and (cfg.get("task") or {}).get("source") == "files":  # no captions read: images only
        missing = [k for k in missing if not k.startswith("data.") or k.startswith("data.image.")]
    if not missing:
        return
    comments = _comments(CONF_DIR / f"{command}.yaml")
    for group in {k.split(".")[0] for k in missing} & set(GROUPS):
        name = cfg[group].get("name") if hasattr(cfg[group], "get") else None
        if name and (CONF_DIR / group / f"{name}.yaml").is_file():
            comments.update(_comments(CONF_DIR / group / f"{name}.yaml", f"{group}."))
    chosen = [f"{g}={cfg[g].get('name')}" for g in GROUPS if any(k.startswith(g + ".") for k in missing)
              and hasattr(cfg.get(g), "get") and cfg[g].get("name")]
    needs = "; ".join(f"{k} ({comments[k]})" if comments.get(k) else k for k in missing)
    raise UsageError(f"vlkit {command}{' ' + ' '.join(chosen) if chosen else ''} needs {needs}: set "
                     f"{'it' if len(missing) == 1 else 'them'} on the command line, e.g. {missing[0]}=PATH "
                     f"(vlkit {command} --help lists every key)")


def output_paths(command: str, cfg: Any) -> dict[str, str]:
    """``{key: path}`` of what ``command`` (one without a spec: those hold their own, `SPEC_COMMANDS`) writes
    (`vlkit.locks` holds a lock on each while it runs); none for ``compare-report`` (it rewrites a running
    comparison's report), a dry run, and the ranks of a distributed run after the first (the first holds them)."""
    def value(key: str) -> Any:  # None for an absent or missing (???) key: the command names those itself
        return select(cfg, key)

    if int(os.environ.get("RANK", "0") or 0) != 0 or value("dry_run") or command == "compare-report":
        return {}
    if command == "merge-features":
        keys = {"out": value("out")} if value("out") else {"src": value("src")}
    else:
        keys = {key: value(key) for key in ("output_dir", "dst", "out")}
    return {key: str(path) for key, path in keys.items() if isinstance(path, (str, os.PathLike)) and str(path)}


def _shutdown_distributed(barrier: bool) -> None:
    """Tear the process group down while the interpreter is alive (gloo aborts a process that exits with it)."""
    shutdown(barrier)


def user_error(err: BaseException) -> bool:
    """Whether ``err`` is a mistake in the command line, the config or the data (one paragraph) rather
    than a bug in vlkit (a traceback)."""
    own = type(err).__module__.startswith("vlkit.")
    return isinstance(err, (UsageError, DataError, ValueError, LookupError, OSError, ArithmeticError,
                            *framework_errors())) or (own and isinstance(err, RuntimeError))


def describe(err: BaseException) -> str:
    text = str(err).strip()
    if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str):
        text = err.args[0]
    return text or type(err).__name__


def console(argv: list[str] | None = None) -> int:
    """What the ``vlkit`` console script runs: `run`, with errors printed for people (see the module
    docstring). As the process's entry point it also ends a distributed process group before returning
    (`vlkit.train.distributed.shutdown`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    name = f"vlkit {command}" if command else "vlkit"
    debug = os.environ.get("VLKIT_DEBUG", "") not in ("", "0", "false", "no")
    try:
        with interrupt_on_signals():
            code = run(argv, started=process_started())
        _shutdown_distributed(barrier=True)
        return code
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM / SIGINT as `vlkit.runtime.Interrupted`
        _shutdown_distributed(barrier=False)
        how = f" by {err.signal_name}" if hasattr(err, "signal_name") else ""
        print(f"{name}: interrupted{how}{RESUME_ADVICE.get(command, '')}", file=sys.stderr)
        return getattr(err, "exit_code", 130)
    except Exception as err:  # noqa: BLE001 - the console reports every error, once
        _shutdown_distributed(barrier=False)  # the other ranks may never reach a barrier
        if debug or not user_error(err):
            traceback.print_exc()
            if not user_error(err):
                print(f"{name}: this looks like a bug in vlkit ({type(err).__name__}); please report it with the "
                      "traceback above", file=sys.stderr)
                return 1
        text = describe(err)
        if isinstance(err, UsageError):
            print(text if text.startswith("vlkit") else f"{name}: {text}", file=sys.stderr)
            return 2
        kind = "" if type(err).__name__ in ("DataError", "PreflightError", "SpecError", "TrainerConfigError") else f" ({type(err).__name__})"
        print(f"{name}: error{kind}: {text}", file=sys.stderr)
        if not debug:
            print("(VLKIT_DEBUG=1 shows the full traceback)", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """``vlkit`` entry point: without ``argv`` (the console script) errors are printed as `console` does;
    with an ``argv`` list (Python callers, tests) they are raised."""
    if argv is None:
        return console()
    return run(list(argv))


if __name__ == "__main__":
    sys.exit(main())
