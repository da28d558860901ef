"""Seeds until decided (`vlkit.stats.sequential`): the spending function's nominal levels, the looks, the
paired t-test's power, and the graphical Holm rule over claims (decisions, alpha recycling, frozen decisions,
running claims), with a small Monte Carlo of its family-wise error. Pure numpy / scipy, a few seconds."""
import math

import numpy as np
import pytest
from scipy import stats

from vlkit.stats.sequential import (decides, hypothesis_test, look_sizes, nominal_levels, p_upper, p_value,
                                    paired_power, seeds_for_power, sequential_claims, sign_flip_floor, sign_flip_p,
                                    sign_flip_seeds, spending, t_levels)
from vlkit.stats.paired import holm, paired_p_value


def test_nominal_levels_two_equally_spaced_looks():
    first, last = nominal_levels([0.5, 1.0], 0.05)
    assert first == pytest.approx(0.0056, abs=1e-4)  # = the spend at t = 1/2: 2 - 2 Phi(1.96 / sqrt(.5))
    assert first == pytest.approx(spending(0.5, 0.05), rel=1e-9)
    assert last == pytest.approx(0.048, abs=5e-4)  # boundary 1.977 (O'Brien-Fleming's 1.977 for K = 2)
    assert nominal_levels([1.0], 0.01) == pytest.approx([0.01])  # one look: the plain test
    assert spending(1.0, 0.05) == pytest.approx(0.05)


@pytest.mark.parametrize("fractions", [(0.5, 1.0), (3 / 6, 4 / 6, 5 / 6, 1.0), (0.2, 0.4, 0.6, 0.8, 1.0)])
@pytest.mark.parametrize("alpha", [0.05, 0.05 / 11])
def test_cumulative_type_one_error_equals_alpha(fractions, alpha):
    """P(some |Z_k| >= c_k) under the joint normal law of the looks' z statistics (corr sqrt(t_j / t_k))."""
    t = np.array(fractions)
    c = stats.norm.isf(np.array(nominal_levels(fractions, alpha)) / 2)
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    stay = stats.multivariate_normal(np.zeros(len(t)), cov, seed=0).cdf(c, lower_limit=-c)
    assert 1 - stay == pytest.approx(alpha, rel=2e-3)
    levels = nominal_levels(fractions, alpha)
    assert all(a < b for a, b in zip(levels, levels[1:])) and levels[-1] < alpha  # O'Brien-Fleming shape


def test_nominal_levels_refuse_bad_fractions():
    with pytest.raises(ValueError, match="fractions"):
        nominal_levels([0.6, 0.5, 1.0], 0.05)
    with pytest.raises(ValueError, match="alpha"):
        nominal_levels([0.5, 1.0], 0.0)


def test_look_sizes():
    assert look_sizes(3, 6, 1) == [3, 4, 5, 6]
    assert look_sizes(3, 6, 2) == [3, 5, 6]
    assert look_sizes(3, 6, 3) == [3, 6]
    assert look_sizes(3, 6, 10) == [3, 6]
    assert look_sizes(6, 6, 1) == [6] and look_sizes(8, 6, 1) == [6]
    for args, word in (((1, 6, 1), "initial"), ((3, 6, 0), "round_seeds"), ((3, 1, 1), "max_seeds"),
                       ((3, 100_000, 1), "max_seeds must be 2 to 100, not 100000")):
        with pytest.raises(ValueError, match=word):
            look_sizes(*args)


