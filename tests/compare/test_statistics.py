"""Issue 11: the comparison's statistics on synthetic records (no training): t-intervals, paired tests
against scratch and between contestants, Holm's correction, the minimum detectable effect, the papers'
claims, chance levels and a strict results.json."""
import json
import math

import numpy as np
import pytest

from vlkit.compare.claims import check_claims, verdicts
from vlkit.compare.report import analyse, write_outputs
from vlkit.compare.statistics import chance_levels, pairwise_tests, scratch_tests
from vlkit.stats.paired import holm, mean_ci, min_detectable_effect, paired_p_value


def records(effects: dict[tuple[str, str], float], seeds=(0, 1, 2, 3, 4), noise=0.01, seed=0, chance=True):
    """VQA / NLVR2 records: a shared per-seed draw plus a fixed effect per (run, variant) and a little noise."""
    rng = np.random.default_rng(seed)
    shared = {s: rng.normal(0.5, 0.03) for s in seeds}
    out = []
    for (run, variant), effect in effects.items():
        for s in seeds:
            r = {"run": run, "variant": variant, "family": run.split("-")[0], "preset": "tiny", "objectives": None,
                 "seed": s, "vqa": shared[s] + effect + rng.normal(0, noise), "nlvr2": 0.6 + rng.normal(0, 0.05)}
            if chance:
                r.update(vqa_majority_baseline=0.187, vqa_blind_baseline=0.3, nlvr2_majority_baseline=0.5,
                         vqa_yes_no=r["vqa"] + 0.1, vqa_blind_yes_no=0.62, vqa_prior_yes_no=0.64)
            out.append(r)
    return out


def test_mean_ci_and_paired_p_value():
    mean, ci = mean_ci([0.40, 0.44, 0.48])
    assert mean == pytest.approx(0.44) and ci == pytest.approx(4.302653 * 0.04 / math.sqrt(3), rel=1e-5)
    assert math.isnan(mean_ci([0.5])[1])
    assert paired_p_value([0.5, 0.6, 0.7], [0.4, 0.45, 0.62]) == pytest.approx(0.0340, abs=1e-4)  # d = .1 .15 .08
    assert math.isnan(paired_p_value([0.5], [0.4]))  # one seed: no test
    assert math.isnan(paired_p_value([0.5, 0.6], [0.4, 0.5]))  # no spread in the differences: undefined
    assert math.isnan(paired_p_value([0.1 + 0.2, 0.6], [0.1, 0.4]))  # equal up to rounding (0.2 vs 0.2000...04)


def test_holm_step_down():
    adjusted = holm([0.01, 0.04, 0.03, 0.005])
    # sorted 0.005 x4, 0.01 x3, 0.03 x2, 0.04 x1 -> 0.02, 0.03, 0.06, max(0.06, 0.04): monotone
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    nan_in = holm([0.01, float("nan"), 0.02])
    assert math.isnan(nan_in[1]) and nan_in[0] == pytest.approx(0.02) and nan_in[2] == pytest.approx(0.02)


@pytest.mark.parametrize("n", [3, 5])
def test_minimum_detectable_effect_has_the_stated_power(n):
    from scipy import stats

    sd = 0.02
    effect = min_detectable_effect(sd, n)
    rng = np.random.default_rng(n)
    diffs = rng.normal(effect, sd, size=(40000, n))
    t = diffs.mean(1) / (diffs.std(1, ddof=1) / math.sqrt(n))
    power = (np.abs(t) > stats.t.ppf(0.975, n - 1)).mean()
    assert power == pytest.approx(0.8, abs=0.01)
    assert min_detectable_effect(sd, n, alpha=0.01) > effect > min_detectable_effect(sd, n + 5)
    assert math.isnan(min_detectable_effect(sd, 1)) and math.isnan(min_detectable_effect(0.0, 5))


