"""Parameter groups (lr multipliers, no-decay sets) and learning-rate schedules."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from vlkit.train.optim import build_optimizer, build_scheduler, no_decay_names, param_groups, warmup_steps


class ToyModel(nn.Module):
    encoder_prefixes = ("text_tower",)

    def __init__(self):
        super().__init__()
        self.text_tower = nn.ModuleDict({"dense": nn.Linear(4, 4), "LayerNorm": nn.LayerNorm(4)})
        self.text_tower_extra = nn.Linear(4, 4)  # shares the prefix string, not the module path
        self.cross = nn.ModuleDict({"dense": nn.Linear(4, 4), "LayerNorm": nn.LayerNorm(4), "ln": nn.LayerNorm(4)})
        self.word_embeddings = nn.Embedding(10, 4)


class ToyModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 10)  # registered before the model: the tied weight is listed here first
        self.model = ToyModel()
        self.head.weight = self.model.word_embeddings.weight
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)


def _by_param(groups) -> dict[int, dict]:
    return {id(p): g for g in groups for p in g["params"]}


def test_tiers_multipliers_and_no_decay():
    module = ToyModule()
    groups = param_groups(module, lr=1e-4, weight_decay=0.01, lr_mult=5.0, lr_mult_head=10.0, no_decay="bert")
    where = _by_param(groups)
    m = module.model
    expect = {
        m.text_tower["dense"].weight: ("encoder/decay", 1e-4, 0.01),
        m.text_tower["dense"].bias: ("encoder/no_decay", 1e-4, 0.0),
        m.text_tower["LayerNorm"].weight: ("encoder/no_decay", 1e-4, 0.0),
        m.text_tower_extra.weight: ("cross_modal/decay", 5e-4, 0.01),
        m.cross["dense"].weight: ("cross_modal/decay", 5e-4, 0.01),
        m.cross["LayerNorm"].weight: ("cross_modal/no_decay", 5e-4, 0.0),
        m.cross["ln"].weight: ("cross_modal/decay", 5e-4, 0.01),  # UNITER's name rule: not "LayerNorm"
        m.word_embeddings.weight: ("cross_modal/decay", 5e-4, 0.01),  # tied: counted once, with the model
        module.head.bias: ("head/no_decay", 1e-3, 0.0),
    }
    for p, (name, lr, wd) in expect.items():
        g = where[id(p)]
        assert (g["name"], g["lr"], g["weight_decay"]) == (name, pytest.approx(lr), wd)
    assert id(module.frozen.weight) not in where
    n_params = sum(len(g["params"]) for g in groups)
    assert n_params == len({id(p) for p in module.parameters() if p.requires_grad})


def test_norms_rule_uses_module_types():
    module = ToyModule()
    names = no_decay_names(module, "norms")
    assert "model.cross.ln.weight" in names and "model.cross.LayerNorm.weight" in names
    assert "model.cross.dense.bias" in names and "model.cross.dense.weight" not in names
    assert "model.cross.ln.weight" not in no_decay_names(module, "bert")
    with pytest.raises(ValueError, match="unknown no_decay rule"):
        no_decay_names(module, "uniter")  # rules are named by what they match, not by family


def test_meter_groups_on_the_real_model():
    import vlkit

    model = vlkit.build_model("meter", preset="tiny")
    module = nn.Module()
    module.model, module.mlm_score = model, nn.Linear(8, 8)
    groups = param_groups(module, lr=1e-5, weight_decay=0.01, lr_mult=5.0, no_decay="bert_timm")
    by_name = {n: _by_param(groups)[id(p)] for n, p in module.named_parameters()}
    for name, g in by_name.items():
        tower = name.startswith(("model.text_transformer.", "model.vit_model."))
        assert g["lr"] == pytest.approx(1e-5 if tower else 5e-5), name
    assert by_name["model.cross_modal_text_layers.0.output.LayerNorm.weight"]["weight_decay"] == 0.0
    assert by_name["model.vit_model.blocks.0.norm1.weight"]["weight_decay"] == 0.0
    assert by_name["model.vit_model.norm_pre.weight"]["weight_decay"] == 0.01  # not in METER's name list
    assert by_name["mlm_score.weight"]["name"] == "head/decay"
    opt = build_optimizer(module, lr=1e-5, betas=(0.9, 0.98), eps=1e-8, lr_mult=5.0, no_decay="bert_timm")
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-8


def _lrs(scheduler, optimizer, n: int) -> list[list[float]]:
    """The lr of every group at each of ``n`` updates (read before optimizer.step, as the trainer does)."""
    out = []
    for _ in range(n):
        out.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return out


def _optimizer(lr: float = 1.0):
    module = ToyModule()
    return build_optimizer(module, lr=lr, lr_mult=5.0, lr_mult_head=10.0)


def test_linear_warmup_then_decay_offsets():
    opt = _optimizer()
    lrs = _lrs(build_scheduler(opt, max_steps=20, warmup=4, schedule="linear"), opt, 20)
    first = [row[0] for row in lrs]
    assert first[:5] == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])
    assert first[12] == pytest.approx((20 - 12) / 16) and first[19] == pytest.approx(1 / 16)
    mults = [g["lr_mult"] for g in opt.param_groups]
    assert set(mults) == {1.0, 5.0, 10.0}
    assert all(row == pytest.approx([row[0] * m for m in mults]) for row in lrs)

    # UNITER's get_lr_sched(global_step) with global_step = update index + 1 (official optim/sched.py)
    def warmup_linear(step, warmup_step, tot_step):
        return step / warmup_step if step < warmup_step else max(0, (tot_step - step) / (tot_step - warmup_step))

    opt = _optimizer(5e-5)
    uniter = [row[0] for row in _lrs(build_scheduler(opt, 20, 4, "linear", offset=1), opt, 19)]
    assert uniter == pytest.approx([5e-5 * warmup_linear(s, 4, 20) for s in range(1, 20)])


def test_polynomial_and_constant():
    opt = _optimizer(1.0)
    lrs = [row[0] for row in _lrs(build_scheduler(opt, 10, 0.2, "polynomial", power=2.0, end_lr=0.1), opt, 11)]
    assert lrs[:2] == pytest.approx([0.0, 0.5])
    assert lrs[6] == pytest.approx(0.9 * (1 - 4 / 8) ** 2 + 0.1)
    assert lrs[10] == pytest.approx(0.1)
    linear = build_scheduler(_optimizer(1.0), 10, 0.2, "linear").lr_lambdas[0]
    poly1 = build_scheduler(_optimizer(1.0), 10, 0.2, "polynomial", power=1.0).lr_lambdas[0]
    assert [linear(s) for s in range(11)] == pytest.approx([poly1(s) for s in range(11)])
    opt = _optimizer(1.0)
    const = [row[0] for row in _lrs(build_scheduler(opt, 10, 3, "constant"), opt, 10)]
    assert const == pytest.approx([0, 1 / 3, 2 / 3] + [1.0] * 7)


def test_warmup_fraction_or_steps():
    assert warmup_steps(0.1, 1000) == 100 and warmup_steps(0.15, 10) == 1
    assert warmup_steps(10000, 200000) == 10000
    with pytest.raises(ValueError, match="neither"):
        warmup_steps(2.5, 100)
    with pytest.raises(ValueError, match="shorter than max_steps"):
        build_scheduler(_optimizer(), 10, 10, "linear")
    with pytest.raises(ValueError, match="unknown schedule"):
        build_scheduler(_optimizer(), 10, 1, "cosine")


def test_scheduler_state_round_trip():
    opt = _optimizer()
    sched = build_scheduler(opt, 20, 4, "linear", offset=1)
    _lrs(sched, opt, 7)
    state = sched.state_dict()
    opt2 = _optimizer()
    sched2 = build_scheduler(opt2, 20, 4, "linear", offset=1)
    sched2.load_state_dict(state)
    opt2.load_state_dict(opt.state_dict())  # the group lrs live in the optimizer state
    assert _lrs(sched2, opt2, 5) == _lrs(sched, opt, 5)
    assert isinstance(opt.param_groups[0]["lr"], float)
    assert torch.optim.AdamW is type(opt)


# -- AdamW update rules ----------------------------------------------------------------------------
def _official_adamw_step(params, state, lr, betas, eps, wd, correct_bias=True):
    """The official update (HF ``transformers.AdamW`` 4.6 / UNITER ``optim/adamw.py``), written out per parameter."""
    import math

    b1, b2 = betas
    for p in params:
        if p.grad is None:
            continue
        s = state.setdefault(p, {"step": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p)})
        s["step"] += 1
        s["m"].mul_(b1).add_(p.grad, alpha=1.0 - b1)
        s["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1.0 - b2)
        denom = s["v"].sqrt().add_(eps)
        step_size = lr * math.sqrt(1.0 - b2 ** s["step"]) / (1.0 - b1 ** s["step"]) if correct_bias else lr
        p.data.addcdiv_(s["m"], denom, value=-step_size)
        if wd > 0.0:
            p.data.add_(p.data, alpha=-lr * wd)


def _toy_grads(params, step):
    g = torch.Generator().manual_seed(100 + step)
    for i, p in enumerate(params):
        # the last parameter gets no gradient every other step: its step count falls behind
        p.grad = None if (i == len(params) - 1 and step % 2) else torch.randn(p.shape, generator=g)


def _toy_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=g) * 3) for s in ((7, 5), (5,), (3, 4, 2), (11,))]


@pytest.mark.parametrize("impl", ["loop", "foreach", "fused"])
@pytest.mark.parametrize("correct_bias", [True, False])
def test_hf_adamw_matches_the_official_rule(impl, correct_bias):
    from vlkit.train.optim import HFAdamW

    ref, ours = _toy_params(), _toy_params()
    opt = HFAdamW([{"params": ours[:2], "weight_decay": 0.05}, {"params": ours[2:], "weight_decay": 0.0, "lr": 3e-2}],
                  lr=1e-2, betas=(0.9, 0.98), eps=1e-6, correct_bias=correct_bias, impl=impl)
    state: dict = {}
    for step in range(6):
        _toy_grads(ref, step)
        _toy_grads(ours, step)
        _official_adamw_step(ref[:2], state, 1e-2, (0.9, 0.98), 1e-6, 0.05, correct_bias)
        _official_adamw_step(ref[2:], state, 3e-2, (0.9, 0.98), 1e-6, 0.0, correct_bias)
        opt.step()
    assert opt.state[ours[-1]]["step"].item() == 3  # skipped while it had no gradient
    for r, o in zip(ref, ours):
        if impl == "fused" and correct_bias:  # same update, float roundings in another order
            torch.testing.assert_close(o.data, r.data, rtol=0, atol=4e-6)
        else:  # the very ops of the official class, per parameter or on lists
            assert torch.equal(o.data, r.data)


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_torch_adamw_impls_agree(impl):
    ref, ours = _toy_params(), _toy_params()
    opt_ref = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.05, foreach=False)
    kind = {"fused": {"fused": True}, "foreach": {"foreach": True}}[impl]
    opt = torch.optim.AdamW(ours, lr=1e-2, weight_decay=0.05, **kind)
    for step in range(4):
        _toy_grads(ref, step)
        _toy_grads(ours, step)
        opt_ref.step()
        opt.step()
    for r, o in zip(ref, ours):
        torch.testing.assert_close(o.data, r.data, rtol=0, atol=4e-6)


def test_build_optimizer_rules_and_state_compatibility():
    from vlkit.train.optim import HFAdamW

    module = ToyModule()
    hf = build_optimizer(module, lr=1e-3, rule="hf", impl="fused")
    assert isinstance(hf, HFAdamW) and [g["name"] for g in hf.param_groups] == \
        [g["name"] for g in build_optimizer(module, lr=1e-3).param_groups]
    assert build_optimizer(module, lr=1e-3, impl="fused").defaults["fused"] is True
    for p in module.parameters():
        p.grad = torch.ones_like(p)
    hf.step()
    # the state layout is torch's: a checkpoint of one rule loads into the other
    torch_opt = build_optimizer(module, lr=1e-3, rule="torch", impl="loop")
    torch_opt.load_state_dict(hf.state_dict())
    torch_opt.step()
    assert all(torch_opt.state[p]["step"].item() == 2 for p in module.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="unknown AdamW rule"):
        build_optimizer(module, lr=1e-3, rule="adam")
    with pytest.raises(ValueError, match="unknown AdamW impl"):
        build_optimizer(module, lr=1e-3, impl="cuda_graph")
