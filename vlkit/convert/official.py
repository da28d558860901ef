"""What the official-checkpoint converters share: safe reading of the released files, family detection,
strict key-by-key loading with a report, and the conversion flow `OfficialConverter.convert` runs.

Each family file (`vilbert`, `uniter`, `meter`) subclasses `OfficialConverter` with its key names
(``(vlkit prefix, official prefix)`` tables), the source keys vlkit has no place for (each with its
reason), the config it reads from the official config and the tensor shapes, and the modules it builds
for each head the checkpoint holds. Loading is target-driven: every tensor of the vlkit module names
the official key it comes from, every official key must be used or declared unused, and a missing,
unexpected or mis-shaped key is an error naming it.
"""
from __future__ import annotations

import abc
import dataclasses
import os
import pickle
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import torch
from torch import Tensor, nn

from vlkit.io import UnreadableFileError, torch_load_weights
from vlkit.models.recipe import recipe_of
from vlkit.objectives.mix import load_mix
from vlkit.registry import CONVERTERS, MODELS, OBJECTIVES
from vlkit.released import ConversionReport, check_released, known_file

PRETRAINING = "pretraining"
MODEL = "model"  # a checkpoint without any head: the bare model
CHECKPOINT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".tar")

# Layouts that are no family's but that a user may pass by mistake, named in the refusal: (name, description,
# key prefixes), checked after the registered families' signatures (`vlkit.registry.CONVERTERS`).
OTHER_LAYOUTS = (
    ("detector", "a bottom-up-attention detector (vlkit.features.detector.convert loads those)",
     ("roi_heads.", "proposal_generator.")),
    ("bert", "a text-only BERT without an image stream", ("bert.encoder.layer.", "encoder.layer.")),
)


class ConversionError(ValueError):
    """A released checkpoint that cannot become a vlkit module as asked (the message names the file and keys)."""


class _ReadOnlyDict(dict):
    def __setstate__(self, state: Any) -> None:  # sacred pickles a read-only message as state
        pass


class _ReadOnlyList(list):
    def __setstate__(self, state: Any) -> None:
        pass


# Config containers Lightning checkpoints may pickle next to the weights (``hyper_parameters``): read as the
# builtin container they wrap, by name, without importing their package or calling any of its code.
CONFIG_CONTAINERS = [
    (_ReadOnlyDict, "sacred.config.custom_containers.ReadOnlyDict"),
    (_ReadOnlyList, "sacred.config.custom_containers.ReadOnlyList"),
    (dict, "pytorch_lightning.utilities.parsing.AttributeDict"),
    (dict, "lightning_fabric.utilities.data.AttributeDict"),
    (types.SimpleNamespace, "argparse.Namespace"),
]