def test_scratch_and_pairwise_tests_find_the_planted_effects():
    recs = records({("a", "pretrained"): 0.05, ("a", "scratch"): 0.0, ("b", "pretrained"): 0.0,
                    ("b", "scratch"): 0.0, ("c", "pretrained"): 0.02})
    b_pre = [r for r in recs if (r["run"], r["variant"]) == ("b", "pretrained")]
    b_scratch = [r for r in recs if (r["run"], r["variant"]) == ("b", "scratch")]
    for pre, base, d in zip(b_pre, b_scratch, (0.01, -0.01, 0.01, -0.01, 0.0)):  # no effect: mean difference 0
        base["vqa"] = pre["vqa"] + d
    scratch = scratch_tests(recs, ["vqa"])
    by_run = {t["comparison"]: t for t in scratch}
    assert by_run["a"]["effect"] == pytest.approx(0.05, abs=0.02) and by_run["a"]["significant"]
    assert not by_run["b"]["significant"]
    assert by_run["c"] == {"comparison": "c", "kind": "no baseline"}  # never a blank that reads as significant
    pairs = {t["comparison"]: t for t in pairwise_tests(recs, ["vqa"])}
    assert set(pairs) == {"a − b", "a − c", "b − c"}
    assert pairs["a − b"]["significant"] and pairs["a − b"]["effect"] > 0
    assert pairs["b − c"]["effect"] < 0
    raw = [t["p"] for t in pairs.values()]
    assert [t["p_holm"] for t in pairs.values()] == pytest.approx(holm(raw))


def test_claims_get_verdicts():
    """One-sided tests in the claims' directions (Holm over them, fixed design at 5 seeds): a claim the wrong way is
    inconclusive unless its contradiction test is pre-registered; a claim of no gain is decided by non-superiority."""
    recs = records({("x", "pretrained"): 0.06, ("x", "scratch"): 0.0, ("y", "pretrained"): 0.0,
                    ("z", "pretrained"): 0.061})
    claims = [{"claim": "x beats its scratch", "a": "x", "b": "x/scratch", "metric": "vqa", "expect": "higher"},
              {"claim": "y beats x", "a": "y", "b": "x", "metric": "vqa", "expect": "higher"},
              {"claim": "y beats x (contradiction pre-registered)", "a": "y", "b": "x", "metric": "vqa",
               "expect": "higher", "contradict": True},
              {"claim": "z does not beat x", "a": "z", "b": "x", "metric": "vqa", "kind": "not_higher", "margin": 1.0},
              {"claim": "y does not beat x", "a": "y", "b": "x", "metric": "vqa", "kind": "not_higher", "margin": 1.0}]
    check_claims(claims, ["x", "y", "z"])
    entries = {c["claim"]: c for c in verdicts(recs, claims)}
    assert {k: e["verdict"] for k, e in entries.items()} == {
        "x beats its scratch": "reproduced", "y beats x": "inconclusive",
        "y beats x (contradiction pre-registered)": "contradicted",
        "z does not beat x": "inconclusive", "y does not beat x": "reproduced"}
    first = entries["x beats its scratch"]
    assert first["test"] == "one-sided paired t" and first["direction"] == "a > b" and len(first["differences"]) == 5
    assert entries["y does not beat x"]["direction"] == "a < b + 1" and first["rule"]["sign_flip_p"] == 1 / 32
    # each claim's Holm-adjusted p, over the 6 hypotheses (5 claims and the pre-registered contradiction test); the
    # contradicted claim's is its contradiction test's, the p its rule reports
    raw = [verdicts(recs, [{**c, "contradict": False}])[0]["rule"]["p"] for c in claims]
    opposite = verdicts(recs, [{**claims[2], "expect": "lower", "contradict": False}])[0]["rule"]["p"]
    adjusted = holm([*raw, opposite])
    assert [entries[c["claim"]]["rule"]["holm_p"] for c in claims] == pytest.approx([*adjusted[:2], adjusted[5],
                                                                                     *adjusted[3:5]])
    assert entries["y beats x (contradiction pre-registered)"]["rule"]["p"] == pytest.approx(opposite)
    assert "holm_p" not in verdicts(recs, claims[:1], sizes=[3, 5])[0]["rule"]  # a sequential design has none
    for bad, word in (({"a": "w"}, "not a run"), ({"expect": "maybe"}, "expect"),
                      ({"expect": "not_higher"}, "kind: not_higher with a margin"), ({"margin": 1.0}, "margin"),
                      ({"expect": None, "kind": "equivalent"}, "margin"), ({"kind": "no_worse"}, "kind")):
        claim = {k: v for k, v in {**claims[0], **bad}.items() if v is not None}
        with pytest.raises((KeyError, ValueError), match=word):
            check_claims([claim], ["x", "y", "z"])


