"""The objective mixture: which objectives run at a step, how the batch is corrupted for them, and
how their losses combine. A mix is the YAML of ``conf/objectives/*.yaml``:

    sampling: per_batch        # one unit per optimizer step, drawn by ratio (UNITER); or: sum
    masking: conditional       # each pass masks one modality (UNITER); or: joint (ViLBERT)
    objectives:
      itm: {ratio: 30, wra: {weight: 0.1}}     # a companion rides on its unit's pass
      mlm: {ratio: 40}
      mrfr: {ratio: 20}
      mrc_kl: {ratio: 20}

A *pass* is one forward of the model over a corrupted copy of the batch. ``conditional`` runs one
pass per view (masked text, masked regions, masked patches, mixed pairs: METER's two forward
passes); ``joint`` runs a single pass that mixes in negatives and masks every modality the mix
masks, independently (ViLBERT). A view is a registered `vlkit.objectives.corruption.Corruption`, its
options the mix's block of its ``options_key`` (``text_masking`` ...). Objectives of the ``unimodal`` view
(``itc``) get their own pass over the clean batch that runs only ``encode_text`` / ``encode_image``. ``every_step: true`` runs an
objective at every step on top of the drawn unit (``per_batch``), as ``vlkit compare`` adds ``itc``. Randomness comes from ``(seed, step)`` (objective choice: the same
on every rank and every accumulation micro-batch) and ``(seed, micro_step)`` (masks, negatives).
"""
from __future__ import annotations

import inspect
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from vlkit.config import load_yaml, unwrap
from vlkit.io import config_dir
from vlkit.models.base import VLModel
from vlkit.objectives.base import IncompatibleObjective, Objective, PassContext, TokenInfo
from vlkit.objectives.corruption import BASE_KEYS, Corruption, masking_options, views
from vlkit.registry import CORRUPTIONS, OBJECTIVES, UnknownNameError, did_you_mean
from vlkit.types import Encoded, LossOutput, VLBatch

# the modes of a mix when it names none (its views' options: `vlkit.objectives.corruption`)
DEFAULTS = {"sampling": "per_batch", "masking": "conditional", "seed": 0, "mask_only_matched": False,
            "share_encodings": True}
UNIMODAL = "unimodal"  # a pass of encode_text / encode_image over the clean batch, no fusion
PRESET_DIR = config_dir() / "objectives"


@dataclass
class Unit:
    """An objective and the companions that ride on its pass (UNITER's WRA on the ITM batch)."""

    name: str
    ratio: float = 1.0
    weight: float = 1.0
    every_step: bool = False
    companions: dict[str, float] = field(default_factory=dict)  # name -> weight


def mix_keys() -> tuple[str, ...]:
    """The keys of a mix: `BASE_KEYS` and the registered views' options blocks (``text_masking`` ...)."""
    return (*BASE_KEYS[:-1], *masking_options(), BASE_KEYS[-1])


def load_mix(mix: Any) -> dict[str, Any]:
    """A mix as a plain dict: a preset name (``conf/objectives/<name>.yaml``), a YAML path, or a mapping; a
    mapping of objective names only is the short form ``{objective: ratio or options}`` of its ``objectives``
    (``{"mlm": 2, "itm": 1}``: one of them per step, drawn 2:1)."""
    if isinstance(mix, (str, Path)):
        path = Path(mix)
        if not path.suffix:
            path = PRESET_DIR / f"{mix}.yaml"
        if not path.is_file():
            presets = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
            raise FileNotFoundError(f"no objective mix {str(mix)!r}; presets: {', '.join(presets)}")
        mix = load_yaml(path)
    mix = unwrap(mix)
    if not isinstance(mix, Mapping):
        raise TypeError(f"an objective mix is a preset name or a mapping, not {type(mix).__name__}")
    keys, objectives = mix_keys(), OBJECTIVES.names()
    if mix and not set(mix) & set(keys) and short_form(mix, objectives):  # {objective: ratio}
        unknown = [name for name in mix if name not in objectives]
        if unknown:
            raise KeyError("objective mix: unknown objective(s) " + ", ".join(
                f"{name!r}{did_you_mean(name, objectives)}" for name in unknown) + " in the short form {objective: ratio}; "
                f"objectives: {', '.join(objectives)}")
        mix = {"objectives": {name: {"ratio": value} if isinstance(value, (int, float)) else value
                              for name, value in mix.items()}}
    unknown = sorted(set(mix) - set(keys))
    if unknown:
        short = f", or the short form {{objective: ratio}} of the objectives {', '.join(objectives)}"
        raise KeyError(f"objective mix: unknown key(s) {', '.join(unknown)}; keys: {', '.join(keys)}"
                       f"{short if not set(mix) & set(keys) else ''}")
    if not mix.get("objectives"):
        raise KeyError("objective mix: 'objectives' is empty")
    check_unit_keys(mix)
    return dict(mix)


