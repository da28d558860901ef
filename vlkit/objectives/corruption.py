"""Corruption views: what the mixture does to a copy of the batch before a pass (`vlkit.objectives.mix`).

An objective names the view it scores (``Objective.view``); each view is a registered `Corruption`
(``@register_corruption("text")``), built once per `Pretraining` with its options block of the mix
(``text_masking: {prob: 0.2}``) over its ``defaults``. A pass applies its views in ``order`` (pairs first, then
text, regions, patches): each draws from the pass's generator and notes what it did in the `PassContext`. A
plugin adds a view the same way, touching no vlkit file; its objective sets ``view`` to the view's name.

The masking defaults are the keyword defaults of the masking primitives (`vlkit.objectives.masking`), read here.
"""
from __future__ import annotations

import abc
import dataclasses
import inspect
from typing import Any, Callable, ClassVar, Mapping

import torch

from vlkit.objectives.base import Objective, PassContext
from vlkit.objectives.masking import mask_patches, mask_regions, mask_tokens
from vlkit.registry import CORRUPTIONS, RegistrationError, builtin, describe_entry, plugin_of, register_corruption
from vlkit.types import VLBatch

__all__ = ["BASE_KEYS", "Corruption", "CorruptionContractError", "keyword_defaults", "masking_options", "views"]

# the keys of a mix besides the views' options blocks (`Corruption.options_key`)
BASE_KEYS = ("sampling", "masking", "seed", "mask_only_matched", "share_encodings", "objectives")


def keyword_defaults(function: Callable[..., Any], names: tuple[str, ...]) -> dict[str, Any]:
    """``{name: default}`` of ``function``'s keyword parameters ``names``, in that order (each default written once,
    in the function's signature)."""
    parameters = inspect.signature(function).parameters
    return {name: parameters[name].default for name in names}


class Corruption(abc.ABC):
    """A view: how a pass corrupts the batch for the objectives that score it.

    ``options_key``: the mix key of the view's options (None: it takes none); ``defaults``: every option with its
    default (an unknown option is refused when the mix is built); ``masks``: a masking view, which a ``joint`` pass
    adds whenever it masks anything (ViLBERT masks every modality the mix masks); ``order``: when a pass applies it.
    ``mix`` is the `vlkit.objectives.mix.Pretraining` (its ``model``, ``tokens``, ``objectives``,
    ``mask_only_matched``).
    """

    name: ClassVar[str] = ""  # the registered name (``@register_corruption()`` takes it from here)
    options_key: ClassVar[str | None] = None
    defaults: ClassVar[Mapping[str, Any]] = {}
    masks: ClassVar[bool] = False
    order: ClassVar[int] = 50

    def __init__(self, mix: Any, options: Mapping[str, Any] | None = None):
        unknown = sorted(set(options or {}) - set(self.defaults))
        if unknown:
            raise KeyError(f"objective mix: {self.options_key or self.name} has unknown option(s) "
                           f"{', '.join(unknown)}; it takes {', '.join(self.defaults) or 'none'}")
        self.options = {**self.defaults, **(options or {})}

    @classmethod
    def check_contract(cls, name: str) -> None:
        """Registration refuses a view whose options key is a mix key of its own or another view's."""
        taken = {c.options_key: n for n, c in CORRUPTIONS._entries.items() if n != name and c.options_key}
        if cls.options_key in BASE_KEYS or cls.options_key in taken:
            owner = f"view {taken[cls.options_key]!r}" if cls.options_key in taken else "the mix"
            raise RegistrationError(f"corruption {name!r} ({describe_entry(cls)}): options_key {cls.options_key!r} "
                                    f"is taken by {owner}; give the view's options a key of its own")

    @abc.abstractmethod
    def apply(self, mix: Any, batch: VLBatch, ctx: PassContext, generator: torch.Generator) -> VLBatch:
        """The corrupted ``batch`` (a new one; the input is never modified), noting in ``ctx`` what changed (the
        objectives' targets; ``text_from`` / ``image_from`` = None for a side that no longer shows the clean batch)."""

    def corrupt(self, mix: Any, batch: VLBatch, ctx: PassContext, generator: torch.Generator) -> VLBatch:
        """`apply`, held to its contract: a `VLBatch` whose inputs keep the shapes of ``batch``'s. A view that breaks
        it, or a plugin's view that fails, is a `CorruptionContractError` naming the view, its class and its plugin
        package (not a shape error inside the model)."""
        cls = type(self)
        what = f"corruption view {self.name!r} ({describe_entry(cls)}{plugin_of(cls)})"
        try:
            out = self.apply(mix, batch, ctx, generator)
        except Exception as err:
            if builtin(cls):
                raise
            raise CorruptionContractError(f"{what}: apply() failed: {type(err).__name__}: {err}") from err
        if not isinstance(out, VLBatch):
            raise CorruptionContractError(f"{what}: apply() returned {type(out).__name__}, not a VLBatch (the "
                                          "corrupted copy of the batch)")
        changed = [f"{f.name} {tuple(getattr(out, f.name).shape)} (given {tuple(getattr(batch, f.name).shape)})"
                   for f in dataclasses.fields(VLBatch) if isinstance(getattr(batch, f.name), torch.Tensor)
                   and isinstance(getattr(out, f.name), torch.Tensor)
                   and getattr(out, f.name).shape != getattr(batch, f.name).shape]
        if changed:
            raise CorruptionContractError(f"{what}: apply() changed the shape of {', '.join(changed)}; a view returns "
                                          "a corrupted copy of the batch, every input's shape unchanged "
                                          "(vlkit.objectives.corruption.Corruption.apply)")
        return out


