"""Masking primitives for MLM, MRM and MIM (the mixture, `vlkit.objectives.mix`, decides which a pass applies).

Every function returns new tensors (inputs are never modified) and draws its randomness from the
explicit CPU ``torch.Generator`` it is given, never from global RNG: masks are drawn on the CPU and
moved to the batch's device, so a seed gives the same masks on any device.
"""
from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import Tensor

from vlkit.types import VLBatch

__all__ = ["IGNORE_INDEX", "MASK_PROB", "TOKEN_POLICIES", "mask_patches", "mask_regions", "mask_tokens",
           "word_starts_from_tokens"]

IGNORE_INDEX = -100
TokenPolicy = Literal["bernoulli", "whole_word", "hf_wwm"]
TOKEN_POLICIES = ("bernoulli", "whole_word", "hf_wwm")
MASK_PROB = 0.15  # BERT's share of masked positions, every primitive's default (the mixture's views read them)
_HF_MAX_PREDICTIONS = 512  # DataCollatorForWholeWordMask._whole_word_mask(max_predictions=512)


def _choose(eligible: Tensor, prob: float, min_count: int, generator: torch.Generator,
            exact: bool = False) -> Tensor:
    """Pick eligible positions of each row [B, L]: Bernoulli(``prob``) topped up at random to
    ``min_count`` (or, with ``exact``, exactly ``max(min_count, round(prob * n_eligible))``)."""
    u = torch.rand(eligible.shape, generator=generator).masked_fill_(~eligible, 2.0)
    rank = u.argsort(1).argsort(1)  # 0 = smallest draw; ineligible positions rank last
    if exact:
        count = (eligible.sum(1, keepdim=True) * prob).round().clamp(min=min_count)
        return eligible & (rank < count)
    # The smallest draws among eligible positions are a uniform random subset: topping up with them
    # is UNITER's "force a random region when none was drawn".
    return eligible & ((u < prob) | (rank < min_count))


def word_starts_from_tokens(tokens: Sequence[Sequence[str]], length: int | None = None,
                            continuation_prefix: str = "##") -> Tensor:
    """[B, length] bool, True where a token starts a word: WordPiece marks continuations with ``##``.

    ``tokens`` are per-example token strings (``tokenizer.convert_ids_to_tokens(ids)``); positions
    past an example's end (padding) count as word starts.
    """
    length = max((len(t) for t in tokens), default=0) if length is None else length
    starts = torch.ones(len(tokens), length, dtype=torch.bool)
    for b, row in enumerate(tokens):
        if len(row) > length:
            raise ValueError(f"word_starts_from_tokens: example {b} has {len(row)} tokens, more than length {length}")
        for t, token in enumerate(row):
            starts[b, t] = t == 0 or not token.startswith(continuation_prefix)
    return starts


def _word_ids(word_starts: Tensor | None, shape: torch.Size) -> Tensor:
    """[B, T] index of the word each token belongs to (every token is a word when ``word_starts`` is None)."""
    if word_starts is None:
        return torch.arange(shape[1]).repeat(shape[0], 1)
    if word_starts.shape != shape:
        raise ValueError(f"mask_tokens: word_starts {tuple(word_starts.shape)} does not match input_ids {tuple(shape)}")
    starts = word_starts.detach().cpu().bool().clone()
    starts[:, 0] = True
    return starts.long().cumsum(1) - 1


def _hf_wwm_choice(word_ids: Tensor, candidate: Tensor, num_to_predict: int, generator: torch.Generator) -> Tensor:
    """HF 4.6 ``_whole_word_mask``: shuffle the candidate words, then greedily take whole words while
    the count stays <= ``num_to_predict`` (a word that would overshoot is skipped, later ones tried)."""
    b, t = word_ids.shape
    lengths = torch.zeros(b, t, dtype=torch.long).scatter_add_(1, word_ids, candidate.long())
    keys = torch.rand(b, t, generator=generator).masked_fill_(lengths == 0, 2.0)
    order = keys.argsort(1)
    sorted_len = lengths.gather(1, order)
    take = torch.zeros(b, t, dtype=torch.bool)
    count = torch.zeros(b, dtype=torch.long)
    for j in range(int((lengths > 0).sum(1).max())):
        fits = (sorted_len[:, j] > 0) & (count + sorted_len[:, j] <= num_to_predict)
        take[:, j] = fits
        count += torch.where(fits, sorted_len[:, j], 0)
        if bool((count >= num_to_predict).all()):
            break
    taken_words = torch.zeros(b, t, dtype=torch.bool).scatter_(1, order, take)
    return taken_words.gather(1, word_ids) & candidate


