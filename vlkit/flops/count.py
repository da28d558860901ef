"""Training FLOPs per step of a comparison's units, counted by torch's own counter
(`torch.utils.flop_counter.FlopCounterMode`) on each unit's real model and objective mix or task, at its
batch and sequence shapes, without computing anything.

The model and its heads are built on the meta device, where a floating-point tensor has a shape and no
values, so a base-size step costs milliseconds and no memory. Ids, masks and indices stay real CPU tensors
(`MetaCompute`), so every shape the data decides comes out as a training step makes it: masked tokens and
regions, the rows a pass keeps, sampled negatives. An operation whose result needs values (a boolean mask
applied to activations) runs on zeros of its inputs' shapes. The count is that of the same step run for
real (tests/compare/test_flops.py checks it against `FlopCounterMode` on a computed step); torch counts
matrix products, convolutions and attention, the arithmetic that decides a step's time on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
META = torch.device("meta")
CPU = torch.device("cpu")


def _cpu_attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# torch's counter knows the GPU attention kernels; the CPU's flash kernel is counted with the same formulas
CPU_ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward}


class _Totals:
    """A module tracker that files every count under the total: the per-module breakdown's hooks ask a parameter
    taken under ``no_grad`` on the meta device for a gradient function it does not have."""

    parents = ("Global",)

    def __enter__(self) -> "_Totals":
        return self

    def __exit__(self, *args: Any) -> None:
        return None


def _counter_registry() -> dict[Any, Callable[..., int]]:
    """The FLOP formulas `flop_counter_mode` counts with, by operation."""
    return flop_counter_mode().flop_registry


def flop_counter_mode() -> flop_counter.FlopCounterMode:
    """torch's FLOP counter, quiet, totals only, with the CPU attention kernel counted like the GPU ones."""
    counter = flop_counter.FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION)
    counter.mod_tracker = _Totals()
    return counter


