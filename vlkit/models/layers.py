"""Transformer building blocks shared by every family (parameter names follow the BERT code the
official repositories use, so released checkpoints map onto them key by key).

Attention runs through `torch.nn.functional.scaled_dot_product_attention` with the additive
``(1 - mask) * -10000`` mask of the original BERT code.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlkit.models.rows import Rows, keep_index, packing, scatter_rows, select_rows
from vlkit.types import Encoded

MASK_VALUE = -10000.0



class QuickGELU(nn.Module):
    """CLIP's activation ``x * sigmoid(1.702 x)``."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "tanh": nn.Tanh, "quick_gelu": QuickGELU}


def activation(name: str) -> nn.Module:
    """``gelu`` is the exact erf form used by all three official codes."""
    if name not in ACTIVATIONS:
        raise KeyError(f"unknown activation {name!r}; choose from {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """[B, H]: the mean of ``x`` [B, L, H] over the positions ``mask`` [B, L] keeps (0 where it keeps none)."""
    m = mask.to(x.dtype)[..., None]
    return (x * m).sum(1) / m.sum(1).clamp(min=1.0)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """[B, L] (1 = attend) -> [B, 1, 1, L] additive mask ``(1 - m) * -10000`` for SDPA."""
    return ((1.0 - mask[:, None, None, :].to(dtype)) * MASK_VALUE).to(dtype)


# Query / key / value projections that read the same input run as one GEMM over their concatenated weights
# (the weights stay separate modules, so checkpoints keep the official key layout); False: one GEMM each.
FUSE_PROJECTIONS = True


def _fusable(layers: Sequence[nn.Linear]) -> bool:
    return FUSE_PROJECTIONS and len(layers) > 1 and len({layer.bias is None for layer in layers}) == 1


def project_cat(x: Tensor, *layers: nn.Linear) -> Tensor:
    """``cat([layer(x) for layer in layers], -1)``, as one ``F.linear`` over the concatenated weights."""
    if not _fusable(layers):
        return torch.cat([layer(x) for layer in layers], dim=-1)
    bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])
    return F.linear(x, torch.cat([layer.weight for layer in layers]), bias)


def project(x: Tensor, *layers: nn.Linear) -> tuple[Tensor, ...]:
    """``layers[i](x)`` for each layer: one ``F.linear`` over the concatenated weights (`FUSE_PROJECTIONS`)."""
    if not _fusable(layers):
        return tuple(layer(x) for layer in layers)
    return project_cat(x, *layers).split([layer.out_features for layer in layers], dim=-1)


def attend(query: Tensor, key: Tensor, value: Tensor, num_heads: int, mask: Tensor | None,
           dropout_p: float) -> Tensor:
    """Multi-head scaled dot-product attention on projected [B, L, H] inputs -> [B, Lq, H]."""
    b, lq, h = query.shape
    d = h // num_heads

    def split(x: Tensor) -> Tensor:
        return x.view(b, x.shape[1], num_heads, d).transpose(1, 2)

    ctx = F.scaled_dot_product_attention(split(query), split(key), split(value), attn_mask=mask, dropout_p=dropout_p)
    return ctx.transpose(1, 2).reshape(b, lq, h)


class BertSelfAttention(nn.Module):
    """Q from ``hidden``, K/V from ``context`` (itself for self-attention, the other stream for cross)."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float = 0.1, kv_size: int | None = None,
                 attention_size: int | None = None):
        super().__init__()
        attention_size = attention_size or hidden_size
        if attention_size % num_heads:
            raise ValueError(f"attention size {attention_size} is not a multiple of {num_heads} heads")
        self.num_heads = num_heads
        self.dropout = dropout
        self.query = nn.Linear(hidden_size, attention_size)
        self.key = nn.Linear(kv_size or hidden_size, attention_size)
        self.value = nn.Linear(kv_size or hidden_size, attention_size)

    def forward(self, hidden: Tensor, mask: Tensor | None, context: Tensor | None = None) -> Tensor:
        if context is None:  # self-attention: Q, K and V from one GEMM
            q, k, v = project(hidden, self.query, self.key, self.value)
        else:
            (q,), (k, v) = project(hidden, self.query), project(context, self.key, self.value)
        return attend(q, k, v, self.num_heads, mask, self.dropout if self.training else 0.0)


