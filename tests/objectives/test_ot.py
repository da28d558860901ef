import math

import numpy as np
import ot as pot
import pytest
import torch
import torch.nn.functional as F

from vlkit.objectives.ot import cosine_cost, ipot, ipot_plan, wra_distance, wra_loss


def _cosine_problem(g, m, n, dim=16):
    """A [1, m, n] cosine cost between random word / region states (costs in [0, 2])."""
    return cosine_cost(torch.randn(1, m, dim, generator=g), torch.randn(1, n, dim, generator=g))


def _full(m, n):
    return torch.ones(1, m, dtype=torch.bool), torch.ones(1, n, dtype=torch.bool)


def _reference_ipot(cost, beta=0.5, iterations=50, k=1):
    """Textbook IPOT (Xie et al. 2019, Alg. 1) on one unpadded problem, run on C^T as UNITER does."""
    c = cost.T.astype(np.float64)  # [N, M]: UNITER's plan orientation
    n, m = c.shape
    a_mass, b_mass = np.full(n, 1 / n), np.full(m, 1 / m)
    g = np.exp(-c / beta)
    t = np.ones_like(c)
    b = np.full(m, 1 / m)
    for _ in range(iterations):
        q = g * t
        for _ in range(k):
            a = a_mass / (q @ b)
            b = b_mass / (q.T @ a)
        t = a[:, None] * q * b[None, :]
    return t.T


def test_cosine_cost_matches_definition():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, 5, generator=g), torch.randn(2, 4, 5, generator=g)
    expected = 1 - torch.einsum("bmd,bnd->bmn", F.normalize(x, dim=-1), F.normalize(y, dim=-1))
    torch.testing.assert_close(cosine_cost(x, y), expected)
    assert cosine_cost(x, x).diagonal(dim1=1, dim2=2).abs().max() < 1e-6
    with pytest.raises(ValueError, match="cosine_cost"):
        cosine_cost(x, torch.randn(2, 4, 6))


def test_distance_within_2_percent_of_exact_emd():
    g = torch.Generator().manual_seed(1)
    for _ in range(25):
        m, n = (int(v) for v in torch.randint(2, 41, (2,), generator=g))
        cost = _cosine_problem(g, m, n)
        distance, _ = ipot(cost, *_full(m, n))
        exact = pot.emd2(pot.unif(m), pot.unif(n), cost[0].double().numpy())
        assert abs(distance.item() - exact) / exact < 0.02, (m, n)


def test_plan_marginals_are_uniform():
    g = torch.Generator().manual_seed(2)
    for _ in range(10):
        m, n = (int(v) for v in torch.randint(2, 41, (2,), generator=g))
        plan = ipot_plan(_cosine_problem(g, m, n, dim=32), *_full(m, n))[0]
        assert (plan >= 0).all()
        assert (plan.sum(1) - 1 / m).abs().max() < 1e-3
        assert (plan.sum(0) - 1 / n).abs().max() < 1e-3


def test_plan_matches_textbook_ipot():
    g = torch.Generator().manual_seed(3)
    for beta, iterations, k in [(0.5, 50, 1), (0.1, 20, 3), (1.0, 5, 2)]:
        cost = _cosine_problem(g, 7, 11)
        plan = ipot_plan(cost, *_full(7, 11), beta=beta, iterations=iterations, k=k)[0]
        expected = _reference_ipot(cost[0].numpy(), beta, iterations, k)
        np.testing.assert_allclose(plan.numpy(), expected, rtol=1e-4, atol=1e-7)


def test_padded_batch_equals_each_sample_alone():
    g = torch.Generator().manual_seed(4)
    sizes = [(3, 9), (12, 2), (7, 7), (12, 9), (1, 5)]
    m_max, n_max = 12, 9
    text = torch.randn(len(sizes), m_max, 8, generator=g)
    regions = torch.randn(len(sizes), n_max, 8, generator=g)
    text_mask = torch.tensor([[i < m for i in range(m_max)] for m, _ in sizes])
    region_mask = torch.tensor([[j < n for j in range(n_max)] for _, n in sizes])
    batched = wra_distance(text, text_mask, regions, region_mask)
    for b, (m, n) in enumerate(sizes):
        alone = wra_distance(text[b:b + 1, :m], torch.ones(1, m), regions[b:b + 1, :n], torch.ones(1, n))
        torch.testing.assert_close(batched[b:b + 1], alone, rtol=1e-5, atol=1e-6)
    # pads are ignored whatever their content
    garbage = text.clone()
    garbage[~text_mask] = 1e4
    torch.testing.assert_close(wra_distance(garbage, text_mask, regions, region_mask), batched)


def test_gradient_flows_only_through_cost():
    g = torch.Generator().manual_seed(5)
    cost = torch.rand(3, 6, 5, generator=g).requires_grad_()
    x_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]).bool()
    y_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]).bool()
    distance, plan = ipot(cost, x_mask, y_mask)
    assert not plan.requires_grad and distance.requires_grad
    (grad,) = torch.autograd.grad(distance.sum(), cost)
    torch.testing.assert_close(grad, plan)
    assert (grad[~(x_mask[:, :, None] & y_mask[:, None, :])] == 0).all()