def test_results_json_is_strict_and_carries_chance_levels(tmp_path):
    recs = records({("a", "pretrained"): 0.05, ("a", "scratch"): 0.0, ("b", "pretrained"): 0.01})
    recs[0]["meta_sum"] = float("nan")  # a metric that could not be computed
    recs[1]["nlvr2"] = float("inf")
    cfg = {"compare": {"title": "t", "seeds": [0, 1, 2, 3, 4], "budget": {"pretrain_steps": 1}}, "data": {"name": "d"}}
    account = {"sessions": [], "wall_s": 1.0, "unit_s": 1.0, "wasted_unit_s": 0.0, "attempts": 1, "died": 0, "failed": 0,
               "device_hours": 1 / 3600, "wasted_device_hours": 0.0, "mfu": None, "units": {},
               "plan": {"device": "cpu", "mfu": 0.3, "mfu_source": "s", "flops": 1e9, "device_hours": 0.001}}
    write_outputs(tmp_path, cfg, recs, {"data_hash": "0" * 12}, {}, account)

    def refuse(constant):
        raise AssertionError(f"results.json holds {constant}")

    data = json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)
    # VQA's chance level is the question-only model's, overall and per answer type
    assert data["chance"] == pytest.approx({"vqa": 0.3, "vqa_yes_no": 0.62, "nlvr2": 0.5})
    assert data["records"][0]["meta_sum"] is None and data["records"][1]["nlvr2"] is None
    assert "vqa" in data["detectable_effects"] and data["detectable_effects"]["vqa"]["mde"] > 0
    md = (tmp_path / "results.md").read_text()
    assert "Chance or trivial-baseline level" in md and "vqa 30.0" in md and "vqa_yes_no 62.0" in md
    section = md.split("## VQA per answer type", 1)[1].split("##", 1)[0]
    assert "| a | pretrained |" in section and "vqa_yes_no" in section
    assert "`vqa_blind_*`, Antol et al.'s BoW Q) yes_no 62.0" in section and "(`vqa_prior_*`) yes_no 64.0" in section
    assert "no baseline" in md and "Minimum detectable effect at 5 seeds" in md
    assert "pre-training beats scratch for a" in md
    assert (tmp_path / "metrics.png").stat().st_size > 0


def test_chance_levels_and_meta_sum_chance():
    recs = [{"run": "r", "variant": "pretrained", "family": "f", "preset": "tiny", "objectives": None, "seed": 0,
             "vqa_blind_baseline": 0.2, "vqa_majority_baseline": 0.1, "ir_r1_chance": 0.0025,
             "tr_r1_chance": 0.0025, "nlvr2_majority_baseline": 0.5, "refexp_random_box": 0.19}]
    chance = chance_levels(recs)
    assert chance["meta_sum"] == pytest.approx(0.2 + 0.0025 + 0.0025 + 0.5 + 0.19)
    assert analyse(recs)["chance"] == chance