def short_form(mix: Mapping[str, Any], objectives: list[str]) -> bool:
    """Whether a mapping without mix keys is the short form ``{objective: ratio or options}``: it names a
    registered objective, or every value is a ratio (``{"itmm": 1}`` is a misspelt objective, not a mix key)."""
    return any(name in objectives for name in mix) or all(
        isinstance(value, (int, float)) and not isinstance(value, bool) for value in mix.values())


def check_unit_keys(mix: Mapping[str, Any]) -> None:
    """Refuse a unit key that its sampling mode would ignore (`ValueError` naming the objective, the key and the
    mode): ``ratio`` where every objective runs at every step (``sampling: sum``, ``every_step``), ``weight`` on an
    objective drawn per batch (one objective per step: ``ratio`` says how often; a constant factor on the loss of
    the only objective of a step is, under Adam, all but undone)."""
    sampling, known = mix.get("sampling", DEFAULTS["sampling"]), OBJECTIVES.names()
    for name, options in (mix.get("objectives") or {}).items():
        if name not in known:  # an unknown objective is refused as such (`check_mix`, the preflight)
            continue
        options = options if isinstance(options, Mapping) else {}
        every_step = bool(options.get("every_step", False))
        if "ratio" in options and (sampling == "sum" or every_step):
            where = "an every_step objective" if every_step else "a summed mix (sampling: sum)"
            raise ValueError(f"objective mix: objectives.{name}.ratio has no effect in {where}: every objective "
                             f"runs at every step; give {name} a weight to scale its loss, or set sampling: per_batch "
                             "to draw one objective per step by ratio")
        if "weight" in options and sampling == "per_batch" and not every_step:
            raise ValueError(f"objective mix: objectives.{name}.weight is not a per-batch option (sampling: per_batch "
                             "draws one objective per step, whose loss a constant weight only rescales, which Adam "
                             f"all but undoes): give {name} a ratio to set how often it is drawn, set every_step: true "
                             "to add its weighted loss at every step, or set sampling: sum to add the weighted losses")


def mix_objectives(mix: Any) -> list[str]:
    """The objective names of a mix (companions such as WRA included)."""
    names = []
    for name, options in load_mix(mix)["objectives"].items():
        names.append(name)
        names += [k for k in (options or {}) if k in OBJECTIVES.names()]
    return names


def build_objective(name: str, model: VLModel, **options: Any) -> Objective:
    """One registered objective for ``model``, with the family's official defaults under ``options``."""
    cls = OBJECTIVES.get(name)
    cls.check(model)
    options = cls.options(model, options)
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "model"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise TypeError(f"objective {name!r} has no option(s) {', '.join(unknown)}; options: {', '.join(sorted(accepted))}")
    return cls(model, **options)


