"""What the objectives share: the `Objective` base, the prediction-head transform, the pass context
that the mixture hands to each objective, and the tokenizer facts MLM needs."""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import torch
from torch import Tensor, nn

from vlkit.models.base import VLModel
from vlkit.models.layers import activation
from vlkit.models.recipe import recipe_of
from vlkit.types import LossOutput, VLBatch, VLOutput


class IncompatibleObjective(ValueError):
    """An objective that cannot work with a model (e.g. MRC on a patch model), raised at build time."""


@dataclass
class TokenInfo:
    """Tokenizer facts for MLM: [MASK] id, special ids, the random-word range, WordPiece word starts."""

    mask_token_id: int = 103
    special_ids: tuple[int, ...] = (0, 100, 101, 102, 103)
    vocab_size: int | None = None
    random_range_start: int = 0
    continuation: Tensor | None = None  # [vocab] bool, True for "##" WordPiece continuations
    hf_skip_ids: tuple[int, ...] = ()  # ids spelt "[CLS]" / "[SEP]", which HF's whole-word collator skips

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, random_from: str | None = None) -> "TokenInfo":
        """From a Hugging Face tokenizer; ``random_from="!"`` reproduces UNITER's ``v_range``."""
        vocab = tokenizer.get_vocab()
        continuation = torch.zeros(len(tokenizer), dtype=torch.bool)
        for token, index in vocab.items():
            if token.startswith("##") and index < len(continuation):
                continuation[index] = True
        start = tokenizer.convert_tokens_to_ids(random_from) if random_from else 0
        skip = tuple(vocab[t] for t in ("[CLS]", "[SEP]") if t in vocab)
        return cls(mask_token_id=tokenizer.mask_token_id, special_ids=tuple(tokenizer.all_special_ids),
                   vocab_size=len(tokenizer), random_range_start=start,
                   continuation=continuation if continuation.any() else None, hf_skip_ids=skip)


@dataclass
class PassContext:
    """What the mixture did to a batch before the forward pass, for the objectives to score.

    ``mlm_labels`` [B, T] (-100 = not a target); ``region_masked`` / ``patch_masked`` [B, K|N] bool;
    ``original`` is the batch before corruption; ``itm_match`` [B] bool (True = the pair is aligned);
    ``score_rows`` [B] bool restricts masked-modelling losses (ViLBERT ``objective 1``: aligned rows).
    ``text_from`` / ``image_from`` [B]: the row of the clean batch whose caption / image each row shows
    unchanged (None once that side is masked), so unimodal encodings can be reused across passes.
    """

    original: VLBatch
    mlm_labels: Tensor | None = None
    region_masked: Tensor | None = None
    patch_masked: Tensor | None = None
    itm_match: Tensor | None = None
    score_rows: Tensor | None = None
    text_from: Tensor | None = None
    image_from: Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class PredictionHeadTransform(nn.Module):
    """``LayerNorm(act(dense(x)))``: BERT's head transform, also UNITER's MRFR / MRC ``net``."""

    def __init__(self, in_size: int, hidden_size: int, act: str = "gelu", eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(in_size, hidden_size)
        self.transform_act_fn = activation(act)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(x)))


