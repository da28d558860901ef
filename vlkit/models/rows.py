"""Which positions a layer computes: row selection (the same positions in every example, or each example's
own), the keep masks of `VLModel.fuse`'s ``keep_rows``, and the packed single-stream layout (UNITER's
``gather_index``) that `vlkit.models.layers.run_single_stream` runs on."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import torch
from torch import Tensor

# positions a layer computes: the same list in every example, or a [B, R] index tensor per example
Rows = Union[Sequence[int], Tensor, None]


def select_rows(x: Tensor, rows: Rows) -> Tensor:
    """``x[:, rows]`` for a list of positions, or each example's positions for a [B, R] index tensor."""
    if rows is None:
        return x
    if isinstance(rows, Tensor):
        return x.gather(1, rows[..., None].expand(-1, -1, x.shape[-1]))
    return x[:, list(rows)]


def keep_index(keep: Tensor) -> Tensor:
    """[B, L] bool -> [B, R] distinct positions per example, its kept ones first (R = the largest count;
    an example with fewer fills up with other positions, which are then computed too)."""
    count = int(keep.sum(1).max())  # one host sync: R is a shape
    return keep.to(torch.uint8).argsort(dim=1, descending=True, stable=True)[:, :max(count, 1)]


def with_pooled(keep: Tensor | None, offset: int = 0) -> Tensor | None:
    """A [B, L] keep mask (of `VLModel.fuse`'s ``keep_rows``) with ``offset`` leading positions ([IMG], a
    ViT's [CLS]) prepended and position 0 (what the poolers read) kept; None (every position) stays None."""
    if keep is None:
        return None
    if offset:
        keep = torch.cat([keep.new_zeros(keep.shape[0], offset), keep], dim=1)
    return torch.cat([torch.ones_like(keep[:, :1]), keep[:, 1:]], dim=1)


def scatter_rows(out: Tensor, index: Tensor, length: int) -> Tensor:
    """[B, R, H] states of the positions ``index`` [B, R] -> [B, length, H], zeros elsewhere."""
    return out.new_zeros(out.shape[0], length, out.shape[-1]).scatter(1, index[..., None].expand_as(out), out)


def packing(text_mask: Tensor, image_mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """Index maps of the packed layout (real text positions first, then real image positions; masks are
    left-aligned): ``(gather index [B, L] into [text | image], packed mask [B, L], text positions [B, T]
    and image positions [B, K] in the packed sequence)``; None when packing saves no position."""
    t, k = text_mask.shape[1], image_mask.shape[1]
    t_len, k_len = text_mask.sum(1, keepdim=True), image_mask.sum(1, keepdim=True)
    total = t_len + k_len
    length = int(total.max())  # one host sync: the packed length is a shape
    if length >= t + k:
        return None
    pos = torch.arange(length, device=text_mask.device)[None]
    index = torch.where(pos < t_len, pos, t + pos - t_len).clamp(max=t + k - 1)
    mask = (pos < total).to(text_mask.dtype)
    text_index = torch.arange(t, device=text_mask.device)[None].clamp(max=length - 1).expand(len(t_len), -1)
    image_index = (t_len + torch.arange(k, device=text_mask.device)[None]).clamp(max=length - 1)
    return index, mask, text_index, image_index
