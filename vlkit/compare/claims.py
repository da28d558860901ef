"""The papers' claims as pre-registered one-sided tests: each claim compares two (run, variant) rows of a comparison
on one metric and gets a verdict, **reproduced**, **contradicted**, **inconclusive** or **running**.

A claim in ``compare.claims`` (``conf/compare/claims.yaml``)::

    - {claim: "UNITER Table 2: MLM + ITM beats MLM alone", a: uniter-mlm-itm, b: uniter-mlm,
       metric: meta_sum, expect: higher, paper: "393.04 vs ~345 Meta-Sum"}
    - {claim: "METER: in-batch MIM does not help", a: meter-mim-inbatch, b: meter, metric: vqa,
       kind: not_higher, margin: 1.0}

``a`` / ``b`` name runs (``run`` is its pre-trained variant, ``run/scratch`` its baseline). A claim is either a
superiority claim with its direction, ``expect: higher`` (a beats b) or ``lower``, or a claim of no gain:
``kind: not_higher`` (a is not above b by ``margin`` points or more: non-superiority) or ``kind: equivalent``
(a within ``margin`` points of b either way: TOST). Each claim is tested one-sided in its stated direction with
its whole share of ``compare.alpha`` (`vlkit.stats.sequential.hypothesis_test`); **reproduced** when that test
decides. **contradicted** only for a claim that pre-registers ``contradict: true``: the opposite one-sided test
(``higher``: a below b; ``not_higher``: a above b by more than the margin) is then a hypothesis of its own with its
own share of ``alpha``. Otherwise a claim that is not decided is inconclusive, whatever the sign of its effect.
Every decision needs the t-test and, where the sign-flip test could reach the level, the sign-flip test
(`vlkit.stats.sequential.decides`). ``paper_effect`` (optional): the paper's own ``a - b`` in points, against which
the report sizes the seeds a claim needs; ``planning_sd`` (optional): the SD of the per-seed differences (points) the
dry run of ``compare.until=decided`` assumes for its expected cost at the paper effects.

Fixed comparisons test once, at the seeds both runs have, Holm over the claims' hypotheses; with
``compare.until=decided`` the group-sequential rule decides (`verdicts` with the looks): a claim is decided at the first
look that crosses its boundary, and stays ``running`` while its runs wait for seeds.
"""
from __future__ import annotations

import math
from typing import Any

from vlkit.compare.records import POINTS  # records hold fractions; claims' paper effects and margins are in points
from vlkit.stats.paired import ALPHA, POWER, finite, holm, paired_test
from vlkit.stats.sequential import KINDS, OPPOSITE, hypothesis_test, seeds_for_power, sequential_claims

EXPECTATIONS = ("higher", "lower")
CLAIM_KINDS = ("superiority", "not_higher", "equivalent")
CLAIM_KEYS = {"claim", "a", "b", "metric", "expect", "kind", "margin", "contradict", "paper", "paper_effect",
              "planning_sd"}


def _rows(records: list[dict[str, Any]], ref: str) -> list[dict[str, Any]]:
    run, _, variant = ref.partition("/")
    return sorted((r for r in records if r["run"] == run and r["variant"] == (variant or "pretrained")),
                  key=lambda r: r["seed"])


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def kind_of(claim: dict[str, Any]) -> str:
    """The claim's test (`vlkit.stats.sequential.KINDS`): its ``expect`` for a superiority claim, else its kind."""
    kind = claim.get("kind") or "superiority"
    return claim["expect"] if kind == "superiority" else kind


