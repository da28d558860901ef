"""Input embeddings: BERT text embeddings, region embeddings with 5-d (ViLBERT) or 7-d (UNITER)
box locations, and position-embedding interpolation for ViT patch grids."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def box_locations(boxes: Tensor, dims: int, wh: Tensor | None = None) -> Tensor:
    """Normalised xyxy boxes [..., 4] -> ViLBERT 5-d ``[x1,y1,x2,y2,area]`` or UNITER 7-d
    ``[x1,y1,x2,y2,w,h,w*h]`` location features. ``wh`` [..., 2] gives w and h as the feature file
    stored them (UNITER reads the fp16 ``norm_bb[:, 4:6]`` instead of recomputing them, ``data.py`` L248-252);
    without it they are ``x2 - x1`` and ``y2 - y1``."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    w, h = (x2 - x1, y2 - y1) if wh is None else wh.to(boxes.dtype).unbind(-1)
    if dims == 5:
        return torch.stack([x1, y1, x2, y2, w * h], dim=-1)
    if dims == 7:
        return torch.stack([x1, y1, x2, y2, w, h, w * h], dim=-1)
    raise ValueError(f"box location features have 5 (ViLBERT) or 7 (UNITER) dims, not {dims}")


class BertTextEmbeddings(nn.Module):
    """word + position + token type, then LayerNorm and dropout (BERT, ViLBERT, UNITER)."""

    def __init__(self, vocab_size: int, hidden_size: int, max_position_embeddings: int = 512,
                 type_vocab_size: int = 2, eps: float = 1e-12, dropout: float = 0.1, pad_token_id: int = 0):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def from_config(cls, c) -> "BertTextEmbeddings":
        """From a config with the BERT field names (ViLBERT, UNITER)."""
        return cls(c.vocab_size, c.hidden_size, c.max_position_embeddings, c.type_vocab_size, c.layer_norm_eps,
                   c.hidden_dropout_prob, c.pad_token_id)

    def summed(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """word + position + type, before LayerNorm (ViLBERT inserts its task token here)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        return (self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
                + self.token_type_embeddings(token_type_ids))

    def normalize(self, embeddings: Tensor) -> Tensor:
        return self.dropout(self.LayerNorm(embeddings))

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        return self.normalize(self.summed(input_ids, token_type_ids))


class ViLBERTRegionEmbeddings(nn.Module):
    """``LN(Linear(feat) + Linear(5-d location))`` (ViLBERT ``BertImageEmbeddings``).

    With ``type_vocab_size`` (the single-stream baseline) a token-type embedding (type 0) is added
    before the LayerNorm, as in the official ``basebert.py``.
    """

    def __init__(self, feature_size: int, hidden_size: int, eps: float = 1e-12, dropout: float = 0.1,
                 type_vocab_size: int = 0):
        super().__init__()
        self.image_embeddings = nn.Linear(feature_size, hidden_size)
        self.image_location_embeddings = nn.Linear(5, hidden_size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden_size) if type_vocab_size else None
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, feats: Tensor, boxes: Tensor) -> Tensor:
        emb = self.image_embeddings(feats) + self.image_location_embeddings(box_locations(boxes, 5))
        if self.token_type_embeddings is not None:
            emb = emb + self.token_type_embeddings.weight[0]
        return self.dropout(self.LayerNorm(emb))


class UniterRegionEmbeddings(nn.Module):
    """``LN(LN(img_linear f) + LN(pos_linear 7-d) + type)`` (UNITER ``UniterImageEmbeddings``).

    Masked regions (``masked`` True) get the learned ``mask_embedding[1]`` added to their (zeroed)
    feature; row 0 of the table is never used, as in the official code. ``wh``: the stored box width
    and height (see `box_locations`).
    """

    def __init__(self, feature_size: int, hidden_size: int, eps: float = 1e-12, dropout: float = 0.1):
        super().__init__()
        self.img_linear = nn.Linear(feature_size, hidden_size)
        self.img_layer_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.pos_layer_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.pos_linear = nn.Linear(7, hidden_size)
        self.mask_embedding = nn.Embedding(2, feature_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, feats: Tensor, boxes: Tensor, type_embeddings: Tensor, masked: Tensor | None = None,
                wh: Tensor | None = None) -> Tensor:
        if masked is not None:
            feats = feats + masked[..., None].to(feats.dtype) * self.mask_embedding.weight[1]
        locations = box_locations(boxes, 7, wh)
        emb = self.img_layer_norm(self.img_linear(feats)) + self.pos_layer_norm(self.pos_linear(locations)) + type_embeddings
        return self.dropout(self.LayerNorm(emb))


def interpolate_pos_embed(pos_embed: Tensor, new_grid: int | tuple[int, int], num_prefix_tokens: int = 1) -> Tensor:
    """Resize a ViT position table ``[(1,) prefix + g*g, C]`` to ``new_grid`` with bicubic interpolation
    (``align_corners=False``), keeping the prefix ([CLS]) rows, as METER's ``adapt_position_encoding``."""
    squeeze = pos_embed.dim() == 2
    table = pos_embed if squeeze else pos_embed[0]
    prefix, grid = table[:num_prefix_tokens], table[num_prefix_tokens:]
    old = int(math.isqrt(grid.shape[0]))
    if old * old != grid.shape[0]:
        raise ValueError(f"position table of {grid.shape[0]} grid rows is not a square grid")
    new_h, new_w = (new_grid, new_grid) if isinstance(new_grid, int) else new_grid
    if (old, old) == (new_h, new_w):
        return pos_embed
    grid = grid.reshape(1, old, old, -1).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=(new_h, new_w), mode="bicubic", align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(new_h * new_w, -1).to(table.dtype)
    table = torch.cat([prefix, grid], dim=0)
    return table if squeeze else table[None]