class CorruptionContractError(ValueError):
    """A corruption view whose `Corruption.apply` broke its contract (the message names the view and its plugin)."""


def views() -> dict[str, type[Corruption]]:
    """The registered views by name, in the order a pass applies them."""
    classes = {name: CORRUPTIONS.get(name) for name in CORRUPTIONS.names()}
    return dict(sorted(classes.items(), key=lambda item: (item[1].order, item[0])))


def masking_options() -> dict[str, tuple[str, ...]]:
    """``{options_key: option names}`` of the registered views (the options blocks a mix may hold)."""
    return {cls.options_key: tuple(cls.defaults) for cls in views().values() if cls.options_key}


@register_corruption()
class Pairs(Corruption):
    """Mismatched pairs mixed in by the mix's pair maker (the first objective that ``makes_pairs``: ITM);
    with the mix's ``mask_only_matched`` the masked-modelling losses score the aligned rows only (ViLBERT)."""

    name = "pairs"
    order = 0

    def maker(self, mix: Any) -> Objective:
        makers = [o for o in mix.objectives.values() if o.makes_pairs]
        if not makers:
            raise ValueError("objective mix: a pairs objective (e.g. wra) needs 'itm' in the mix to make pairs")
        return makers[0]

    def apply(self, mix: Any, batch: VLBatch, ctx: PassContext, generator: torch.Generator) -> VLBatch:
        maker = self.maker(mix)
        source, ctx.itm_match = maker.pair_sources(batch, generator)
        batch = ctx.original = maker.swap(batch, source)
        if maker.negatives == "image":
            ctx.image_from = source
        else:
            ctx.text_from = source
        if mix.mask_only_matched:
            ctx.score_rows = ctx.itm_match
        return batch


@register_corruption()
class MaskedText(Corruption):
    """MLM masking (`mask_tokens`) with the tokenizer facts of the mix; ``policy`` other than ``bernoulli`` takes
    word starts from the WordPiece continuations."""

    name = "text"
    options_key = "text_masking"
    defaults = keyword_defaults(mask_tokens, ("prob", "policy", "force_one", "hf_length"))
    masks = True
    order = 10

    def apply(self, mix: Any, batch: VLBatch, ctx: PassContext, generator: torch.Generator) -> VLBatch:
        t = mix.tokens
        word_starts = None
        if t.continuation is not None and self.options["policy"] != "bernoulli":
            word_starts = ~t.continuation.to(batch.input_ids.device)[batch.input_ids]
        ids, ctx.mlm_labels = mask_tokens(
            batch.input_ids, batch.attention_mask, mask_token_id=t.mask_token_id,
            vocab_size=t.vocab_size or mix.model.vocab_size, special_ids=t.special_ids,
            random_range_start=t.random_range_start, generator=generator, word_starts=word_starts,
            hf_skip_ids=t.hf_skip_ids, **self.options)
        ctx.text_from = None
        return batch.replace(input_ids=ids)


@register_corruption()
class MaskedRegions(Corruption):
    """MRM masking (`mask_regions`)."""

    name = "regions"
    options_key = "region_masking"
    defaults = keyword_defaults(mask_regions, ("prob", "zero_prob", "min_masked"))
    masks = True
    order = 20

    def apply(self, mix: Any, batch: VLBatch, ctx: PassContext, generator: torch.Generator) -> VLBatch:
        batch, ctx.region_masked = mask_regions(batch, generator=generator, **self.options)
        ctx.image_from = None
        return batch


@register_corruption()
class MaskedPatches(Corruption):
    """MIM masking (`mask_patches`) on the model's patch grid."""

    name = "patches"
    options_key = "patch_masking"
    defaults = keyword_defaults(mask_patches, ("prob", "min_masked", "exact"))
    masks = True
    order = 30

    def apply(self, mix: Any, batch: VLBatch, ctx: PassContext, generator: torch.Generator) -> VLBatch:
        pixels, ctx.patch_masked = mask_patches(batch.pixel_values, mix.model.patch_size, generator=generator,
                                                **self.options)
        ctx.image_from = None
        return batch.replace(pixel_values=pixels)