def _floating(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


class MetaCompute(TorchDispatchMode):
    """Runs a step whose parameters live on the meta device: an operation with a meta input runs on meta (no
    arithmetic); one that needs values there (a boolean mask, ``.item()``) runs on zeros of the meta inputs'
    shapes, and its floating-point results go back to meta. Integer and boolean tensors are never moved to
    meta, so masks and indices keep their values. The result of a pure operation on meta depends on its inputs'
    shapes only, so it is remembered per shapes (a model's layers repeat theirs, a plan's units their models').

    ``counting``: the mode also counts the FLOPs of what it runs into ``flops``, as `flop_counter_mode` would
    around it (the same registry and decompositions) without a second mode's dispatch on every operation."""

    _results: dict[Any, Any] = {}  # signature -> the result's layout, shared by every count of the process

    def __init__(self, counting: bool = False) -> None:
        super().__init__()
        self.registry = _counter_registry() if counting else None
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.registry is None:
            return self._run(func, args, kwargs)
        # as torch's FlopCounterMode: an operation it has no formula for runs decomposed where it decomposes
        if func not in self.registry and func is not torch.ops.prim.device.default:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = self._run(func, args, kwargs)
        formula = self.registry.get(func._overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        return out

    def _run(self, func, args, kwargs):
        if kwargs.get("device") == META and not _floating_dtype(kwargs.get("dtype")):
            kwargs = {**kwargs, "device": CPU}  # a mask made "on the model's device" stays real
        if func is aten._to_copy.default and kwargs.get("device") == META and not _floating(args[0]):
            return args[0].clone()
        leaves = _leaves((args, kwargs))
        tensors = [isinstance(t, torch.Tensor) for t in leaves]
        if not any(is_tensor and t.is_meta for is_tensor, t in zip(tensors, leaves)):
            return func(*args, **kwargs)

        def call(convert: Callable[[torch.Tensor], torch.Tensor]) -> Any:
            return func(*_tensor_map(convert, args), **_tensor_map(convert, kwargs))

        out = None
        key = _signature(func, tensors, leaves)
        if key is not None and key in self._results:
            out = _map(lambda x: torch.empty_strided(x.shape, x.stride, dtype=x.dtype, device=META)
                       if isinstance(x, _Layout) else x, self._results[key])
        elif func is not aten._local_scalar_dense.default:
            try:
                out = call(lambda t: t if t.is_meta else t.to(META))
            except RuntimeError:  # a missing meta kernel raises one too
                pass  # needs values (a data-dependent shape): run on zeros below
            else:
                if key is not None:
                    self._results[key] = _tensor_map(lambda t: _Layout(tuple(t.shape), t.stride(), t.dtype), out)
        if out is None:
            out = call(lambda t: torch.zeros(t.shape, dtype=t.dtype) if t.is_meta else t)
            out = _tensor_map(lambda t: t.to(META) if _floating(t) else t, out)
        if not torch.is_grad_enabled():  # a view of a parameter taken under no_grad must not ask for its gradient
            out = _tensor_map(lambda t: t.detach() if t.requires_grad else t, out)
        return out


SDPA_ARGUMENTS = {"query": None, "key": None, "value": None, "attn_mask": None, "dropout_p": 0.0, "is_causal": False,
                  "scale": None}  # F.scaled_dot_product_attention's, in order


class CPUAttention(TorchFunctionMode):
    """Attention on the meta device takes the CPU's kernel (flash where the CPU would take it), not meta's own
    decomposition into matrix products: it is counted as a real step's is (`CPU_ATTENTION`)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and args[0].is_meta:
            a = {**dict(zip(SDPA_ARGUMENTS, args)), **kwargs}
            a = {name: a.get(name, default) for name, default in SDPA_ARGUMENTS.items()}
            # the choice reads dtypes, dims and flags, not the batch: one row of each, uninitialised
            empty = lambda t: torch.empty((1, *t.shape[1:]), dtype=t.dtype) if isinstance(t, torch.Tensor) else t  # noqa: E731
            choice = torch._fused_sdp_choice(*map(empty, (a["query"], a["key"], a["value"], a["attn_mask"])),
                                             a["dropout_p"], a["is_causal"], scale=a["scale"])
            if choice == SDPBackend.FLASH_ATTENTION.value:
                return aten._scaled_dot_product_flash_attention_for_cpu(
                    a["query"], a["key"], a["value"], a["dropout_p"], a["is_causal"], attn_mask=a["attn_mask"],
                    scale=a["scale"])[0]
        return func(*args, **kwargs)


def _leaves(tree: Any) -> list[Any]:
    """The leaves of an operation's arguments or results (tuples, lists and dicts of them), in order: torch's
    pytree without its registry, which an operation's plain containers do not need (it costs most of a count)."""
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in _leaves(item)]
    if isinstance(tree, dict):
        return [leaf for item in tree.values() for leaf in _leaves(item)]
    return [tree]


def _map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with ``fn`` applied to every leaf (a `_Layout` is one), its tuples, lists and dicts kept."""
    if isinstance(tree, (tuple, list)) and not isinstance(tree, _Layout):
        return type(tree)(_map(fn, item) for item in tree)
    if isinstance(tree, dict):
        return {k: _map(fn, v) for k, v in tree.items()}
    return fn(tree)


def _tensor_map(fn: Callable[[torch.Tensor], Any], tree: Any) -> Any:
    return _map(lambda x: fn(x) if isinstance(x, torch.Tensor) else x, tree)


class _Layout(NamedTuple):
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


def _signature(func: Any, tensors: list[bool], leaves: list[Any]) -> Any:
    """What the result of a pure operation (no mutation, no view of an input) on meta depends on: its inputs' shapes,
    strides, dtypes and devices and its other arguments; None for any other operation or an unhashable argument."""
    schema = func._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return None
    key = (func, *((tuple(t.shape), t.stride(), t.dtype, t.device.type) if is_tensor else t
                   for is_tensor, t in zip(tensors, leaves)))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _floating_dtype(dtype: Any) -> bool:
    return dtype is None or (isinstance(dtype, torch.dtype) and dtype.is_floating_point)


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` with every floating-point parameter and buffer it creates on the meta device (no memory, no
    initialisation); integer and boolean buffers (position ids, flags) stay real (`MetaCompute`)."""
    with torch.device(META), MetaCompute():
        return build()


def step_flops(module: nn.Module, batch: Any, **forward: Any) -> int:
    """FLOPs of one training step of ``module`` (a `Pretraining` or a `Task`) on ``batch``: forward and backward.
    A module on the meta device (`on_meta`) is counted without computing (`MetaCompute`), a real one by running it."""
    module.train()
    if not any(p.is_meta for p in module.parameters()):
        with flop_counter_mode() as counter:
            module(batch, **forward).loss.backward()
        return counter.get_total_flops()
    with MetaCompute(counting=True) as mode, CPUAttention():
        module(batch, **forward).loss.backward()
    return mode.flops


@dataclass(frozen=True)
class StepShapes:
    """What a step's FLOPs depend on besides the model: examples per step (the global batch), tokens per
    caption, regions per image (region families; a pixel family's patches come from its model)."""

    batch_size: int
    text_len: int
    regions: int


def pretrain_step_flops(pretraining: Any, shapes: StepShapes, values: bool = False) -> dict[str, Any]:
    """FLOPs of a pre-training step: per objective that a step may draw (``per_batch``: with the objectives run at
    every step) and their expectation over the draw's ratios; ``sum`` runs every objective at every step. The batch
    holds shapes only (``values=False``: `VLModel.example_batch`) unless asked."""
    batch = pretraining.model.example_batch(shapes.batch_size, text_len=shapes.text_len, num_regions=shapes.regions,
                                            padded=False, values=values)
    for objective in pretraining.objectives.values():
        if objective.needs_fit:  # MIM's k-means codebook: fitted on images before training, not a step's FLOPs
            objective.fitted_from_checkpoint()
    drawn = [u for u in pretraining.units if not u.every_step]
    always = [u for u in pretraining.units if u.every_step]
    if pretraining.sampling == "sum" or not drawn:
        flops = step_flops(pretraining, batch, units=list(pretraining.units))
        return {"per_step": float(flops), "per_objective": {"+".join(u.name for u in pretraining.units): flops}}
    total = sum(u.ratio for u in drawn)
    per = {u.name: step_flops(pretraining, batch, units=[u, *always]) for u in drawn}
    return {"per_step": sum(per[u.name] * u.ratio / total for u in drawn), "per_objective": per}


def finetune_step_flops(task: Any, shapes: StepShapes, values: bool = False) -> float:
    """FLOPs of a fine-tuning step of ``task`` on a batch of its own form (`Task.example_batch`)."""
    return float(step_flops(task, task.example_batch(shapes.batch_size, shapes.text_len, shapes.regions, values)))


__all__ = ["CPU_ATTENTION", "MetaCompute", "StepShapes", "finetune_step_flops", "flop_counter_mode", "on_meta",
           "pretrain_step_flops", "step_flops"]
