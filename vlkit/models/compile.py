"""Whole-model switches over a family's repeated transformer blocks: activation checkpointing and regional
``torch.compile`` (`VLModel.set_activation_checkpointing`, `VLModel.compile_blocks`)."""
from __future__ import annotations

import torch
from torch import nn


def transformer_blocks(module: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``module``: the children of every `nn.ModuleList` / `nn.Sequential` holding at
    least two modules of one type (vlkit's layers, a `transformers` encoder's ``layer``, a timm ViT's
    ``blocks``), outermost only."""
    found: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        for child in m.children():
            items = list(child.children()) if isinstance(child, (nn.ModuleList, nn.Sequential)) else []
            if len(items) >= 2 and len({type(c) for c in items}) == 1:
                found.extend(items)
            else:
                visit(child)

    visit(module)
    return found


def set_activation_checkpointing(module: nn.Module, enabled: bool = True) -> int:
    """Recompute each transformer block's activations in the backward pass instead of storing them
    (`torch.utils.checkpoint`, non-reentrant, RNG state preserved: the same dropout masks, so outputs and
    gradients equal the plain run). Returns the number of blocks; ``enabled=False`` undoes it."""
    from functools import partial

    from torch.utils.checkpoint import checkpoint

    def run(forward, *args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    blocks = transformer_blocks(module)
    for block in blocks:
        block.__dict__.pop("forward", None)  # back to the class's forward
        if enabled:
            block.forward = partial(run, block.forward)
    return len(blocks)


def compile_blocks(module: nn.Module, **options) -> int:
    """``torch.compile`` each transformer block in place (regional compilation: one graph per block type,
    reused by every layer; the code between blocks stays eager). Returns the number of blocks."""
    blocks = transformer_blocks(module)
    for block in blocks:
        block.compile(**options)
    return len(blocks)