class Objective(nn.Module, metaclass=abc.ABCMeta):
    """One pre-training objective with its own head.

    ``view`` names what the mixture must do to the batch for it, a registered corruption
    (`vlkit.objectives.corruption`): ``text`` (mask tokens), ``regions`` (mask regions), ``patches`` (mask
    patches), ``pairs`` (mix in mismatched pairs) or a plugin's own; ``unimodal``: the clean batch, unfused.
    Subclasses check their model in ``check`` (raising `IncompatibleObjective`) and score a pass in
    ``forward(out, batch, ctx)``.
    """

    name: ClassVar[str] = ""
    view: ClassVar[str] = ""
    # reads only ``VLOutput.joint`` / the pooled vectors: a pass whose objectives all do runs the last
    # fusion layers at the pooled positions only (``fuse(pooled_only=True)``, the same poolers)
    joint_only: ClassVar[bool] = False
    # reads the detector's class distributions of the regions (``VLBatch.region_soft_labels``): the preflight
    # checks the feature store has them, with the model's ``region_classes`` classes
    needs_soft_labels: ClassVar[bool] = False
    # offers retrieval a matching score of fused pairs (`match_score`): zero-shot retrieval scores with it, and a
    # comparison measures its held-out matching accuracy (ITM)
    offers_scorer: ClassVar[bool] = False
    # mixes mismatched pairs into a batch, for the ``pairs`` view (ITM): `pair_sources` and `swap`, replacing the
    # ``negatives`` side ("image" or "text") of the rows it makes negative; the mixture asks the first such objective
    makes_pairs: ClassVar[bool] = False
    negatives: str = "image"
    # shows how it aligns words with regions: a comparison plots `alignment` under this title (WRA's transport
    # plan), the colour bar labelled ``alignment_unit``; None: it shows nothing
    alignment_title: ClassVar[str | None] = None
    alignment_unit: ClassVar[str] = ""
    # has a head of its own in a checkpoint (a converter restricts a mix to the heads a file holds; a head-less
    # companion such as WRA rides along)
    has_head: ClassVar[bool] = True
    # parts fitted on training data before pre-training (MIM's k-means codebook): `fit`, `fitted_from_checkpoint`
    needs_fit: bool = False

    def __init__(self, model: VLModel):
        super().__init__()
        type(self).check(model)

    @classmethod
    def check(cls, model: VLModel) -> None:
        """Raise `IncompatibleObjective` if ``model`` cannot serve this objective."""

    @classmethod
    def options(cls, model: VLModel, given: dict[str, Any]) -> dict[str, Any]:
        """The defaults the model's family declares for this objective (its recipe's ``objective_defaults``),
        overridden by ``given``."""
        return {**recipe_of(model).objective_defaults.get(cls.name, {}), **given}

    def rows(self, ctx: PassContext) -> tuple[Tensor | None, Tensor | None] | None:
        """The token / region (patch) positions whose fused states this objective reads, as ``(text [B, T],
        image [B, K])`` bool masks (None: that side is not read), or None when it reads every state (the
        default). The mixture lets the model compute the last layers at those positions only."""
        return (None, None) if self.joint_only else None

    def pair_sources(self, batch: VLBatch, generator: torch.Generator,
                     similarity: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Which row lends each row its ``negatives`` side: ``(source [B], matched [B] bool)``, for an objective
        that ``makes_pairs`` (``similarity`` [B, B]: the partner of a negative is its most similar row)."""
        raise TypeError(f"objective {self.name!r} makes no pairs")

    def swap(self, batch: VLBatch, source: Tensor) -> VLBatch:
        """Row i of ``batch`` takes the ``negatives`` side of row ``source[i]``, for an objective that
        ``makes_pairs``."""
        raise TypeError(f"objective {self.name!r} makes no pairs")

    def make_pairs(self, batch: VLBatch, generator: torch.Generator,
                   similarity: Tensor | None = None) -> tuple[VLBatch, Tensor]:
        """Mix mismatched pairs into ``batch``: ``(new_batch, matched [B] bool)`` (`pair_sources`, then `swap`)."""
        source, matched = self.pair_sources(batch, generator, similarity)
        return self.swap(batch, source), matched

    def match_score(self, out: VLOutput) -> Tensor:
        """[B] how well each fused pair of ``out`` matches (higher = better), for an objective that
        ``offers_scorer``."""
        raise TypeError(f"objective {self.name!r} offers no matching score")

    def alignment(self, out: VLOutput) -> Tensor:
        """[B, T, K] how each word of ``out`` aligns with each region, for an objective with an ``alignment_title``."""
        raise TypeError(f"objective {self.name!r} shows no word-region alignment")

    def fit(self, pixel_values: Tensor) -> None:
        """Fit the data-dependent parts on training images [M, 3, H, W], for an objective that ``needs_fit``."""
        raise TypeError(f"objective {self.name!r} fits nothing on data")

    def fitted_from_checkpoint(self) -> None:
        """The data-fitted parts come with the weights about to be loaded (a saved run): mark them fitted."""

    def attach(self, objectives: Mapping[str, Objective]) -> None:
        """Called once the mixture holds all its objectives (by name): a head shared with another
        objective is taken from it here."""

    @abc.abstractmethod
    def forward(self, out: VLOutput, batch: VLBatch, ctx: PassContext) -> LossOutput:
        """Score one forward pass of the (corrupted) ``batch``."""


def require_regions(name: str, model: VLModel) -> None:
    if model.image_input != "regions":
        raise IncompatibleObjective(f"objective {name!r} needs region features; {model.family} takes {model.image_input}")


SCORES = ("masked", "all")  # a masked-modelling head decodes the masked positions only, or every position


def check_score(name: str, score: str) -> str:
    """A masked-modelling objective's ``score`` option (`SCORES`), or an error naming the objective."""
    if score not in SCORES:
        raise ValueError(f"{name}: score must be one of {', '.join(SCORES)} (all: every position decoded, the loss "
                         f"at the masked ones, as ViLBERT's and METER's official heads do), not {score!r}")
    return score


def at_mask(x: Tensor, mask: Tensor) -> Tensor:
    """``x[mask]`` for ``x`` [B, L, ...] and a [B, L] bool ``mask``, taken by integer index: a count on the meta
    device (`vlkit.flops.count`) selects by the mask's values without materialising ``x``."""
    return x.flatten(0, 1).index_select(0, mask.flatten().nonzero().squeeze(1).to(x.device))


def masked_rows(mask: Tensor, rows: Tensor | None) -> Tensor:
    """Restrict a [B, L] target mask to the rows in ``rows`` [B] (None keeps all)."""
    return mask if rows is None else mask & rows.view(-1, 1)


def accuracy(logits_or_preds: Tensor, labels: Tensor, ignore_index: int = -100, empty: float = float("nan")) -> Tensor:
    """Classification accuracy (0-dim tensor): arg-max of logits [..., C] or class ids [...] vs labels [...]
    (the objectives' metrics and the tasks' exact ones, `vlkit.tasks.metrics`).

    Positions labelled ``ignore_index`` are skipped; ``empty`` (NaN; the objectives log 0) when none is left.
    """
    preds = logits_or_preds
    if preds.is_floating_point() and preds.dim() == labels.dim() + 1:
        preds = preds.argmax(-1)
    if preds.shape != labels.shape:
        raise ValueError(f"accuracy: predictions {tuple(preds.shape)} do not match labels {tuple(labels.shape)}")
    valid = labels != ignore_index
    if not bool(valid.any()):
        return preds.new_full((), empty, dtype=torch.float)
    return ((preds == labels) & valid).sum().float() / valid.sum()