def test_wra_distance_backpropagates_to_states():
    g = torch.Generator().manual_seed(6)
    text = torch.randn(2, 4, 8, generator=g, requires_grad=True)
    regions = torch.randn(2, 3, 8, generator=g, requires_grad=True)
    mask_t, mask_r = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), torch.tensor([[1, 1, 1], [1, 0, 0]])
    wra_distance(text, mask_t, regions, mask_r).sum().backward()
    assert text.grad.abs().sum() > 0 and regions.grad.abs().sum() > 0
    assert (text.grad[0, 3] == 0).all() and (regions.grad[1, 1:] == 0).all()


def test_fully_padded_rows_and_samples_give_no_nan():
    cost = torch.rand(4, 5, 6, requires_grad=True)
    x_mask = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]]).bool()
    y_mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]).bool()
    distance, plan = ipot(cost, x_mask, y_mask)
    (grad,) = torch.autograd.grad(distance.sum(), cost)
    assert torch.isfinite(distance).all() and torch.isfinite(plan).all() and torch.isfinite(grad).all()
    assert distance[1:].eq(0).all() and plan[1:].eq(0).all()
    assert plan[0, 2:].eq(0).all() and plan[0, :, 3:].eq(0).all()
    assert math.isclose(plan[0].sum().item(), 1.0, rel_tol=1e-5)


def test_offset_costs_do_not_underflow():
    g = torch.Generator().manual_seed(7)
    cost = _cosine_problem(g, 6, 8)
    d0, p0 = ipot(cost, *_full(6, 8))
    d1, p1 = ipot(cost + 100.0, *_full(6, 8))  # exp(-200) would underflow without the shift
    torch.testing.assert_close(p1, p0, rtol=0, atol=2e-5)  # fp32 ulp at 100 is ~1e-5
    torch.testing.assert_close(d1, d0 + 100.0)


def test_fp32_under_bf16_autocast():
    g = torch.Generator().manual_seed(8)
    text, regions = torch.randn(3, 7, 16, generator=g), torch.randn(3, 5, 16, generator=g)
    mask_t, mask_r = torch.ones(3, 7), torch.ones(3, 5)
    reference = wra_distance(text, mask_t, regions, mask_r)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        distance = wra_distance(text, mask_t, regions, mask_r)
        dist2, plan = ipot(cost_bf16 := torch.bmm(text, regions.transpose(1, 2)).tanh(), mask_t, mask_r)
    assert cost_bf16.dtype == torch.bfloat16  # autocast really was active
    assert distance.dtype == torch.float32 and dist2.dtype == torch.float32 and plan.dtype == torch.float32
    torch.testing.assert_close(distance, reference)


def test_wra_loss_official_formula():
    distance = torch.tensor([0.5, 0.2, 0.9, 0.4], requires_grad=True)
    is_match = torch.tensor([1, 0, 1, 0])
    loss = wra_loss(distance, is_match)
    assert math.isclose(loss.item(), ((0.5 + 0.9) - (0.2 + 0.4)) / 4, rel_tol=1e-6)
    loss.backward()
    torch.testing.assert_close(distance.grad, torch.tensor([0.25, -0.25, 0.25, -0.25]))
    with pytest.raises(ValueError, match="wra_loss"):
        wra_loss(distance, is_match[:3])


def test_bad_arguments_are_rejected():
    cost = torch.rand(2, 3, 4)
    with pytest.raises(ValueError, match="masks"):
        ipot(cost, torch.ones(2, 4), torch.ones(2, 4))
    with pytest.raises(ValueError, match="iterations"):
        ipot(cost, torch.ones(2, 3), torch.ones(2, 4), iterations=0)


def test_problems_padded_to_the_graph_buckets_keep_their_plan():
    """On CUDA, IPOT runs padded to multiples of 8 (fewer CUDA-graph shapes): the padded problem's plan,
    cut back, is the plan of the problem itself."""
    from vlkit.objectives.ot import _eager_plan, _masks, pad_problem

    g = torch.Generator().manual_seed(3)
    cost = cosine_cost(torch.randn(5, 11, 16, generator=g), torch.randn(5, 13, 16, generator=g))
    x_mask = torch.arange(11) < torch.tensor([11, 4, 9, 1, 7])[:, None]
    y_mask = torch.arange(13) < torch.tensor([13, 13, 2, 6, 10])[:, None]
    masks = _masks(cost, x_mask, y_mask)
    padded = pad_problem(cost, *masks)
    assert padded[0].shape == (8, 16, 16) and padded[3].shape == (8, 16, 16)
    plan = _eager_plan(cost, *masks, 0.5, 50, 1)
    torch.testing.assert_close(_eager_plan(*padded, 0.5, 50, 1)[:5, :11, :13], plan, rtol=1e-5, atol=1e-7)
    assert pad_problem(padded[0], *padded[1:])[0] is padded[0]  # already a multiple: unchanged