def test_paired_power_and_seeds_for_power():
    assert paired_power(1.0, 1.0, 10, 0.05) == pytest.approx(0.803, abs=1e-3)
    assert paired_power(0.0, 1.0, 6, 0.01) == pytest.approx(0.01)  # no effect: the test's level
    assert paired_power(-2.0, 1.0, 5, 0.05) == pytest.approx(paired_power(2.0, 1.0, 5, 0.05))
    assert math.isnan(paired_power(1.0, 1.0, 1, 0.05))
    # scipy's noncentral t gives NaN for the (negligible) wrong tail here: the power is 0.635 (Monte Carlo), not 1
    assert paired_power(4.0, 1.0, 4, 0.05 / 11) == pytest.approx(0.635, abs=2e-3)
    needed = [seeds_for_power(e, 1.0, 0.05 / 11) for e in (0.5, 1.0, 1.5, 2.0, 3.0)]
    assert all(a > b for a, b in zip(needed, needed[1:]))  # fewer seeds for larger effects
    for effect, n in zip((0.5, 1.0, 1.5, 2.0, 3.0), needed):
        assert paired_power(effect, 1.0, n, 0.05 / 11) >= 0.8 > paired_power(effect, 1.0, n - 1, 0.05 / 11)
    assert seeds_for_power(1.0, 1.0, 0.05, power=0.9) >= seeds_for_power(1.0, 1.0, 0.05, power=0.8)
    assert seeds_for_power(0.0, 1.0, 0.05) is None and seeds_for_power(math.nan, 1.0, 0.05) is None
    assert seeds_for_power(1.0, math.nan, 0.05) is None and seeds_for_power(0.01, 1.0, 0.05, max_n=1000) is None
    assert seeds_for_power(1.0, 0.0, 0.05) == 2
    assert seeds_for_power(50.0, 1.0, 0.05) == 2  # p at 2 seeds can reach 0.05 only with a huge effect


def test_p_value_is_the_paired_t_test():
    rng = np.random.default_rng(3)
    for d in rng.normal(1.0, 2.0, size=(20, 5)):
        assert p_value(d) == pytest.approx(paired_p_value(list(d), [0.0] * 5), rel=1e-9)
    assert math.isnan(p_value([0.2, 0.2 + 1e-17])) and math.isnan(p_value([1.0]))


SIZES = [3, 4, 5, 6]
NULL = [0.4, -0.3, 0.1, -0.2, 0.5, -0.6]  # p well above any level at every look


def test_huge_effect_decided_at_the_first_look_null_inconclusive_at_the_last():
    down = [-30, -30.2, -29.9, -30.1]
    out = sequential_claims([[100.0, 100.1, 99.9, 100.2, 99.8, 100.0], NULL, down], SIZES, kinds=["higher"] * 2 + ["lower"])
    assert out[0]["state"] == "decided" and out[0]["look"] == 1 and out[0]["n"] == 3 and out[0]["direction"] == 1
    assert out[0]["p"] <= out[0]["level"] and out[0]["alpha"] == pytest.approx(0.05 / 3)
    assert out[0]["effect"] == pytest.approx(100.0) and out[0]["parametric_only"]  # 2^-3 > any level here
    assert out[2]["state"] == "decided" and out[2]["direction"] == 1  # "lower", as claimed: no more seeds needed
    assert out[1]["state"] == "inconclusive" and out[1]["look"] == 4 and out[1]["n"] == 6
    assert out[1]["direction"] == 0 and out[1]["alpha"] == pytest.approx(0.05)  # it got the others' alpha
    assert out[1]["level"] == pytest.approx(t_levels(SIZES, 0.05)[3])


def test_one_sided_in_the_preregistered_direction_and_contradiction_only_when_preregistered():
    up = [100.0, 100.1, 99.9, 100.2, 99.8, 100.0]
    down = [-x for x in up]
    out = sequential_claims([down, down, NULL], SIZES, kinds=["higher"] * 3, contradict=[False, True, False])
    assert out[0]["state"] == "inconclusive" and out[0]["direction"] == 0  # the wrong way: not decided, not contradicted
    assert out[1]["state"] == "decided" and out[1]["direction"] == -1  # its contradiction test, pre-registered
    # the contradiction test is a hypothesis of its own: 4 hypotheses share alpha
    assert out[1]["alpha"] == pytest.approx(0.05 / 4)
    with pytest.raises(ValueError, match="contradiction"):
        sequential_claims([up], SIZES, kinds=["equivalent"], margins=[1.0], contradict=[True])