def mask_tokens(
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    special_ids: Sequence[int],
    generator: torch.Generator,
    prob: float = MASK_PROB,
    random_range_start: int = 0,
    policy: TokenPolicy = "bernoulli",
    word_starts: Tensor | None = None,
    force_one: bool = True,
    sample_mask: Tensor | None = None,
    hf_length: int | None = None,
    hf_skip_ids: Sequence[int] = (),
) -> tuple[Tensor, Tensor]:
    """MLM corruption: ``(masked_ids, labels)``, labels = original id where masked, -100 elsewhere.

    Chosen tokens become [MASK] 80%, a random id in ``[random_range_start, vocab_size)`` 10%, and stay
    unchanged 10%. Padding and ``special_ids`` are never chosen; ``sample_mask`` [B] restricts
    masking to some rows. Policies:

    - ``bernoulli`` (UNITER / ViLBERT): each real token with ``prob``. With ``force_one`` (UNITER) a
      row with nothing drawn gets its first eligible token set to [MASK]; ViLBERT: ``force_one=False``.
    - ``whole_word``: each word with ``prob``, all its tokens together. ``word_starts`` [B, T] bool
      marks the first token of each word (``word_starts_from_tokens`` derives it from WordPiece's
      ``##``); ``force_one`` masks the first eligible word of an empty row.
    - ``hf_wwm`` (METER, HF 4.6 ``DataCollatorForWholeWordMask``): ``round(hf_length * prob)``
      positions (``hf_length`` defaults to T, METER pads every caption to 50) are drawn as whole words
      over *all* positions, pads and specials included, except ``hf_skip_ids`` (HF skips tokens spelt
      "[CLS]"/"[SEP]": pass their ids for a BERT vocabulary; none for RoBERTa, METER's case); pads
      and specials are dropped afterwards, so a row may end up with fewer or no masked tokens.
      ``word_starts`` None makes every token a word (RoBERTa has no ``##``). ``force_one`` is ignored.
    """
    if policy not in TOKEN_POLICIES:
        raise ValueError(f"mask_tokens: unknown policy {policy!r}; choose from {TOKEN_POLICIES}")
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(f"mask_tokens: input_ids {tuple(input_ids.shape)} and attention_mask "
                         f"{tuple(attention_mask.shape)} must be the same [B, T]")
    if not 0 <= random_range_start < vocab_size:
        raise ValueError(f"mask_tokens: random_range_start {random_range_start} outside [0, vocab_size={vocab_size})")
    if policy == "whole_word" and word_starts is None:
        raise ValueError("mask_tokens: policy 'whole_word' needs word_starts (see word_starts_from_tokens)")
    device, shape = input_ids.device, input_ids.shape
    ids = input_ids.detach().cpu()
    eligible = attention_mask.detach().cpu().bool() & ~torch.isin(ids, torch.tensor(list(special_ids), dtype=ids.dtype))
    if sample_mask is not None:
        eligible &= sample_mask.detach().cpu().bool().view(-1, 1)
    words = _word_ids(None if policy == "bernoulli" else word_starts, shape)

    forced = torch.zeros(shape, dtype=torch.bool)
    if policy == "hf_wwm":
        hf_length = max(shape[1], hf_length or 0)
        num_to_predict = min(_HF_MAX_PREDICTIONS, max(1, int(round(hf_length * prob))))
        candidate = ~torch.isin(ids, torch.tensor(list(hf_skip_ids), dtype=ids.dtype))
        # METER pads every caption to ``hf_length``: the pad positions past T are candidates too, each
        # its own word, so short captions see the diluted rate of the official collator
        extra = hf_length - shape[1]
        words = torch.cat([words, words[:, -1:] + 1 + torch.arange(extra).expand(shape[0], extra)], dim=1)
        candidate = torch.cat([candidate, torch.ones(shape[0], extra, dtype=torch.bool)], dim=1)
        chosen = _hf_wwm_choice(words, candidate, num_to_predict, generator)[:, :shape[1]] & eligible
    else:
        chosen = (torch.rand(shape, generator=generator).gather(1, words) < prob) & eligible
        if force_one:
            empty = ~chosen.any(1) & eligible.any(1)
            first_word = words.gather(1, eligible.long().argmax(1, keepdim=True))
            forced = (words == first_word) & eligible & empty.view(-1, 1)
            chosen |= forced

    action = torch.rand(shape, generator=generator)
    random_ids = torch.randint(random_range_start, vocab_size, shape, generator=generator, dtype=ids.dtype)
    masked = torch.where(chosen & ((action < 0.8) | forced), torch.full_like(ids, mask_token_id), ids)
    masked = torch.where(chosen & ~forced & (action >= 0.8) & (action < 0.9), random_ids, masked)
    labels = ids.masked_fill(~chosen, IGNORE_INDEX)
    return masked.to(device), labels.to(device)