def test_held_out_itm_accuracy_pairs_every_caption_with_its_image_and_another(tmp_path):
    """`itm_accuracy` on a perfect and on a constant scorer: 1.0 and exactly 0.5 (balanced pairs)."""
    import torch
    from torch import nn

    from vlkit.tasks.probes import itm_accuracy
    from vlkit.data.pairs import ImageTextPairs
    from vlkit.data.shapes import shapes_tokenizer

    def source(image_id):
        return {"region_feats": torch.full((2, 4), float(image_id)), "region_boxes": torch.tensor([[0.1, 0.1, 0.5, 0.5]] * 2)}

    records = [{"id": f"{i}#{k}", "image_id": str(i), "caption": "a picture of a red circle."}
               for i in range(6) for k in range(3)]
    pairs = ImageTextPairs(records, shapes_tokenizer(), source, max_len=20)

    class Model(nn.Module):  # the "joint vector": does the row's image match its caption's image?
        device = torch.device("cpu")

        def forward(self, batch, pooled_only=False):
            caption_image = torch.tensor([float(i.split("#")[0]) for i in batch.ids])
            return (batch.region_feats[:, 0, 0] == caption_image).float()

    class Itm(nn.Module):
        def __init__(self, constant=None):
            super().__init__()
            self.constant = constant

        def match_score(self, matched):
            return torch.full_like(matched, self.constant) if self.constant is not None else matched

    class Pre(nn.Module):
        def __init__(self, itm):
            super().__init__()
            self.model, self.objectives = Model(), nn.ModuleDict({"itm": itm})

        def scorer(self):
            return self.objectives["itm"]

    assert itm_accuracy(Pre(Itm()), pairs, batch_size=4) == 1.0
    assert itm_accuracy(Pre(Itm(constant=0.9)), pairs, batch_size=5) == 0.5
    assert itm_accuracy(Pre(Itm()), pairs, limit=7) == 1.0


def test_every_verdict_line_shows_its_test_direction_sign_flip_and_basis(tmp_path):
    """results.md (claims table and Verdicts list), results.json and the text compare-report prints: the test, its
    direction or margin, the per-seed differences, the sign-flip p with its floor, and parametric-only decisions."""
    recs = records({("x", "pretrained"): 0.06, ("x", "scratch"): 0.0, ("z", "pretrained"): 0.0})
    claims = [{"claim": "x beats its scratch", "a": "x", "b": "x/scratch", "metric": "vqa", "expect": "higher"},
              {"claim": "z does not beat x", "a": "z", "b": "x", "metric": "vqa", "kind": "not_higher", "margin": 1.0}]
    cfg = {"compare": {"title": "t", "seeds": [0, 1, 2, 3, 4], "budget": {"pretrain_steps": 1}, "claims": claims},
           "data": {"name": "d"}}
    account = {"sessions": [], "wall_s": 1.0, "unit_s": 1.0, "wasted_unit_s": 0.0, "attempts": 1, "died": 0,
               "failed": 0, "device_hours": 1 / 3600, "wasted_device_hours": 0.0, "mfu": None, "units": {},
               "plan": {"device": "cpu", "mfu": 0.3, "mfu_source": "s", "flops": 1e9, "device_hours": 0.001}}
    printed = write_outputs(tmp_path, cfg, recs, {"data_hash": "0" * 12}, {}, account)
    md = (tmp_path / "results.md").read_text()
    for text in (md, printed):
        assert "| one-sided paired t: a > b |" in text and "| one-sided paired t: a < b + 1 |" in text
        assert "0.031 (0.031: cannot reach the level)" in text  # 5 seeds: 2^-5 against 0.05 / 2
        assert "**reproduced** (decided under normality)" in text and "sign-flip p (smallest possible)" in text
    assert ("- Claim: x beats its scratch: **reproduced** (one-sided paired t, a > b; p " in md
            and "decided under normality: parametric-only)" in md)
    data = json.loads((tmp_path / "results.json").read_text())
    first = data["claims"][0]
    assert first["test"] == "one-sided paired t" and first["direction"] == "a > b" and len(first["differences"]) == 5
    assert first["rule"]["sign_flip_p"] == 1 / 32 and first["rule"]["parametric_only"] is True