def test_not_higher_and_equivalence_by_tost():
    """d = a - b: a non-superiority claim (a < b + margin) is decided when d sits well below the margin; TOST
    (|a - b| < margin) needs both one-sided tests; a difference near the margin decides neither."""
    rng = np.random.default_rng(0)
    near_zero = list(rng.normal(0.0, 0.1, 8))
    below = list(rng.normal(-2.0, 0.1, 8))
    near_margin = list(rng.normal(1.0, 0.1, 8))
    out = sequential_claims([near_zero, below, near_margin, near_zero, below], [8], 0.05,
                            kinds=["not_higher"] * 3 + ["equivalent"] * 2, margins=[1.0] * 5)
    assert [o["state"] for o in out] == ["decided", "decided", "inconclusive", "decided", "inconclusive"]
    tost = hypothesis_test(near_zero, "equivalent", 1.0)
    assert tost["p"] == pytest.approx(max(p_upper([1.0 - x for x in near_zero]), p_upper([x + 1.0 for x in near_zero])))
    with pytest.raises(ValueError, match="margin"):
        sequential_claims([near_zero], [8], kinds=["not_higher"], margins=[0.0])


def test_sign_flip_p_is_exact_and_vetoes_where_it_can_reach_the_level():
    assert sign_flip_p([1.0, 2.0, 3.0]) == 1 / 8 and sign_flip_p([1.0, -2.0, 3.0]) == 3 / 8
    rng = np.random.default_rng(2)
    for e in rng.normal(0.3, 1.0, size=(5, 7)):  # against a brute force over the 128 sign patterns
        signs = np.array(np.meshgrid(*[[-1, 1]] * 7)).reshape(7, -1).T
        assert sign_flip_p(e) == pytest.approx(((signs @ np.abs(e)) >= e.sum() - 1e-12).mean())
    assert sign_flip_floor(8) == 2 ** -8 and sign_flip_seeds(0.05 / 11) == 8 and sign_flip_seeds(0.05) == 5
    many = rng.normal(0.5, 1.0, 20)  # beyond 16 differences: seeded draws, the same p every time
    assert 1 / (1 + 2 ** 16) <= sign_flip_p(many) == sign_flip_p(list(many)) < 1 and sign_flip_floor(20) < 2 ** -16
    one_wrong = [5.0, 5.1, 4.9, 5.0, 5.2, 4.8, 5.0, -0.1]  # t: certain; sign-flip: 2 / 256 patterns reach it
    test = hypothesis_test(one_wrong)
    assert test["p"] < 1e-3 and test["sign_flip_p"] == pytest.approx(2 / 256)
    assert not decides(test, 0.005) and decides(test, 0.01)  # 2^-8 <= 0.005: the sign-flip test vetoes
    six = hypothesis_test([5.0, 5.1, 4.9, 5.0, 5.2, 4.8])
    assert decides(six, 0.005) and six["sign_flip_floor"] > 0.005  # 2^-6 > 0.005: the t-test alone decides
    assert sequential_claims([one_wrong], None, 0.005)[0]["state"] == "inconclusive"
    out = sequential_claims([[5.0, 5.1, 4.9, 5.0, 5.2, 4.8]], None, 0.005)[0]
    assert out["state"] == "decided" and out["parametric_only"]
    # recycled alpha lifts the vetoed claim's level to 0.01, which its sign-flip p reaches
    both = sequential_claims([one_wrong, [5.0, 5.1, 4.9, 5.0, 5.2, 4.8]], None, 0.01)
    assert [o["state"] for o in both] == ["decided"] * 2 and not both[0]["parametric_only"]


