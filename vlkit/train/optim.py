"""Parameter groups, AdamW and learning-rate schedules, following each family's official code.

Groups: the pre-trained unimodal towers (``model.encoder_prefixes``) train at ``lr``, the rest of
the model (cross-modal layers, poolers, embeddings) at ``lr * lr_mult`` and the training module's
own parameters (objective / task heads) at ``lr * lr_mult_head``. Weight decay is switched off by
a parameter-name rule of the official codes (`NO_DECAY`) or, with ``no_decay="norms"``, for every bias
and every normalisation-layer parameter.

Two AdamW update rules (``rule``): ``"torch"`` (`torch.optim.AdamW`: decay ``p *= 1 - lr*wd`` first,
``eps`` added to the bias-corrected ``sqrt(v)``) and ``"hf"`` (`HFAdamW`, the rule of the official codes:
``pytorch_transformers`` AdamW in ViLBERT's ``train_concap.py``, UNITER's ``optim/adamw.py``, METER's
``transformers.optimization.AdamW``: ``eps`` added to the raw ``sqrt(v)``, the step size carrying
``sqrt(1 - b2^t) / (1 - b1^t)``, decay ``p -= lr*wd*p`` after the update). Each runs as one fused
kernel per parameter list (``impl="fused"``, the default where torch has it), ``torch._foreach_*``
ops (``"foreach"``) or a per-parameter loop (``"loop"``, the reference).
"""
from __future__ import annotations

import math
import warnings
from typing import Sequence

import torch
from torch import Tensor, nn

# Substrings that exempt a parameter from weight decay, as in the official codes.
NO_DECAY = {
    # BERT's names: biases and LayerNorm (UNITER optim/misc.py, ViLBERT train_concap.py / train_tasks.py)
    "bert": ("bias", "LayerNorm.bias", "LayerNorm.weight"),
    # plus timm's norm layers (METER meter/modules/meter_utils.py set_schedule)
    "bert_timm": ("bias", "LayerNorm.bias", "LayerNorm.weight", "norm.bias", "norm.weight", "norm1.bias",
                  "norm1.weight", "norm2.bias", "norm2.weight"),
}
NO_DECAY_RULES = (*NO_DECAY, "norms")
SCHEDULES = ("linear", "polynomial", "constant")
ADAMW_RULES = ("torch", "hf")
ADAMW_IMPLS = ("fused", "foreach", "loop")

_NORM_TYPES = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.modules.batchnorm._NormBase)


def _norm_param_names(module: nn.Module) -> set[str]:
    return {f"{mod_name}.{p_name}" if mod_name else p_name
            for mod_name, mod in module.named_modules() if isinstance(mod, _NORM_TYPES)
            for p_name, _ in mod.named_parameters(recurse=False)}


def no_decay_names(module: nn.Module, rule: str) -> set[str]:
    """Names of the parameters of ``module`` that ``rule`` exempts from weight decay."""
    if rule == "norms":
        norms = _norm_param_names(module)
        return {n for n, _ in module.named_parameters() if n in norms or n.rsplit(".", 1)[-1] == "bias"}
    if rule not in NO_DECAY:
        raise ValueError(f"unknown no_decay rule {rule!r}; choose one of {', '.join(NO_DECAY_RULES)}")
    return {n for n, _ in module.named_parameters() if any(s in n for s in NO_DECAY[rule])}