def check_claims(claims: list[dict[str, Any]], runs: list[str]) -> None:
    """Refuse a malformed claim (unknown key, run, expectation, kind, margin) before anything runs."""
    names = [c.get("claim") for c in claims]
    for c in claims:
        where = f"compare.claims {c.get('claim', c)!r}"
        unknown = set(c) - CLAIM_KEYS
        missing = {"claim", "a", "b", "metric"} - set(c)
        if unknown or missing:
            raise KeyError(f"{where}: unknown key(s) {sorted(unknown)}, missing {sorted(missing)}; keys: "
                           f"{sorted(CLAIM_KEYS)}")
        if names.count(c["claim"]) > 1:
            raise ValueError(f"{where}: two claims have this name; each claim is pre-registered by its name")
        effect = c.get("paper_effect")
        if effect is not None and not _number(effect):
            raise ValueError(f"{where}: paper_effect={effect!r} is not a number (points, a - b)")
        sd = c.get("planning_sd")
        if sd is not None and not (_number(sd) and sd > 0):
            raise ValueError(f"{where}: planning_sd={sd!r} is not a positive number (points)")
        kind = c.get("kind") or "superiority"
        if kind not in CLAIM_KINDS:
            raise ValueError(f"{where}: kind must be one of {CLAIM_KINDS}, not {kind!r}")
        if c.get("expect") == "not_higher":
            raise ValueError(f"{where}: expect: not_higher is now kind: not_higher with a margin (points): a claim "
                             "of no gain is decided by a non-superiority test, not by a significant drop")
        if kind == "superiority":
            if c.get("expect") not in EXPECTATIONS:
                raise ValueError(f"{where}: expect must be one of {EXPECTATIONS}, not {c.get('expect')!r}")
            if "margin" in c:
                raise ValueError(f"{where}: margin belongs to kind: not_higher or equivalent, not to a superiority "
                                 "claim")
        else:
            if "expect" in c:
                raise ValueError(f"{where}: kind: {kind} states its own direction; drop expect")
            if not (_number(c.get("margin")) and c["margin"] > 0):
                raise ValueError(f"{where}: kind: {kind} needs margin: a positive number of points, not "
                                 f"{c.get('margin')!r}")
        if not isinstance(c.get("contradict", False), bool):
            raise ValueError(f"{where}: contradict must be true or false, not {c['contradict']!r}")
        if c.get("contradict") and kind_of(c) not in OPPOSITE:
            raise ValueError(f"{where}: contradict: true is not available for kind: {kind}")
        for side in ("a", "b"):
            run, _, variant = str(c[side]).partition("/")
            if run not in runs or variant not in ("", "pretrained", "scratch"):
                raise KeyError(f"{where}: {side}={c[side]!r} is not a run of this comparison "
                               f"({', '.join(runs)}; add /scratch for a baseline)")


def direction(claim: dict[str, Any]) -> str:
    """The pre-registered hypothesis in words: ``a > b``, ``a < b``, ``a < b + 1.0``, ``|a - b| < 1.0`` (points)."""
    kind, margin = kind_of(claim), claim.get("margin")
    if kind in ("higher", "lower"):
        return "a > b" if kind == "higher" else "a < b"
    return f"a < b + {margin:g}" if kind == "not_higher" else f"|a − b| < {margin:g}"


def test_of(claim: dict[str, Any]) -> str:
    """The test that decides the claim: one-sided paired t (+ sign-flip), or TOST for an equivalence claim."""
    kind = kind_of(claim)
    name = "TOST paired t" if kind == "equivalent" else "one-sided paired t"
    return name + (" (+ contradiction test)" if claim.get("contradict") else "")


def claim_values(records: list[dict[str, Any]], claim: dict[str, Any]) -> tuple[list[int], list[float], list[float]]:
    """(seeds, a's values, b's values) of a claim's metric over the seeds both sides have, in seed order."""
    va = {r["seed"]: r.get(claim["metric"]) for r in _rows(records, claim["a"])}
    vb = {r["seed"]: r.get(claim["metric"]) for r in _rows(records, claim["b"])}
    seeds = [s for s in sorted(va) if s in vb and finite([va[s], vb[s]]) == [va[s], vb[s]]]
    return seeds, [float(va[s]) for s in seeds], [float(vb[s]) for s in seeds]


def _verdict(rule: dict[str, Any]) -> str:
    if rule["state"] != "decided":
        return rule["state"]
    return "reproduced" if rule["direction"] > 0 else "contradicted"


