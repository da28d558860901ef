"""Batched IPOT optimal transport for UNITER's Word-Region Alignment (WRA; UNITER paper, pre-training tasks).

IPOT (Xie et al. 2019) is a proximal-point OT solver with a generalised-KL Bregman term and ``k``
inner Sinkhorn-like steps. This follows UNITER's ``model/ot.py``: uniform masses over real positions,
plan computed without gradient, distance ``<C, T>`` differentiable through the cost only, all in fp32.
Masks use the vlkit convention: True (or 1) marks a real position, False a pad.
"""
from __future__ import annotations

import collections
import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["cosine_cost", "ipot", "ipot_plan", "wra_distance", "wra_loss"]


def _fp32(device: torch.device) -> contextlib.AbstractContextManager:
    """Disable autocast on ``device`` so the OT runs in fp32 (the official code calls ``.float()``); the meta
    device (a FLOP count, `vlkit.flops.count`) has no autocast."""
    if device.type == "meta":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)


def cosine_cost(x: Tensor, y: Tensor, eps: float = 1e-5) -> Tensor:
    """Cosine distance ``1 - <x_i/|x_i|, y_j/|y_j|>`` for [B, M, D] and [B, N, D] -> [B, M, N]."""
    if x.dim() != 3 or y.dim() != 3 or x.shape[0] != y.shape[0] or x.shape[2] != y.shape[2]:
        raise ValueError(f"cosine_cost: need [B, M, D] and [B, N, D], got {tuple(x.shape)} and {tuple(y.shape)}")
    return 1 - torch.bmm(F.normalize(x, dim=-1, eps=eps), F.normalize(y, dim=-1, eps=eps).transpose(1, 2))