def _under(name: str, prefixes: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def param_groups(module: nn.Module, lr: float, weight_decay: float, lr_mult: float = 1.0,
                 lr_mult_head: float | None = None, no_decay: str = "bert") -> list[dict]:
    """AdamW parameter groups of a training module (see the module docstring).

    ``module.model`` (a `VLModel`) names its towers in ``encoder_prefixes``; a module without a
    ``model`` attribute is treated as the model itself. A weight tied between the model and a head
    (the MLM decoder) is counted once, in the model's group. Frozen parameters are left out. Each
    group carries ``name`` (``encoder|cross_modal|head`` + ``/decay|/no_decay``) and ``lr_mult``.
    """
    lr_mult_head = lr_mult if lr_mult_head is None else lr_mult_head
    model = getattr(module, "model", module)
    prefixes = tuple(getattr(model, "encoder_prefixes", ()))
    exempt_names = no_decay_names(module, no_decay)
    exempt = {id(p) for n, p in module.named_parameters() if n in exempt_names}
    tiers: dict[str, tuple[float, list[nn.Parameter]]] = {
        "encoder": (1.0, []), "cross_modal": (lr_mult, []), "head": (lr_mult_head, [])}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        seen.add(id(p))
        tiers["encoder" if _under(name, prefixes) else "cross_modal"][1].append(p)
    tiers["head"][1].extend(p for p in module.parameters() if id(p) not in seen)
    groups = []
    for tier, (mult, params) in tiers.items():
        for kind, decay in (("decay", weight_decay), ("no_decay", 0.0)):
            chosen = [p for p in params if p.requires_grad and (id(p) in exempt) == (kind == "no_decay")]
            if chosen:
                groups.append({"params": chosen, "lr": lr * mult, "weight_decay": decay,
                               "name": f"{tier}/{kind}", "lr_mult": mult})
    if not groups:
        raise ValueError(f"{type(module).__name__} has no trainable parameters")
    return groups


def build_optimizer(module: nn.Module, lr: float, betas: Sequence[float] = (0.9, 0.98), eps: float = 1e-8,
                    weight_decay: float = 0.01, lr_mult: float = 1.0, lr_mult_head: float | None = None,
                    no_decay: str = "bert", rule: str = "torch", impl: str = "fused") -> torch.optim.Optimizer:
    """AdamW over `param_groups` (decoupled weight decay, bias-corrected): `torch.optim.AdamW` for
    ``rule="torch"``, `HFAdamW` (the official codes' update) for ``rule="hf"``; ``impl`` as in the module
    docstring (``fused`` falls back to ``foreach`` where torch has no fused kernel for the parameters)."""
    if rule not in ADAMW_RULES:
        raise ValueError(f"unknown AdamW rule {rule!r}; choose one of {', '.join(ADAMW_RULES)}")
    if impl not in ADAMW_IMPLS:
        raise ValueError(f"unknown AdamW impl {impl!r}; choose one of {', '.join(ADAMW_IMPLS)}")
    groups = param_groups(module, lr, weight_decay, lr_mult, lr_mult_head, no_decay)
    if rule == "hf":
        return HFAdamW(groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, impl=impl)
    params = [p for g in groups for p in g["params"]]
    kind = {"fused": {"fused": True} if _fused_ok(params) else {"foreach": True}, "foreach": {"foreach": True},
            "loop": {"foreach": False}}[impl]
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, **kind)


def _fused_ok(params: Sequence[Tensor]) -> bool:
    """Whether torch's fused AdamW kernel takes these parameters (dense floating tensors on CPU / CUDA)."""
    kinds = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    return all(p.device.type in ("cpu", "cuda") and p.dtype in kinds for p in params)