def test_running_while_a_look_lacks_seeds():
    out = sequential_claims([NULL[:4], NULL], SIZES)  # look 3 needs 5 seeds of both
    assert [o["state"] for o in out] == ["running", "running"] and [o["look"] for o in out] == [2, 2]
    out = sequential_claims([NULL[:2], NULL], SIZES)
    assert [o["state"] for o in out] == ["running", "running"] and out[0]["look"] == 0 and math.isnan(out[0]["p"])
    assert sequential_claims([], SIZES) == []


def test_alpha_recycled_at_the_same_look_decides_a_claim():
    """p = 0.0033 at 3 seeds lies between the first look's nominal level at alpha/2 and at alpha (0.0055):
    the claim is decided only once the other claim's local level passes to it."""
    close = [1.0, 1.1, 0.9]
    alone = sequential_claims([close, NULL[:3]], [3, 6])
    assert alone[0]["state"] == "running" and alone[0]["look"] == 1 and alone[0]["direction"] == 0
    out = sequential_claims([close, [100.0, 100.1, 99.9]], [3, 6])
    assert [o["state"] for o in out] == ["decided", "decided"] and [o["look"] for o in out] == [1, 1]
    assert out[0]["alpha"] == pytest.approx(0.05) and out[1]["alpha"] == pytest.approx(0.025)
    assert out[0]["level"] == pytest.approx(t_levels([3, 6], 0.05)[0])
    assert t_levels([3, 6], 0.025)[0] < out[0]["p"] <= out[0]["level"]


def test_decisions_frozen_and_replay_deterministic():
    early = [5.0, 5.2, 4.9]
    first = sequential_claims([early, NULL[:3]], SIZES)
    assert first[0]["state"] == "decided" and first[1]["state"] == "running"
    later = sequential_claims([early + [-40.0, -50.0, -60.0], NULL], SIZES)  # later seeds reverse it: too late
    assert later[0] == first[0]
    assert later[1]["state"] == "inconclusive" and later[1]["alpha"] == pytest.approx(0.05)
    assert sequential_claims([early + [-40.0, -50.0, -60.0], NULL], SIZES) == later


def test_untestable_claim_never_decided():
    out = sequential_claims([[2.0] * 6, [0.1 + 0.2, 0.3, 0.30000000000000004, 0.3, 0.3, 0.3]], SIZES)
    assert all(o["state"] == "inconclusive" and math.isnan(o["p"]) for o in out)


def test_one_look_is_holm():
    """At 4 seeds the sign-flip test cannot reach 0.05 (2^-4): one look is Holm's procedure on the one-sided t-tests."""
    rng = np.random.default_rng(1)
    for _ in range(50):
        diffs = rng.normal(rng.choice([0.0, 3.0], size=(8, 1)), 1.0, size=(8, 4))
        for sizes in ([4], None):
            out = sequential_claims(diffs.tolist(), sizes)
            adjusted = holm([p_upper(d) for d in diffs])
            assert [o["state"] == "decided" for o in out] == [p <= 0.05 for p in adjusted]


def test_familywise_error_under_the_null_monte_carlo():
    """A coarse check (2,000 comparisons): the significance-level approach is exact for z statistics only; with t
    at 2-5 degrees of freedom benchmarks/sequential_claims.py measures 5.6% for 11 claims and looks 3-6."""
    rng = np.random.default_rng(20261205)
    sims, claims = 2000, 5
    diffs = rng.normal(size=(sims, claims, 6))
    false = sum(any(o["state"] == "decided" for o in sequential_claims(d.tolist(), SIZES)) for d in diffs)
    fwer = false / sims
    assert fwer < 0.05 + 3 * math.sqrt(0.05 * 0.95 / sims)
    assert fwer > 0.02  # the rule does spend its error (an unreachable level would pass the check above)