def _masks(cost: Tensor, x_mask: Tensor, y_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Validated boolean masks ``(x_mask [B, M], y_mask [B, N], joint [B, M, N])`` on cost's device."""
    if cost.dim() != 3:
        raise ValueError(f"ipot: cost must be [B, M, N], got {tuple(cost.shape)}")
    b, m, n = cost.shape
    if tuple(x_mask.shape) != (b, m) or tuple(y_mask.shape) != (b, n):
        raise ValueError(
            f"ipot: masks must be [B, M]={b, m} and [B, N]={b, n}, got {tuple(x_mask.shape)} and {tuple(y_mask.shape)}"
        )
    x_mask, y_mask = x_mask.to(cost.device).bool(), y_mask.to(cost.device).bool()
    # A side with no real position leaves nothing to transport: treat the whole sample as padding.
    x_mask, y_mask = x_mask & y_mask.any(1, keepdim=True), y_mask & x_mask.any(1, keepdim=True)
    return x_mask, y_mask, x_mask.unsqueeze(2) & y_mask.unsqueeze(1)


def ipot_plan(cost: Tensor, x_mask: Tensor, y_mask: Tensor, beta: float = 0.5, iterations: int = 50,
              k: int = 1) -> Tensor:
    """IPOT transport plan [B, M, N] (fp32, no gradient) between uniform masses on the real positions.

    Each outer iteration multiplies the plan by ``A = exp(-C / beta)`` and rescales its rows and
    columns ``k`` times toward the marginals ``1/M_real`` and ``1/N_real``; padded rows and columns
    stay exactly zero and a fully padded sample gives an all-zero plan. The spread of real costs
    over ``beta`` should stay below ~60 (cosine costs lie in [0, 2]) or fp32 underflows, as in UNITER.
    """
    return _ipot_plan(cost, *_masks(cost, x_mask, y_mask), beta, iterations, k)


# On CUDA the 50 iterations (~500 small kernels) are captured once per (bucketed) problem shape in a CUDA
# graph and replayed: launch overhead, not arithmetic, is what a WRA-sized problem costs on a GPU.
CUDA_GRAPHS = True
BUCKET = 8  # problems are padded to multiples of this (batch, words, regions) so that few shapes are captured
_GRAPHS: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
_MAX_GRAPHS = 32


def _ipot_plan(cost: Tensor, x_mask: Tensor, y_mask: Tensor, joint: Tensor, beta: float, iterations: int,
               k: int) -> Tensor:
    if iterations < 1 or k < 1 or beta <= 0:
        raise ValueError(f"ipot: need iterations >= 1, k >= 1 and beta > 0, got {iterations}, {k}, {beta}")
    if CUDA_GRAPHS and cost.is_cuda and not torch.cuda.is_current_stream_capturing():
        try:
            return _graphed_plan(cost, x_mask, y_mask, joint, beta, iterations, k)
        except RuntimeError as err:  # pragma: no cover - depends on the GPU / driver
            _disable_graphs(err)
    return _eager_plan(cost, x_mask, y_mask, joint, beta, iterations, k)


def _disable_graphs(err: Exception) -> None:  # pragma: no cover - GPU only
    global CUDA_GRAPHS
    CUDA_GRAPHS = False
    _GRAPHS.clear()
    warnings.warn(f"ipot: CUDA graph capture failed ({err}); running the iterations eagerly")


def pad_problem(cost: Tensor, x_mask: Tensor, y_mask: Tensor, joint: Tensor,
                multiple: int = BUCKET) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The problem padded with masked rows, columns and samples to multiples of ``multiple``: its plan,
    cut back to the original shape, is the original plan (pads carry no mass)."""
    b, m, n = cost.shape
    pb, pm, pn = (-b) % multiple, (-m) % multiple, (-n) % multiple
    if not (pb or pm or pn):
        return cost, x_mask, y_mask, joint
    return (F.pad(cost, (0, pn, 0, pm, 0, pb)), F.pad(x_mask, (0, pm, 0, pb)), F.pad(y_mask, (0, pn, 0, pb)),
            F.pad(joint, (0, pn, 0, pm, 0, pb)))


def _graphed_plan(cost: Tensor, x_mask: Tensor, y_mask: Tensor, joint: Tensor, beta: float, iterations: int,
                  k: int) -> Tensor:  # pragma: no cover - GPU only
    b, m, n = cost.shape
    inputs = pad_problem(cost.detach().float(), x_mask, y_mask, joint)
    key = (tuple(inputs[0].shape), inputs[0].device, float(beta), iterations, k)
    entry = _GRAPHS.get(key)
    if entry is None:
        static = tuple(t.clone() for t in inputs)
        stream = torch.cuda.Stream(device=cost.device)
        stream.wait_stream(torch.cuda.current_stream(cost.device))
        with torch.cuda.stream(stream):
            _eager_plan(*static, beta, iterations, k)  # warm-up off the capturing stream
        torch.cuda.current_stream(cost.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plan = _eager_plan(*static, beta, iterations, k)
        entry = _GRAPHS[key] = (graph, static, plan)
        while len(_GRAPHS) > _MAX_GRAPHS:
            _GRAPHS.popitem(last=False)
    _GRAPHS.move_to_end(key)
    graph, static, plan = entry
    for dst, src in zip(static, inputs):
        dst.copy_(src)
    graph.replay()
    return plan[:b, :m, :n].clone()


@torch.no_grad()
def _eager_plan(cost: Tensor, x_mask: Tensor, y_mask: Tensor, joint: Tensor, beta: float, iterations: int,
                k: int) -> Tensor:
    with _fp32(cost.device):
        cost = cost.detach().float().masked_fill(~joint, float("inf"))
        # The plan is invariant to a per-sample constant in the cost; shifting the minimum to 0 keeps
        # exp(-C / beta) <= 1 and away from underflow for offset costs.
        shift = cost.amin((1, 2), keepdim=True)
        a = torch.exp((cost - shift.masked_fill_(shift.isinf(), 0)) / -beta)
        x_len = x_mask.sum(1).clamp(min=1).float().view(-1, 1, 1)
        y_len = y_mask.sum(1).clamp(min=1).float().view(-1, 1, 1)
        rho = x_len / y_len
        # Official update with u = N * sigma carried instead of sigma (it saves two ops per step):
        # delta = 1 / (u^T Q), u = 1 / (M/N * Q delta), T = u Q delta = N * T_official. Both scalings
        # are kept as row vectors (row-vector @ matrix is the fast bmm form). A pad adds 1 to its
        # denominator, so it stays finite and the pad's plan entries stay exactly 0. Entries below
        # 1e-30 are flushed to 0: they are negligible and would otherwise become denormals, which make
        # every later CPU op on the plan several times slower.
        x_pad = (~x_mask).float().unsqueeze(1)  # [B, 1, M]
        y_pad = (~y_mask).float().unsqueeze(1)  # [B, 1, N]
        u = x_mask.float().unsqueeze(1) / rho  # [B, 1, M]
        plan = joint.float()
        for _ in range(iterations):
            plan.mul_(a)  # Q = A * T
            for _ in range(k):
                delta = torch.bmm(u, plan).add_(y_pad).reciprocal_()  # [B, 1, N]
                u = torch.addcmul(x_pad, rho, torch.bmm(delta, plan.transpose(1, 2))).reciprocal_()
            plan.mul_(u.transpose(1, 2)).mul_(delta)
            F.threshold_(plan, 1e-30, 0.0)
        return plan.div_(y_len)


def ipot(cost: Tensor, x_mask: Tensor, y_mask: Tensor, beta: float = 0.5, iterations: int = 50,
         k: int = 1) -> tuple[Tensor, Tensor]:
    """Batched IPOT: ``(distance [B], plan [B, M, N])`` with ``distance = sum(cost * plan)``.

    The plan carries no gradient, so ``d distance / d cost == plan``. Computed in fp32 even under
    autocast; costs at padded positions are ignored.
    """
    x_mask, y_mask, joint = _masks(cost, x_mask, y_mask)
    plan = _ipot_plan(cost, x_mask, y_mask, joint, beta, iterations, k)
    with _fp32(cost.device):
        distance = (cost.float().masked_fill(~joint, 0) * plan).sum((1, 2))
    return distance, plan


def wra_distance(text_states: Tensor, text_mask: Tensor, region_states: Tensor, region_mask: Tensor,
                 beta: float = 0.5, iterations: int = 50, k: int = 1) -> Tensor:
    """UNITER's WRA distance [B] between contextualised words and regions (cosine cost, IPOT plan)."""
    with _fp32(text_states.device):
        cost = cosine_cost(text_states.float(), region_states.float())
    return ipot(cost, text_mask, region_mask, beta, iterations, k)[0]


def wra_loss(distance: Tensor, is_match: Tensor) -> Tensor:
    """UNITER's ``ot_loss = (sum d[matched] - sum d[mismatched]) / n`` (no margin, no clipping).

    The mixture adds it to the ITM loss of the same pass as ``itm_loss + lambda * ot_loss`` (lambda 0.1 in UNITER).
    """
    if distance.shape != is_match.shape:
        raise ValueError(f"wra_loss: distance {tuple(distance.shape)} and is_match {tuple(is_match.shape)} differ")
    signed = torch.where(is_match.to(distance.device).bool(), distance, -distance)
    return signed.sum() / max(distance.numel(), 1)