class HFAdamW(torch.optim.Optimizer):
    """AdamW with the update rule of the official codes (HF ``transformers.AdamW`` / ``pytorch_transformers``
    / UNITER ``optim/adamw.py``), per parameter ``p`` with gradient ``g`` at its step ``t``::

        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
        p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)     # (lr alone if not correct_bias)
        p -= lr * wd * p                                                  # after the update

    ``impl="loop"`` runs those ops per parameter (bit-identical to the official class), ``"foreach"`` the
    same ops on parameter lists (bit-identical too), ``"fused"`` one pass of torch's fused AdamW kernel per
    parameter list with ``lr' = lr (1 - lr wd)``, ``wd' = wd / (1 - lr wd)``, ``eps' = eps / sqrt(1 - b2^t)``,
    which is the same update algebraically (the order of float roundings differs: ~1 ulp of ``p``).
    Parameters without a gradient are skipped and keep their own step count, as in the official class. The
    state (``step``, ``exp_avg``, ``exp_avg_sq``) has `torch.optim.AdamW`'s layout, so checkpoints load
    into either rule.
    """

    def __init__(self, params, lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, correct_bias: bool = True, impl: str = "fused"):
        if lr < 0.0 or eps < 0.0 or not all(0.0 <= b < 1.0 for b in betas) or len(betas) != 2:
            raise ValueError(f"HFAdamW: need lr >= 0, eps >= 0 and betas in [0, 1); got {lr}, {eps}, {tuple(betas)}")
        if impl not in ADAMW_IMPLS:
            raise ValueError(f"unknown AdamW impl {impl!r}; choose one of {', '.join(ADAMW_IMPLS)}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      correct_bias=correct_bias))
        self.impl = impl

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            buckets: dict[tuple, list[list[Tensor]]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("HFAdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                key = (p.device, p.dtype, int(state["step"].item()))
                bucket = buckets.setdefault(key, [[], [], [], []])
                for lst, t in zip(bucket, (p, p.grad, state["exp_avg"], state["exp_avg_sq"])):
                    lst.append(t)
            for (device, _, t), tensors in buckets.items():
                self._update(group, t, device, *tensors)
        return loss

    def _update(self, group: dict, t: int, device: torch.device, params: list[Tensor], grads: list[Tensor],
                avgs: list[Tensor], sqs: list[Tensor]) -> None:
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        step_size = lr * math.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t) if group["correct_bias"] else lr
        impl = self.impl
        if impl == "fused" and not (group["correct_bias"] and lr * wd < 1.0 and _fused_ok(params)):
            impl = "foreach"
        if impl == "fused":
            keep = 1.0 - lr * wd
            step = torch.tensor(float(t), device=device)
            torch._fused_adamw_(params, grads, avgs, sqs, [], [step] * len(params), lr=lr * keep, beta1=b1, beta2=b2,
                                weight_decay=wd / keep, eps=eps / math.sqrt(1.0 - b2 ** t), amsgrad=False,
                                maximize=False)
        elif impl == "foreach":
            torch._foreach_mul_(avgs, b1)
            torch._foreach_add_(avgs, grads, alpha=1.0 - b1)
            torch._foreach_mul_(sqs, b2)
            torch._foreach_addcmul_(sqs, grads, grads, value=1.0 - b2)
            denom = torch._foreach_sqrt(sqs)
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(params, avgs, denom, value=-step_size)
            if wd > 0.0:
                torch._foreach_add_(params, params, alpha=-lr * wd)
        else:
            for p, g, m, v in zip(params, grads, avgs, sqs):
                m.mul_(b1).add_(g, alpha=1.0 - b1)
                v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
                p.addcdiv_(m, v.sqrt().add_(eps), value=-step_size)
                if wd > 0.0:
                    p.add_(p, alpha=-lr * wd)


def warmup_steps(warmup: float, max_steps: int) -> int:
    """``warmup`` in [0, 1) is a fraction of ``max_steps`` (METER: ``int(max_steps * warmup)``);
    a whole number >= 1 is a step count."""
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if warmup < 1:
        return int(max_steps * warmup)
    if warmup != math.floor(warmup):
        raise ValueError(f"warmup {warmup} is neither a fraction in [0, 1) nor a whole number of steps")
    return int(warmup)


def build_scheduler(optimizer: torch.optim.Optimizer, max_steps: int, warmup: float = 0.1,
                    schedule: str = "linear", power: float = 1.0, end_lr: float = 0.0,
                    offset: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then linear / polynomial (``power``, down to ``end_lr``) decay or a constant.

    The scheduler is stepped once per optimizer step. ``offset=0`` gives the n-th update (0-based)
    the factor of step n, as Lightning does for METER (the first update uses lr 0 during warm-up);
    ``offset=1`` gives it the factor of step n + 1, as UNITER's ``get_lr_sched(global_step)`` and
    ViLBERT's ``scheduler.step()`` before ``optimizer.step()`` do.
    """
    from transformers import (get_constant_schedule_with_warmup, get_linear_schedule_with_warmup,
                              get_polynomial_decay_schedule_with_warmup)

    warm = warmup_steps(warmup, max_steps)
    if schedule != "constant" and warm >= max_steps:
        raise ValueError(f"warm-up ({warm} steps) must be shorter than max_steps ({max_steps})")
    if schedule == "linear":
        scheduler = get_linear_schedule_with_warmup(optimizer, warm, max_steps)
    elif schedule == "polynomial":
        scheduler = get_polynomial_decay_schedule_with_warmup(optimizer, warm, max_steps, lr_end=end_lr, power=power)
    elif schedule == "constant":
        scheduler = get_constant_schedule_with_warmup(optimizer, warm)
    else:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if offset not in (0, 1):
        raise ValueError(f"schedule offset must be 0 or 1, got {offset}")
    with warnings.catch_warnings():  # stepping before the first optimizer.step() is the point here
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(offset):
            scheduler.step()
    return scheduler