def test_t_boundaries_spend_alpha_where_normal_levels_on_t_spend_more():
    """On null sequences the Monte Carlo never saw (another seed), the exact t boundaries of looks 3, 4, 5, 6
    reject about alpha; the normal boundaries' levels applied to t reject more (2-5 degrees of freedom)."""
    rng = np.random.default_rng(7)
    sizes, alpha, sims = [3, 4, 5, 6], 0.05 / 11, 1_000_000  # a claim's first local level among 11
    d = rng.standard_normal((sims, 6))
    p = np.array([[p_value(row[:n]) for n in sizes] for row in d[:2_000]])  # p_value itself, on a slice
    n = np.array(sizes, dtype=float)
    mean = np.cumsum(d, 1)[:, n.astype(int) - 1] / n
    var = (np.cumsum(d * d, 1)[:, n.astype(int) - 1] - n * mean * mean) / (n - 1)
    from scipy import special
    p_all = 2 * special.stdtr(n - 1, -np.abs(mean) / np.sqrt(var / n))
    assert np.allclose(p_all[:2_000], p)
    se = math.sqrt(alpha * (1 - alpha) / sims)
    exact = (p_all <= np.array(t_levels(sizes, alpha))).any(1).mean()
    normal = (p_all <= np.array(nominal_levels(n / n[-1], alpha))).any(1).mean()
    assert abs(exact - alpha) < 4 * se
    assert normal > alpha + 3 * se
    assert t_levels([6], 0.01) == [0.01]  # one look: the plain test


def test_one_sided_t_boundaries_spend_alpha_in_the_claimed_direction():
    rng = np.random.default_rng(11)
    sizes, alpha, sims = [3, 4, 5, 6], 0.05 / 11, 1_000_000
    d = rng.standard_normal((sims, 6))
    n = np.array(sizes, dtype=float)
    mean = np.cumsum(d, 1)[:, n.astype(int) - 1] / n
    var = (np.cumsum(d * d, 1)[:, n.astype(int) - 1] - n * mean * mean) / (n - 1)
    from scipy import special
    p_up = special.stdtr(n - 1, -mean / np.sqrt(var / n))
    assert np.allclose(p_up[:500, 1], [p_upper(row[:4]) for row in d[:500]])
    one = t_levels(sizes, alpha, sides=1)
    assert abs((p_up <= np.array(one)).any(1).mean() - alpha) < 4 * math.sqrt(alpha / sims)
    assert (p_up >= 1 - np.array(one)).any(1).mean() == pytest.approx(alpha, abs=4 * math.sqrt(alpha / sims))


def test_the_vectorised_rule_decides_as_the_rule():
    """`vlkit.stats.simulate.simulate_claims` (the benchmark's and the dry run's) against `sequential_claims`, with
    superiority, contradiction, non-superiority and TOST claims, at looks where the sign-flip test can veto."""
    from vlkit.stats.simulate import final_seeds, simulate_claims

    rng = np.random.default_rng(0)
    kinds, margins = ["higher", "higher", "lower", "not_higher", "equivalent"], [0, 0, 0, 1.0, 1.0]
    contradict = [False, True, False, True, False]
    basis = set()
    for sizes in ([3, 4, 5, 6], [5, 8, 10]):
        d = rng.normal(rng.choice([0.0, 1.0, 2.5, -1.5], size=(60, 5, 1)), 1.0, size=(60, 5, sizes[-1]))
        direction, look, parametric = simulate_claims(d, sizes, 0.05, kinds, margins, contradict)
        for s in range(60):
            ref = sequential_claims(d[s].tolist(), sizes, 0.05, kinds, margins, contradict)
            assert [r["direction"] for r in ref] == direction[s].tolist()
            assert [r["parametric_only"] for r in ref] == parametric[s].tolist()
            assert [r["look"] - 1 for r in ref if r["direction"]] == look[s][direction[s] != 0].tolist()
        assert 0 < (direction != 0).mean() < 1
        basis |= set(parametric[direction != 0].tolist())
    assert basis == {True, False}  # decisions on the t-test alone and checked by the sign-flip test
    seeds = final_seeds(np.array([[0, 2], [1, 1]]), [5, 8, 10], [[0, 1], [1]], 3, 5)
    assert seeds.tolist() == [[5, 10, 5], [8, 8, 5]]