class BertOutput(nn.Module):
    """``LayerNorm(residual + dropout(dense(x)))``: BERT's SelfOutput and Output blocks."""

    def __init__(self, in_size: int, hidden_size: int, eps: float = 1e-12, dropout: float = 0.1):
        super().__init__()
        self.dense = nn.Linear(in_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    """Post-LN attention block; cross-attention when called with a ``context``."""

    def __init__(self, hidden_size: int, num_heads: int, eps: float = 1e-12, dropout: float = 0.1,
                 attention_dropout: float = 0.1, kv_size: int | None = None):
        super().__init__()
        self.self = BertSelfAttention(hidden_size, num_heads, attention_dropout, kv_size=kv_size)
        self.output = BertOutput(hidden_size, hidden_size, eps, dropout)

    def forward(self, hidden: Tensor, mask: Tensor | None, context: Tensor | None = None) -> Tensor:
        return self.output(self.self(hidden, mask, context), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, act: str = "gelu"):
        super().__init__()
        self.dense = nn.Linear(hidden_size, intermediate_size)
        self.intermediate_act_fn = activation(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.intermediate_act_fn(self.dense(x))


class BertLayer(nn.Module):
    """The post-LN BERT layer (self-attention, FFN)."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int, act: str = "gelu",
                 eps: float = 1e-12, dropout: float = 0.1, attention_dropout: float = 0.1):
        super().__init__()
        self.attention = BertAttention(hidden_size, num_heads, eps, dropout, attention_dropout)
        self.intermediate = BertIntermediate(hidden_size, intermediate_size, act)
        self.output = BertOutput(intermediate_size, hidden_size, eps, dropout)

    def forward(self, x: Tensor, mask: Tensor | None, rows: Rows = None) -> Tensor:
        h = self.self_attend(x, mask, rows)
        return self.output(self.intermediate(h), h)

    def self_attend(self, x: Tensor, mask: Tensor | None, rows: Rows = None) -> Tensor:
        """Self-attention block; ``rows``: compute only these positions (queries), still attending to
        every position of ``x``: a list (the same positions in every example) or a [B, R] index tensor
        (each example's own positions)."""
        return self.attention(x, mask) if rows is None else self.attention(select_rows(x, rows), mask, context=x)


def run_layers(layers: Sequence[nn.Module], states: Tensor, mask: Tensor, last_rows: Rows = None,
               keep: Tensor | None = None) -> Tensor:
    """Run ``layers`` in order; the last one computes only ``last_rows`` when given (see `BertLayer`).

    ``keep`` [B, L] bool instead: the last layer computes each example's kept positions (and perhaps a few
    more, see `keep_index`) and the states come back at full length with zeros where nothing was computed."""
    if keep is not None:
        if not len(layers):
            return states
        index = keep_index(keep)
        if index.shape[1] == states.shape[1]:
            return run_layers(layers, states, mask)
        return scatter_rows(run_layers(layers, states, mask, index), index, states.shape[1])
    for i, layer in enumerate(layers):
        states = layer(states, mask, rows=last_rows if i == len(layers) - 1 else None)
    return states


def run_single_stream(layers: Sequence[nn.Module], text: Encoded, image: Encoded,
                      pooled_rows: tuple[Sequence[int], Sequence[int]] | None = None, pack: bool = False,
                      keep: tuple[Tensor | None, Tensor | None] | None = None) -> tuple[Tensor, Tensor]:
    """One transformer over the concatenated ``[text; image]`` -> (text states, image states).

    ``pooled_rows`` = (text rows, image rows), each indexed within its own stream: the last layer
    computes only those, and the returned states hold only them. ``keep`` = (text [B, T], image [B, K]
    bool, None = every position): the last layer computes the kept positions of each example, the others
    come back as zeros (`run_layers`). ``pack=True`` lays each example's image right after its own text
    and pads only to the longest pair (UNITER's ``gather_index``) instead of ``[text padded | image
    padded]``: the same outputs at every real position, fewer positions when the lengths vary (pad
    positions come back as zeros); it needs the pooled rows, if any, in the text."""
    t = text.states.shape[1]
    keep_all = None
    if keep is not None and pooled_rows is None:
        keep_all = torch.cat([k if k is not None else torch.ones_like(m, dtype=torch.bool)
                              for k, m in zip(keep, (text.mask, image.mask))], dim=1)
    if pack and (pooled_rows is None or not len(pooled_rows[1])):
        packed = packing(text.mask, image.mask)
        if packed is not None:
            index, mask, text_index, image_index = packed
            states = torch.cat([text.states, image.states], dim=1)
            states = states.gather(1, index[..., None].expand(-1, -1, states.shape[-1]))
            rows = None if pooled_rows is None else list(pooled_rows[0])
            keep_packed = None if keep_all is None else keep_all.gather(1, index) & mask.bool()
            states = run_layers(layers, states, additive_mask(mask, states.dtype), rows, keep_packed)
            if rows is not None:
                return states, states[:, :0]
            unpack = [states.gather(1, i[..., None].expand(-1, -1, states.shape[-1])).masked_fill(m[..., None] == 0, 0)
                      for i, m in ((text_index, text.mask), (image_index, image.mask))]
            return unpack[0], unpack[1]
    states = torch.cat([text.states, image.states], dim=1)
    mask = additive_mask(torch.cat([text.mask, image.mask], dim=1), states.dtype)
    if pooled_rows is None:
        states = run_layers(layers, states, mask, keep=keep_all)
        return states[:, :t], states[:, t:]
    text_rows, image_rows = pooled_rows
    states = run_layers(layers, states, mask, [*text_rows, *(t + r for r in image_rows)])
    return states[:, :len(text_rows)], states[:, len(text_rows):]


def bert_layers(c) -> nn.ModuleList:
    """``c.num_hidden_layers`` BERT layers from a config with the BERT field names."""
    return nn.ModuleList(BertLayer(c.hidden_size, c.num_attention_heads, c.intermediate_size, c.hidden_act,
                                   c.layer_norm_eps, c.hidden_dropout_prob, c.attention_probs_dropout_prob)
                         for _ in range(c.num_hidden_layers))


class BertCrossLayer(BertLayer):
    """METER's co-attention layer for one stream: self-attention, cross-attention to the other
    stream, FFN (post-LN)."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int, act: str = "gelu",
                 eps: float = 1e-12, dropout: float = 0.1, attention_dropout: float = 0.1):
        super().__init__(hidden_size, num_heads, intermediate_size, act, eps, dropout, attention_dropout)
        self.crossattention = BertAttention(hidden_size, num_heads, eps, dropout, attention_dropout)

    def forward(self, x: Tensor, mask: Tensor | None, other: Tensor = None, other_mask: Tensor | None = None,
                rows: Rows = None) -> Tensor:
        h = self.crossattention(self.self_attend(x, mask, rows), other_mask, context=other)
        return self.output(self.intermediate(h), h)


class BiAttention(nn.Module):
    """ViLBERT's co-attention: each stream's queries attend to the other stream's keys and values.

    ``*1`` projections read the visual stream, ``*2`` the text stream (official names).
    """

    def __init__(self, v_hidden_size: int, t_hidden_size: int, bi_hidden_size: int, num_heads: int, dropout: float):
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.query1 = nn.Linear(v_hidden_size, bi_hidden_size)
        self.key1 = nn.Linear(v_hidden_size, bi_hidden_size)
        self.value1 = nn.Linear(v_hidden_size, bi_hidden_size)
        self.query2 = nn.Linear(t_hidden_size, bi_hidden_size)
        self.key2 = nn.Linear(t_hidden_size, bi_hidden_size)
        self.value2 = nn.Linear(t_hidden_size, bi_hidden_size)

    def project_vision(self, vis: Tensor) -> Tensor:
        """``[query1 | key1 | value1](vis)`` [B, K, 3 x bi]: what this layer computes from the visual stream alone."""
        return project_cat(vis, self.query1, self.key1, self.value1)

    def project_text(self, txt: Tensor) -> Tensor:
        """``[query2 | key2 | value2](txt)`` [B, T, 3 x bi]."""
        return project_cat(txt, self.query2, self.key2, self.value2)

    def forward(self, vis: Tensor, vis_mask: Tensor, txt: Tensor, txt_mask: Tensor, vis_proj: Tensor | None = None,
                txt_proj: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Returns (vision-side context from text, text-side context from vision); both read the inputs.
        ``vis_proj`` / ``txt_proj``: the projections of `project_vision` / `project_text`, when cached."""
        p = self.dropout if self.training else 0.0
        q1, k1, v1 = (self.project_vision(vis) if vis_proj is None else vis_proj).chunk(3, dim=-1)
        q2, k2, v2 = (self.project_text(txt) if txt_proj is None else txt_proj).chunk(3, dim=-1)
        ctx_txt = attend(q2, k1, v1, self.num_heads, vis_mask, p)
        ctx_vis = attend(q1, k2, v2, self.num_heads, txt_mask, p)
        return ctx_vis, ctx_txt


class BiOutput(nn.Module):
    """ViLBERT's co-attention outputs: ``LN1(vis + dense1(ctx_vis))``, ``LN2(txt + dense2(ctx_txt))``.

    The official ``q_dense1`` / ``q_dense2`` are never used in its forward pass and are not built
    here (the checkpoint converter reports them as dropped).
    """

    def __init__(self, bi_hidden_size: int, v_hidden_size: int, t_hidden_size: int, eps: float, dropout: float):
        super().__init__()
        self.dense1 = nn.Linear(bi_hidden_size, v_hidden_size)
        self.LayerNorm1 = nn.LayerNorm(v_hidden_size, eps=eps)
        self.dense2 = nn.Linear(bi_hidden_size, t_hidden_size)
        self.LayerNorm2 = nn.LayerNorm(t_hidden_size, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, ctx_vis: Tensor, vis: Tensor, ctx_txt: Tensor, txt: Tensor) -> tuple[Tensor, Tensor]:
        vis_out = self.LayerNorm1(self.dropout(self.dense1(ctx_vis)) + vis)
        txt_out = self.LayerNorm2(self.dropout(self.dense2(ctx_txt)) + txt)
        return vis_out, txt_out


class Pooler(nn.Module):
    """``act(dense(h[:, 0]))``: tanh in BERT / UNITER / METER, ReLU in ViLBERT."""

    def __init__(self, in_size: int, out_size: int, act: str = "tanh"):
        super().__init__()
        self.dense = nn.Linear(in_size, out_size)
        self.activation = activation(act)

    def forward(self, states: Tensor) -> Tensor:
        return self.activation(self.dense(states[:, 0]))


def extend_embedding(table: nn.Embedding, rows: int, copy_row: int = 1) -> nn.Embedding:
    """``table`` grown to ``rows`` rows, each new row a copy of row ``copy_row`` (UNITER's
    ``init_type_embedding`` for NLVR2's second image type); ``table`` itself when it is big enough."""
    if table.num_embeddings >= rows:
        return table
    if table.num_embeddings <= copy_row:
        raise ValueError(f"an embedding table of {table.num_embeddings} row(s) has no row {copy_row} to copy")
    new = nn.Embedding(rows, table.embedding_dim, device=table.weight.device, dtype=table.weight.dtype)
    with torch.no_grad():
        new.weight[:table.num_embeddings] = table.weight
        new.weight[table.num_embeddings:] = table.weight[copy_row]
    return new


def init_bert_weights(module: nn.Module, std: float = 0.02) -> None:
    """The official initialisation: normal(0, std) weights, zero biases, LayerNorm (1, 0)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight.data.normal_(mean=0.0, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()
    elif isinstance(module, nn.LayerNorm):
        module.weight.data.fill_(1.0)
        module.bias.data.zero_()