def verdicts(records: list[dict[str, Any]], claims: list[dict[str, Any]], sizes: list[int] | None = None,
             alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Each claim with its paired statistics (a - b over the seeds both have: effect, CI, SD, the per-seed
    ``differences``), its test and direction, and the rule's verdict: ``sizes`` the looks of ``compare.until=decided``
    (the group-sequential rule), None for a fixed comparison (one look at the seeds there are: Holm). ``rule`` holds
    the look, seeds, p, sign-flip p and the boundary's level at the decision (`vlkit.stats.sequential`), and in a
    fixed comparison ``holm_p``, the claim's Holm-adjusted p (`holm_ps`)."""
    out, diffs = [], []
    for c in claims:
        seeds, a, b = claim_values(records, c)
        d = [x - y for x, y in zip(a, b)]
        entry = {**c, "seeds": seeds, "differences": d, "test": test_of(c), "direction": direction(c)}
        entry.update(paired_test(a, b) if len(seeds) >= 2 else
                     {"effect": float("nan"), "ci95": float("nan"), "sd": float("nan"), "n": len(seeds)})
        entry.pop("p", None)  # the two-sided p is no claim's test: the rule's p is
        out.append(entry)
        diffs.append(d)
    rules = sequential_claims(diffs, sizes, alpha, [kind_of(c) for c in claims],
                              [(c.get("margin") or 0.0) / POINTS for c in claims],
                              [bool(c.get("contradict")) for c in claims])
    for entry, rule in zip(out, rules):
        entry["rule"] = rule
        entry["verdict"] = _verdict(rule)
    if sizes is None:
        for entry, adjusted in zip(out, holm_ps(out, claims)):
            entry["rule"]["holm_p"] = adjusted
    return out


def holm_ps(entries: list[dict[str, Any]], claims: list[dict[str, Any]]) -> list[float]:
    """Each claim's Holm-adjusted p in a fixed comparison (one look): Holm over every hypothesis of the family (a
    claim's ``contradict`` test is one of its own), given for the hypothesis its ``rule`` reports (the contradiction
    test's for a contradicted claim): the smallest family-wise level at which Holm's t-tests decide it."""
    tests = [(i, False) for i in range(len(claims))] + [(i, True) for i, c in enumerate(claims) if c.get("contradict")]
    ps = [hypothesis_test(entries[i]["differences"], kind_of(claims[i]), (claims[i].get("margin") or 0.0) / POINTS,
                          opposite)["p"] for i, opposite in tests]
    adjusted = dict(zip(tests, holm(ps)))
    return [adjusted[(i, e["rule"]["direction"] < 0)] for i, e in enumerate(entries)]


def claim_runs(claim: dict[str, Any]) -> set[str]:
    """The runs a claim reads (``uniter/scratch`` reads run ``uniter``)."""
    return {str(claim[side]).partition("/")[0] for side in ("a", "b")}


def claim_effect(claim: dict[str, Any], effect: float) -> float:
    """A true ``a - b`` as the distance its claim's one-sided test must detect (TOST: the nearer side)."""
    sign_shifts = KINDS[kind_of(claim)]
    margin = (claim.get("margin") or 0.0) / POINTS
    return min(sign * (effect - shift * margin) for sign, shift in sign_shifts)


def seeds_needed(entries: list[dict[str, Any]], seed_hours: dict[str, float], alpha: float = ALPHA
                 ) -> list[dict[str, Any]]:
    """Per claim: the seeds a fixed one-sided paired t-test needs for 80% power at Holm's strictest level
    (alpha / number of claims), at the paper's effect (``paper_effect``, points) and at the observed one, both with
    the observed SD of the paired differences, and what those seeds cost: ``seed_hours`` gives each run's
    device-hours per seed (`vlkit.compare.costs`)."""
    level = alpha / max(1, len(entries))
    out = []
    for e in entries:
        sd = e.get("sd", float("nan"))
        paper = e.get("paper_effect")
        per_seed = sum(seed_hours.get(run, float("nan")) for run in claim_runs(e))
        row = {"claim": e["claim"], "metric": e["metric"], "n": e.get("n", 0), "effect": e["effect"], "sd": sd,
               "level": level, "paper_effect": None if paper is None else paper / POINTS, "hours_per_seed": per_seed}
        for name, effect in (("paper", row["paper_effect"]), ("observed", e["effect"])):
            n = seeds_for_power(claim_effect(e, effect), sd, level, POWER, sides=1) \
                if effect is not None and math.isfinite(sd) and math.isfinite(effect) else None
            row[f"seeds_{name}"] = n
            row[f"hours_{name}"] = n * per_seed if n is not None else None
        out.append(row)
    return out


__all__ = ["CLAIM_KINDS", "EXPECTATIONS", "check_claims", "claim_effect", "claim_runs", "claim_values", "direction",
           "holm_ps", "kind_of", "seeds_needed", "test_of", "verdicts"]