def mask_regions(batch: VLBatch, *, generator: torch.Generator, prob: float = MASK_PROB, zero_prob: float = 1.0,
                 min_masked: int = 1, sample_mask: Tensor | None = None) -> tuple[VLBatch, Tensor]:
    """MRM masking: ``(new_batch, masked [B, K] bool)``.

    Each real region is chosen with ``prob``, topped up at random to ``min_masked`` per row (UNITER
    forces one); of the chosen, a ``zero_prob`` share get their feature zeroed (UNITER 1.0, ViLBERT
    0.9: the rest keep it but are still targets). Boxes are untouched. The new batch has
    ``region_masked`` = the chosen regions (UNITER adds its mask embedding there; any previous value
    is replaced). ``sample_mask`` [B] restricts masking to some rows.
    """
    if not batch.has_regions:
        raise ValueError("mask_regions: the batch has no regions (region_feats is None)")
    device = batch.region_feats.device
    eligible = batch.region_mask.detach().cpu().bool()
    if sample_mask is not None:
        eligible &= sample_mask.detach().cpu().bool().view(-1, 1)
    chosen = _choose(eligible, prob, min_masked, generator)
    zeroed = chosen & (torch.rand(chosen.shape, generator=generator) < zero_prob)
    feats = batch.region_feats.masked_fill(zeroed.to(device).unsqueeze(-1), 0)
    chosen = chosen.to(device)
    return batch.replace(region_feats=feats, region_masked=chosen), chosen


def mask_patches(pixel_values: Tensor, patch_size: int, *, generator: torch.Generator, prob: float = MASK_PROB,
                 min_masked: int = 1, exact: bool = False) -> tuple[Tensor, Tensor]:
    """MIM masking (METER Table 7): ``(pixels with masked patches zeroed, masked [B, N] bool)``.

    Patches are numbered row-major over the ``H/p x W/p`` grid (the ViT token order). Each patch is
    chosen with ``prob`` (at least ``min_masked``), or with ``exact`` a fixed ratio:
    ``max(min_masked, round(prob * N))`` patches per image.
    """
    if pixel_values.dim() != 4:
        raise ValueError(f"mask_patches: pixel_values must be [B, C, H, W], got {tuple(pixel_values.shape)}")
    b, _, h, w = pixel_values.shape
    if h % patch_size or w % patch_size:
        raise ValueError(f"mask_patches: image {h}x{w} is not a multiple of patch_size {patch_size}")
    gh, gw = h // patch_size, w // patch_size
    masked = _choose(torch.ones(b, gh * gw, dtype=torch.bool), prob, min_masked, generator, exact=exact)
    masked = masked.to(pixel_values.device)
    pixel_mask = masked.view(b, 1, gh, 1, gw, 1).expand(b, 1, gh, patch_size, gw, patch_size).reshape(b, 1, h, w)
    return pixel_values.masked_fill(pixel_mask, 0), masked