def check_mix(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` (a `load_mix` mix) when its modes are known and it names registered objectives, else `ValueError` /
    `vlkit.registry.UnknownNameError`: a mix is checked before any model or data is built."""
    sampling, masking = (cfg.get(key, DEFAULTS[key]) for key in ("sampling", "masking"))
    if sampling not in ("per_batch", "sum") or masking not in ("conditional", "joint"):
        raise ValueError(f"objective mix: sampling must be per_batch|sum and masking conditional|joint; got "
                         f"{sampling!r}, {masking!r}")
    for name in cfg.get("objectives") or {}:
        OBJECTIVES.get(name)
    return cfg


class Pretraining(nn.Module):
    """The pre-training module: the model, the objectives' heads, and the mixture that drives a step.

    ``forward(batch, step, micro_step=None) -> LossOutput`` whose metrics name the objectives used
    (``objective/<name>`` = 1) and their figures (``<name>/loss``, ``mlm/acc``, ``itm/acc``,
    ``wra/ot_pos`` ...).
    """

    def __init__(self, model: VLModel, mix: Any, tokens: TokenInfo | None = None, seed: int | None = None):
        super().__init__()
        cfg = check_mix(load_mix(mix))
        self.mix = cfg
        self.model = model
        cfg_or_default = {**DEFAULTS, **{k: v for k, v in cfg.items() if k in DEFAULTS}}
        self.sampling, self.masking = cfg_or_default["sampling"], cfg_or_default["masking"]
        self.seed = int(cfg_or_default["seed"] if seed is None else seed)
        self.mask_only_matched = bool(cfg_or_default["mask_only_matched"])
        # false: every pass encodes what it shows, as METER's official code runs its vision tower in each of its two
        # passes; the same losses, more arithmetic (a paper's run as it ran, `vlkit.compare.costs`)
        self.share_encodings = bool(cfg_or_default["share_encodings"])
        self.tokens = tokens or TokenInfo(vocab_size=model.vocab_size)
        self.objectives = nn.ModuleDict()
        self.units: list[Unit] = []
        for name, options in cfg["objectives"].items():
            options = dict(options or {})
            unit = Unit(name, float(options.pop("ratio", 1.0)), float(options.pop("weight", 1.0)),
                        bool(options.pop("every_step", False)))
            for companion in [k for k in options if k in OBJECTIVES]:
                extra = dict(options.pop(companion) or {})
                unit.companions[companion] = float(extra.pop("weight", 1.0))
                self._add(companion, extra)
            self._add(name, options)
            self.units.append(unit)
        for objective in self.objectives.values():
            objective.attach(self.objectives)
        if self.mask_only_matched and not any(o.view == "pairs" for o in self.objectives.values()):
            raise ValueError("objective mix: mask_only_matched needs an objective that mixes in pairs (itm)")
        for name, objective in self.objectives.items():
            if objective.view != UNIMODAL and objective.view not in CORRUPTIONS:
                raise UnknownNameError(f"objective mix: objective {name!r} scores the view {objective.view!r}, which "
                                       f"no registered corruption makes; views: {', '.join(CORRUPTIONS.names())} (a "
                                       "plugin registers its own with vlkit.register_corruption)")
        # every registered view, with its options block of the mix, in the order a pass applies them
        self.corruptions: dict[str, Corruption] = {
            name: cls(self, cfg.get(cls.options_key) if cls.options_key else None) for name, cls in views().items()}
        self.mask_views = {o.view for o in self.objectives.values()
                           if o.view != UNIMODAL and self.corruptions[o.view].masks}
        self._keep_rows = getattr(type(model), "keeps_rows", False)  # the family prunes rows (declared)
        self._shared_sides: dict[str, bool] | None = None

    def train(self, mode: bool = True) -> "Pretraining":
        self._shared_sides = None  # the modes change: which clean encodings can be shared is read again
        return super().train(mode)

    def shared_sides(self) -> dict[str, bool]:
        """Per side (``text``, ``image``), whether its encoding draws no random numbers in the current mode, so
        that the passes of a step can share one clean encoding (read once per `train` / `eval`)."""
        if self._shared_sides is None:
            self._shared_sides = {side: self.share_encodings and not any(stochastic(m)
                                                                         for m in self.model.encoding_modules(side))
                                  for side in ("text", "image")}
        return self._shared_sides

    def _add(self, name: str, options: dict[str, Any]) -> None:
        if name in self.objectives:
            raise ValueError(f"objective mix: {name!r} appears twice")
        try:
            self.objectives[name] = build_objective(name, self.model, **options)
        except IncompatibleObjective as err:
            raise IncompatibleObjective(f"objective mix: {err}") from None

    # -- the plan of a step ----------------------------------------------------------------------
    def active_units(self, step: int) -> list[Unit]:
        """``sum``: every unit; ``per_batch``: one unit drawn by ratio from ``(seed, step)`` alone."""
        drawn = [u for u in self.units if not u.every_step]
        if self.sampling == "sum" or not drawn:
            return list(self.units)
        rng = random.Random(f"vlkit-mix:{self.seed}:{step}")
        return rng.choices(drawn, weights=[u.ratio for u in drawn]) + [u for u in self.units if u.every_step]

    def plan(self, units: list[Unit]) -> list[tuple[frozenset[str], list[tuple[str, float]]]]:
        """Passes ``(views, [(objective, weight)])`` for the active units."""
        scored = [(u.name, u.weight) for u in units] + [(c, w) for u in units for c, w in u.companions.items()]
        if self.masking == "joint":
            fused = [(n, w) for n, w in scored if self.objectives[n].view != UNIMODAL]
            unimodal = [(n, w) for n, w in scored if self.objectives[n].view == UNIMODAL]
            views = {self.objectives[n].view for n, _ in fused}
            if views & self.mask_views:
                views |= self.mask_views
            return ([(frozenset(views), fused)] if fused else []) + \
                ([(frozenset([UNIMODAL]), unimodal)] if unimodal else [])
        passes: dict[str, list[tuple[str, float]]] = {}
        for unit in units:
            passes.setdefault(self.objectives[unit.name].view, []).append((unit.name, unit.weight))
            for companion, weight in unit.companions.items():
                passes[self.objectives[unit.name].view].append((companion, weight))
        return [(frozenset([view]), scored_) for view, scored_ in passes.items()]

    def scorer(self) -> Objective | None:
        """The first objective of the mix that offers retrieval a matching score (`Objective.offers_scorer`)."""
        return next((o for o in self.objectives.values() if o.offers_scorer), None)

    def shown_alignment(self) -> Objective | None:
        """The first objective of the mix that shows a word-region alignment (`Objective.alignment_title`)."""
        return next((o for o in self.objectives.values() if o.alignment_title), None)

    def corrupt(self, batch: VLBatch, views: frozenset[str], generator: torch.Generator) -> tuple[VLBatch, PassContext]:
        """Mix in pairs and mask what ``views`` ask for; the input batch is never modified."""
        rows = torch.arange(batch.batch_size, device=batch.device)
        ctx = PassContext(original=batch, text_from=rows, image_from=rows)
        for name, view in self.corruptions.items():
            if name in views:
                batch = view.corrupt(self, batch, ctx, generator)
        return batch, ctx

    def _fuse_options(self, wanted: list, batch: VLBatch, image: Encoded) -> dict[str, Any]:
        """``fuse`` keywords from what a pass's objectives read (`Objective.rows`): every state (nothing
        to prune), only the joint vector (``pooled_only``), or some positions (``keep_rows``)."""
        if any(w is None for w in wanted):
            return {}
        if all(t is None and i is None for t, i in wanted):
            return {"pooled_only": True}
        if not self._keep_rows:
            return {}
        shapes = (tuple(batch.input_ids.shape), (batch.batch_size, image.states.shape[1] - self.model.image_offset))

        def union(masks: list, shape: tuple[int, int]) -> Tensor:
            out = torch.zeros(shape, dtype=torch.bool, device=image.states.device)
            for m in masks:
                if m is not None:
                    out = out | m.to(out.device)
            return out

        return {"keep_rows": tuple(union([w[side] for w in wanted], shapes[side]) for side in (0, 1))}

    # -- a training step -------------------------------------------------------------------------
    def forward(self, batch: VLBatch, step: int = 0, micro_step: int | None = None,
                units: list[Unit] | None = None) -> LossOutput:
        """The loss of one step: of ``units`` when given (a FLOP count of each), else of those drawn for ``step``."""
        micro_step = step if micro_step is None else micro_step
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + micro_step)
        total: Tensor | None = None
        metrics: dict[str, Any] = {}
        # unimodal encodings of the clean batch, shared by the passes that show it unchanged (or
        # permuted); per side, only when its encoding draws no random numbers (re-encoding gives the same)
        clean = _CleanEncodings(self.model, batch, self.shared_sides())
        for pass_views, scored in self.plan(self.active_units(step) if units is None else units):
            if pass_views == {UNIMODAL}:
                corrupted, ctx = batch, PassContext(original=batch)
                rows = torch.arange(batch.batch_size, device=batch.device)
                out = (clean.text(rows, batch), clean.image(rows, batch))
            else:
                corrupted, ctx = self.corrupt(batch, pass_views, generator)
                text, image = clean.text(ctx.text_from, corrupted), clean.image(ctx.image_from, corrupted)
                wanted = [self.objectives[name].rows(ctx) for name, _ in scored]
                out = self.model.fuse(text, image, **self._fuse_options(wanted, corrupted, image))
            for name, weight in scored:
                result = self.objectives[name](out, corrupted, ctx)
                total = weight * result.loss if total is None else total + weight * result.loss
                metrics[f"objective/{name}"] = 1.0
                metrics[f"{name}/loss"] = result.loss.detach()
                metrics.update({f"{name}/{k}": v for k, v in result.metrics.items()})
        return LossOutput(total, metrics)


def stochastic(module: nn.Module) -> bool:
    """Whether a forward pass of ``module`` in its current mode draws random numbers (dropout, drop path)."""
    for m in module.modules():
        if not m.training:
            continue
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        if any(isinstance(getattr(m, a, None), float) and getattr(m, a) > 0
               for a in ("dropout", "dropout_prob", "drop_prob", "attention_dropout")):
            return True
    return False


class _CleanEncodings:
    """``encode_text`` / ``encode_image`` of one step's clean batch, computed on first use and shared by
    the passes whose rows show it unchanged, for each side whose encoding is deterministic (the model's
    ``encoding_modules`` draw no random numbers: METER's CLIP tower has no dropout, its text tower has;
    ``shared``: `Pretraining.shared_sides`)."""

    def __init__(self, model: VLModel, batch: VLBatch, shared: dict[str, bool]):
        self.model, self.batch, self.shared = model, batch, shared
        self._cache: dict[str, Encoded] = {}

    def _get(self, side: str, rows: Tensor | None, batch: VLBatch) -> Encoded:
        encode = self.model.encode_text if side == "text" else self.model.encode_image
        if rows is None or not self.shared[side]:  # masked, or not reproducible: encode what the pass shows
            return encode(batch)
        if side not in self._cache:
            self._cache[side] = encode(self.batch)
        encoded = self._cache[side]
        if bool((rows == torch.arange(len(rows), device=rows.device)).all()):
            return encoded
        return encoded.index(rows)

    def text(self, rows: Tensor | None, batch: VLBatch) -> Encoded:
        """The text encoding of ``batch``, whose captions are the clean batch's ``rows`` (None: changed)."""
        return self._get("text", rows, batch)

    def image(self, rows: Tensor | None, batch: VLBatch) -> Encoded:
        """The image encoding of ``batch``, whose images are the clean batch's ``rows`` (None: changed)."""
        return self._get("image", rows, batch)


def build_pretraining(model: VLModel, mix: Any, tokenizer: Any = None, seed: int | None = None,
                      random_from: str | None = None) -> Pretraining:
    """``build_pretraining(model, "uniter")``: the `Pretraining` module for ``model`` with mix ``mix``
    (a preset name, a YAML path, a dict or a DictConfig); ``tokenizer`` supplies the MLM token ids."""
    tokens = TokenInfo.from_tokenizer(tokenizer, random_from) if tokenizer is not None else None
    return Pretraining(model, mix, tokens, seed)