@dataclass
class OfficialReport(ConversionReport):
    """What happened to every key of a converted official checkpoint: ``unused`` maps each source key vlkit
    has no place for to the reason; ``cast`` lists the tensors converted to fp32."""

    family: str = ""
    kind: str = ""
    unused: dict[str, str] = field(default_factory=dict)
    cast: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.source} ({self.family} -> {self.kind}): {self.mapped} tensors loaded, "
                 f"{len(self.unused)} source keys unused, {len(self.cast)} cast to fp32"]
        for title, items in (("renamed", [f"{a} -> {b}" for a, b in self.renamed]), ("transformed", self.transformed),
                             ("filled", self.filled), ("missing", self.missing), ("unexpected", self.unexpected),
                             ("shape mismatch", self.mismatched)):
            if items:
                shown = ", ".join(map(str, items[:8])) + (f", ... ({len(items)} in all)" if len(items) > 8 else "")
                lines.append(f"  {title}: {shown}")
        by_reason: dict[str, list[str]] = {}
        for key, reason in self.unused.items():
            by_reason.setdefault(reason, []).append(key)
        for reason, keys in by_reason.items():
            shown = ", ".join(keys[:3]) + (f", ... ({len(keys)} keys)" if len(keys) > 3 else "")
            lines.append(f"  unused: {shown}: {reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------
def _refusal(err: Exception) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file: the global it would have had to load, or the
    unpickler's own reason."""
    text = str(err)
    match = re.search(r"GLOBAL ([\w.]+)", text)
    if match:
        return f"it pickles {match.group(1)}, which is not a tensor or a plain container"
    match = re.search(r"WeightsUnpickler error: \s*(\S[^\n]*)", text)
    return f"torch.load(weights_only=True) cannot read it ({(match.group(1) if match else text.splitlines()[0])[:200]})"


def _torch_load(path: Path) -> Any:
    """``torch.load(weights_only=True)`` (`vlkit.io.torch_load_weights`): tensors and plain containers only; a
    pickled class or function is refused with the name of the global the file asks for."""
    try:
        return torch_load_weights(path, CONFIG_CONTAINERS)
    except (UnreadableFileError, OSError) as failure:
        err = failure.__cause__ if isinstance(failure, UnreadableFileError) else failure
    if isinstance(err, pickle.UnpicklingError):
        raise ConversionError(
            f"{path}: refused: {_refusal(err)}; vlkit reads checkpoints with torch.load(weights_only=True) and never "
            "runs pickled code (re-save the state dict as safetensors in an environment you trust)") from None
    detail = next(iter(str(err).splitlines()), "")[:200] or type(err).__name__
    known = known_file(path.name)
    again = f"; download it again from {known.source}" if known else ""
    raise ConversionError(f"{path}: not a readable torch checkpoint, truncated or not a checkpoint ({detail}){again}") from None


def read_official(source: str | os.PathLike | Mapping[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any], str]:
    """``(state_dict, metadata, name)`` of a released checkpoint file (``.bin``/``.pt``/``.pth``/``.ckpt``/``.tar``
    through ``torch.load(weights_only=True)``, or ``.safetensors``) or of a state dict given directly.

    Wrapped layouts are unwrapped: Lightning ``{"state_dict": ...}`` (the rest, e.g. ``hyper_parameters``,
    is returned as metadata), ``{"model_state_dict": ...}`` (ViLBERT ``*.tar``), ``{"model": ...}``; a
    ``module.`` prefix on every key (DataParallel) is removed. Every value must be a tensor.
    """
    if isinstance(source, Mapping):
        obj: Any = dict(source)
        name = "<state dict>"
    else:
        path = check_released(source, "checkpoint")
        name = str(path)
        if path.suffix == ".safetensors":
            from safetensors import SafetensorError
            from safetensors.torch import load_file

            try:
                obj = load_file(str(path))
            except SafetensorError as err:
                raise ConversionError(f"{path}: not a readable safetensors file ({err})") from None
        elif path.suffix in CHECKPOINT_SUFFIXES:
            obj = _torch_load(path)
        else:
            raise ConversionError(f"{path}: unsupported checkpoint type {path.suffix!r}; vlkit reads "
                                  f"{', '.join(CHECKPOINT_SUFFIXES)} (torch.load with weights_only=True) and .safetensors")
    meta: dict[str, Any] = {}
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model_state_dict", "model"):
            if isinstance(obj.get(key), Mapping):
                meta = {k: v for k, v in obj.items() if k != key}
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not obj:
        raise ConversionError(f"{name}: expected a state dict (a mapping of names to tensors), found "
                              f"{type(obj).__name__}{' (empty)' if isinstance(obj, Mapping) else ''}")
    state: dict[str, Tensor] = {}
    for key, value in obj.items():
        if not isinstance(value, Tensor):
            raise ConversionError(f"{name}: key {key!r} holds {type(value).__name__}, not a tensor")
        state[str(key)] = value
    if all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state, meta, name


def detect_family(keys: Sequence[str]) -> str | None:
    """The family (or other kind of model, `OTHER_LAYOUTS`) whose key names a state dict has, None when none
    fits: the registered converters' signatures first (`vlkit.register_converter`)."""
    found = CONVERTERS.detect(keys)
    if found is not None:
        return found
    return next((name for name, _, prefixes in OTHER_LAYOUTS if any(k.startswith(prefixes) for k in keys)), None)


def describe_family(family: str | None) -> str:
    if family in CONVERTERS:
        return CONVERTERS.description(family)
    return next((d for f, d, _ in OTHER_LAYOUTS if f == family), "nothing vlkit converts")


def rename_legacy_layer_norm(state: dict[str, Tensor], report: OfficialReport) -> dict[str, Tensor]:
    """Old BERT checkpoints name LayerNorm parameters ``gamma`` / ``beta`` (ViLBERT's and UNITER's
    ``from_pretrained`` rename them to ``weight`` / ``bias``)."""
    out = {}
    for key, value in state.items():
        new = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", key))
        if new != key:
            report.renamed.append((key, new))
        out[new] = value
    return out


def fold_weight_norm(g: Tensor, v: Tensor) -> Tensor:
    """The weight ``g * v / ||v||`` of ``torch.nn.utils.weight_norm``: over the whole tensor for ``dim=None``
    (``g`` a scalar, vilbert_beta's ``SimpleClassifier``), else per output row (``dim=0``)."""
    if g.numel() == 1:
        return v * (g / torch.linalg.vector_norm(v))
    return v * (g / torch.linalg.vector_norm(v, dim=tuple(range(1, v.dim())), keepdim=True))


def count_indexed(keys: Sequence[str], prefix: str) -> int:
    """``n`` when ``prefix0.`` ... ``prefix{n-1}.`` occur among ``keys`` (e.g. the layers of an encoder)."""
    found = {int(m.group(1)) for k in keys if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    if found and found != set(range(len(found))):
        raise ConversionError(f"layers {prefix}* are not numbered 0..{max(found)} (found {sorted(found)})")
    return len(found)


def require(state: Mapping[str, Tensor], key: str, name: str) -> Tensor:
    if key not in state:
        raise ConversionError(f"{name}: key {key!r} is missing (it gives the model's sizes)")
    return state[key]


# --------------------------------------------------------------------------------------------
# Converting
# --------------------------------------------------------------------------------------------
@dataclass
class Source:
    """Where a vlkit tensor comes from: the first present of ``keys`` (alternatives, e.g. a tied decoder and
    the embeddings it is tied to), or several keys combined by ``combine`` (e.g. a weight-norm fold)."""

    keys: tuple[str, ...]
    combine: Callable[..., Tensor] | None = None
    note: str = ""


class OfficialConverter(abc.ABC):
    """A family's converter. Subclasses set ``family``, ``backbone`` (the official prefix of the model's own
    keys), ``head_kinds`` (kind -> the official key prefixes that hold its head; the first identifies the
    kind) and ``head_names`` (kind -> ``(vlkit prefix, official prefix)`` renames of its heads), and
    implement `model_config` and `build` (plus `source` / `transform` / `unused_reason` where the names are
    not plain prefixes)."""

    family: ClassVar[str] = ""
    backbone: ClassVar[str] = ""
    head_kinds: ClassVar[dict[str, tuple[str, ...]]] = {}
    head_names: ClassVar[dict[str, tuple[tuple[str, str], ...]]] = {}

    # -- what subclasses provide ------------------------------------------------------------------
    @abc.abstractmethod
    def model_config(self, state: dict[str, Tensor], config: dict[str, Any], meta: dict[str, Any], name: str):
        """The family's `ModelConfig` for this checkpoint: the official ``config`` values, sizes from the shapes."""

    @abc.abstractmethod
    def build(self, model: nn.Module, kind: str, state: dict[str, Tensor], options: dict[str, Any]) -> nn.Module:
        """The vlkit module of ``kind``: a `Pretraining`, a task (``options`` go to its constructor), or
        ``model`` itself (kind ``model``)."""

    def prefixes(self, kind: str) -> list[tuple[str, str]]:
        """``(vlkit prefix, official prefix)`` renames for the module of ``kind``, tried in order."""
        if kind == MODEL:
            return [("", self.backbone)]
        return [("model.", self.backbone), *self.head_names.get(kind, ())]

    def unused_reason(self, key: str, kind: str) -> str | None:
        """Why the official ``key`` has no place in the vlkit module of ``kind`` (None: it should have one)."""
        for other, prefixes in self.head_kinds.items():
            if other != kind and key.startswith(prefixes) and not key.startswith(self.head_kinds.get(kind, ())):
                what = "the pre-training heads" if other == PRETRAINING else f"the {other} head"
                return (f"{what}; this conversion builds {'the bare model' if kind == MODEL else kind}: convert with "
                        f"task={other} for {'them' if other == PRETRAINING else 'it'}")
        return None

    def source(self, key: str, kind: str, state: Mapping[str, Tensor]) -> Source | None:
        """The official key(s) of vlkit tensor ``key`` (None: no rule names it)."""
        for ours, theirs in self.prefixes(kind):
            if key.startswith(ours):
                return Source((theirs + key[len(ours):],))
        return None

    def transform(self, key: str, value: Tensor, target: Tensor, report: OfficialReport) -> Tensor:
        """Adapt a source tensor to vlkit's tensor ``key`` (default: as is)."""
        return value

    def normalize(self, state: dict[str, Tensor], report: OfficialReport) -> dict[str, Tensor]:
        """Family-wide key renames applied before anything else (default: none)."""
        return state

    # -- the flow ---------------------------------------------------------------------------------
    def kinds(self, state: Mapping[str, Tensor]) -> list[str]:
        """The head kinds whose identifying key prefix occurs in ``state``, in declaration order."""
        return [k for k, prefixes in self.head_kinds.items() if any(s.startswith(prefixes[0]) for s in state)]

    def choose_kind(self, state: Mapping[str, Tensor], task: str | None, name: str) -> str:
        found = self.kinds(state)
        tasks = [k for k in found if k != PRETRAINING]
        if task is not None:
            if task == MODEL:
                return MODEL
            if task not in self.head_kinds:
                raise ConversionError(f"{name}: unknown task {task!r} for {self.family}; choose one of "
                                      f"{', '.join([*self.head_kinds, MODEL])}")
            if task not in found:
                raise ConversionError(f"{name}: the checkpoint holds no {task} head (no {self.head_kinds[task][0]}* "
                                      f"keys); it holds: {', '.join(found) or 'no heads'}")
            return task
        if len(tasks) == 1:
            return tasks[0]
        if len(tasks) > 1:
            raise ConversionError(f"{name}: the checkpoint holds heads for {', '.join(found)}; choose one with task=")
        return PRETRAINING if PRETRAINING in found else MODEL

    def convert(self, checkpoint: Any, config: Mapping[str, Any] | str | os.PathLike | None = None,
                task: str | None = None, options: Mapping[str, Any] | None = None) -> tuple[nn.Module, OfficialReport]:
        """``(module, report)`` of a released checkpoint (file or state dict); see `vlkit.convert.from_official`."""
        return self.convert_state(*read_official(checkpoint), config, task, options)

    def convert_state(self, state: dict[str, Tensor], meta: dict[str, Any], name: str,
                      config: Mapping[str, Any] | str | os.PathLike | None = None, task: str | None = None,
                      options: Mapping[str, Any] | None = None) -> tuple[nn.Module, OfficialReport]:
        """`convert` of a checkpoint `read_official` has read: ``(state_dict, metadata, name)``."""
        found = detect_family(list(state))
        if found != self.family:
            hint = f"; convert it with family={found}" if found in CONVERTERS else ""
            raise ConversionError(f"{name}: not a {self.family} checkpoint: it looks like {describe_family(found)} "
                                  f"(first keys: {', '.join(list(state)[:3])}){hint}")
        report = OfficialReport(source=name, format="official", family=self.family)
        for key, value in list(state.items()):
            if value.is_floating_point() and value.dtype != torch.float32:
                state[key] = value.float()
                report.cast.append(key)
        state = self.normalize(state, report)
        kind = self.choose_kind(state, task, name)
        report.kind = kind
        config = read_config(config)
        model = MODELS.get(self.family)(self.model_config(state, config, meta, name))
        module = self.build(model, kind, state, dict(options or {}))
        self.load(module, kind, state, report)
        return module.eval(), report

    def load(self, module: nn.Module, kind: str, state: dict[str, Tensor], report: OfficialReport) -> None:
        """Fill every tensor of ``module`` from ``state`` (strict; raises `ConversionError` naming the keys)."""
        target = module.state_dict()
        out: dict[str, Tensor] = {}
        used: dict[str, str] = {}
        for key, tensor in target.items():
            src = self.source(key, kind, state)
            if src is None:
                report.missing.append(f"(vlkit {key}: no official name)")
                continue
            present = [k for k in src.keys if k in state]
            if src.combine is None and not present or src.combine is not None and len(present) < len(src.keys):
                wanted = src.keys[0] if src.combine is None else " + ".join(k for k in src.keys if k not in state)
                report.missing.append(f"{wanted} (vlkit {key})")
                continue
            value = src.combine(*(state[k] for k in src.keys)) if src.combine else state[present[0]]
            value = self.transform(key, value, tensor, report)
            if tuple(value.shape) != tuple(tensor.shape):
                report.mismatched.append((", ".join(present), tuple(value.shape), tuple(tensor.shape)))
                continue
            out[key] = value.to(tensor.dtype)
            for k in (src.keys if src.combine else present[:1]):
                used.setdefault(k, key)
            if src.note:
                report.transformed.append(f"{key}: {src.note}")
        for key in state:
            if key in used:
                continue
            reason = self.unused_reason(key, kind)
            if reason is None:
                report.unexpected.append(key)
            else:
                report.unused[key] = reason
        _check_tied(module, out, report)
        report.mapped = len(out)
        if not report.ok:
            raise ConversionError(f"{report.source} does not match the {self.family} {kind} module vlkit built from "
                                  f"it (pass config= if its sizes were inferred wrongly)\n{report}")
        module.load_state_dict(out, strict=True)


def _check_tied(module: nn.Module, values: dict[str, Tensor], report: OfficialReport) -> None:
    """Tensors vlkit ties (one parameter under several names) must receive equal values."""
    groups: dict[int, list[str]] = {}
    for key, tensor in module.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(key)
    for keys in groups.values():
        given = [k for k in keys if k in values]
        if any(not torch.equal(values[given[0]], values[k]) for k in given[1:]):
            report.mismatched.append((f"tied {' = '.join(given)} receive different official tensors", (), ()))


def read_config(config: Mapping[str, Any] | str | os.PathLike | None) -> dict[str, Any]:
    """An official config as a dict: a mapping, or a JSON / YAML file (``bert_base_6layer_6conect.json``,
    ``uniter-base.json``, METER named-config values)."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    import json

    import yaml

    path = check_released(config, "config")
    try:
        values = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    except (ValueError, yaml.YAMLError) as err:
        raise ConversionError(f"{path}: not a readable config ({err})") from None
    if not isinstance(values, Mapping):
        raise ConversionError(f"{path}: a config file must hold a mapping of keys to values")
    return dict(values)


def config_fields(config: Mapping[str, Any], accepted: Sequence[str], ignored: Mapping[str, str], name: str,
                  checks: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The values of ``config`` vlkit reads (``accepted``); ``ignored`` official keys are dropped (with the
    reason in their mapping), ``checks`` official keys must have the value given there; any other key is an
    error naming it."""
    out = {}
    for key, value in config.items():
        if checks and key in checks:
            if value != checks[key]:
                raise ConversionError(f"{name}: config {key}={value!r} is not supported by vlkit (it reproduces "
                                      f"{key}={checks[key]!r})")
        elif key in accepted:
            out[key] = value
        elif key not in ignored:
            raise ConversionError(f"{name}: unknown config key {key!r}; known: {', '.join(sorted([*accepted, *ignored]))}")
    return out


def agree(values: dict[str, Any], key: str, inferred: Any, evidence: str, name: str) -> None:
    """Set ``values[key]`` from the checkpoint's shapes; a config value that disagrees is an error."""
    given = values.get(key)
    if given is not None and given != inferred:
        raise ConversionError(f"{name}: config {key}={given!r} disagrees with the checkpoint ({evidence} gives {inferred!r})")
    values[key] = inferred


def pretraining_mix(model: nn.Module, present: Sequence[str], extra: Mapping[str, Mapping[str, Any]] | None = None,
                    options: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The family's default objective mix restricted to the objectives whose heads the checkpoint holds
    (``present``), with ``options`` merged into theirs and ``extra`` objectives added (their heads too)."""
    mix = load_mix(recipe_of(model).mix)
    objectives = {}
    for name, opts in mix["objectives"].items():
        if name in present:
            objectives[name] = {**(opts or {}), **(options or {}).get(name, {})}
        elif not OBJECTIVES.get(name).has_head:
            objectives[name] = opts  # head-less companions (wra) ride along
    for name, opts in (extra or {}).items():
        if name in present:
            objectives[name] = {**opts, **(options or {}).get(name, {})}
    if not objectives:
        raise ConversionError(f"no pre-training objective of the {model.family} mix has its head in the checkpoint")
    return {**mix, "objectives": objectives}


__all__ = ["ConversionError", "OfficialConverter", "OfficialReport", "Source", "PRETRAINING", "MODEL", "OTHER_LAYOUTS",
           "read_official", "detect_family", "describe_family", "fold_weight_norm", "read_config", "pretraining_mix",
           "agree", "config_fields", "count_indexed", "require", "rename_legacy_layer_norm"]
