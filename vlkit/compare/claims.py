"""The papers' claims as paired tests: each claim compares two (run, variant) rows of a comparison on one
metric and gets a verdict, **reproduced**, **contradicted** or **inconclusive**.

A claim in ``compare.claims`` (``conf/compare/claims.yaml``)::

    - {claim: "UNITER Table 2: MLM + ITM beats MLM alone", a: uniter-mlm-itm, b: uniter-mlm,
       metric: meta_sum, expect: higher, paper: "393.04 vs ~345 Meta-Sum"}

``a`` / ``b`` name runs (``run`` is its pre-trained variant, ``run/scratch`` its baseline); ``expect``:
``higher`` (a beats b) or ``not_higher`` (a does not beat b, e.g. METER's "MIM does not help"). A claim
is reproduced when the Holm-corrected paired test agrees in direction (``higher``: a significantly
above b; ``not_higher``: a significantly below b), contradicted when it is significant the other way,
and inconclusive otherwise (for ``not_higher`` the report gives the effect's CI: "no difference" is
not shown by a test that fails to reject). ``paper_effect`` (optional): the paper's own ``a - b`` in points,
against which the report sizes the seeds a claim needs.

With ``compare.until=decided`` the verdicts come from the group-sequential rule instead
(`sequential_verdicts`, `vlkit.compare.sequential`): a claim is decided at the first look that crosses its
boundary, and stays ``running`` while its runs wait for seeds.
"""
from __future__ import annotations

from typing import Any

import math

from vlkit.compare.statistics import ALPHA, POWER, _finite, holm, paired_test

EXPECTATIONS = ("higher", "not_higher")
CLAIM_KEYS = {"claim", "a", "b", "metric", "expect", "paper", "paper_effect"}
POINTS = 100.0  # records hold fractions; claims' paper effects are in points


def _rows(records: list[dict[str, Any]], ref: str) -> list[dict[str, Any]]:
    run, _, variant = ref.partition("/")
    return sorted((r for r in records if r["run"] == run and r["variant"] == (variant or "pretrained")),
                  key=lambda r: r["seed"])


def check_claims(claims: list[dict[str, Any]], runs: list[str]) -> None:
    """Refuse a malformed claim (unknown key, run, expectation) before anything runs."""
    for c in claims:
        unknown = set(c) - CLAIM_KEYS
        missing = {"claim", "a", "b", "metric", "expect"} - set(c)
        if unknown or missing:
            raise KeyError(f"compare.claims {c.get('claim', c)!r}: unknown key(s) {sorted(unknown)}, missing "
                           f"{sorted(missing)}; keys: {sorted(CLAIM_KEYS)}")
        effect = c.get("paper_effect")
        if effect is not None and (not isinstance(effect, (int, float)) or isinstance(effect, bool)
                                   or not math.isfinite(effect)):
            raise ValueError(f"compare.claims {c['claim']!r}: paper_effect={effect!r} is not a number (points, a - b)")
        if c["expect"] not in EXPECTATIONS:
            raise ValueError(f"compare.claims {c['claim']!r}: expect must be one of {EXPECTATIONS}, not {c['expect']!r}")
        for side in ("a", "b"):
            run, _, variant = str(c[side]).partition("/")
            if run not in runs or variant not in ("", "pretrained", "scratch"):
                raise KeyError(f"compare.claims {c['claim']!r}: {side}={c[side]!r} is not a run of this comparison "
                               f"({', '.join(runs)}; add /scratch for a baseline)")


def claim_values(records: list[dict[str, Any]], claim: dict[str, Any]) -> tuple[list[int], list[float], list[float]]:
    """(seeds, a's values, b's values) of a claim's metric over the seeds both sides have, in seed order."""
    va = {r["seed"]: r.get(claim["metric"]) for r in _rows(records, claim["a"])}
    vb = {r["seed"]: r.get(claim["metric"]) for r in _rows(records, claim["b"])}
    seeds = [s for s in sorted(va) if s in vb and _finite([va[s], vb[s]]) == [va[s], vb[s]]]
    return seeds, [float(va[s]) for s in seeds], [float(vb[s]) for s in seeds]


def _verdict(expect: str, up: bool) -> str:
    return "reproduced" if up == (expect == "higher") else "contradicted"


def evaluate_claims(records: list[dict[str, Any]], claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each claim with its paired test (a - b over the seeds both have), Holm over the claims, and a verdict."""
    out = []
    for c in claims:
        seeds, a, b = claim_values(records, c)
        entry = {**c, "seeds": seeds}
        if len(seeds) >= 2:
            entry.update(paired_test(a, b))
        else:
            entry.update(effect=float("nan"), ci95=float("nan"), sd=float("nan"), p=float("nan"), n=len(seeds))
        out.append(entry)
    for entry, p in zip(out, holm([e["p"] for e in out])):
        entry["p_holm"] = p
        entry["verdict"] = _verdict(entry["expect"], entry["effect"] > 0) if p < ALPHA else "inconclusive"
    return out


def sequential_verdicts(records: list[dict[str, Any]], claims: list[dict[str, Any]], sizes: list[int]
                        ) -> list[dict[str, Any]]:
    """`evaluate_claims`'s entries with the group-sequential rule's verdict over the looks ``sizes``
    (`vlkit.compare.sequential.sequential_claims`): ``sequential`` holds the look, seeds, p and the boundary's
    level at the decision; the verdict is ``running`` while a claim waits for seeds."""
    from vlkit.compare.sequential import sequential_claims

    out = evaluate_claims(records, claims)
    diffs = [[x - y for x, y in zip(*claim_values(records, c)[1:])] for c in claims]
    for entry, rule in zip(out, sequential_claims(diffs, sizes, ALPHA)):
        entry["sequential"] = rule
        entry["verdict"] = _verdict(entry["expect"], rule["direction"] > 0) if rule["state"] == "decided" \
            else rule["state"]
    return out


def claim_runs(claim: dict[str, Any]) -> set[str]:
    """The runs a claim reads (``uniter/scratch`` reads run ``uniter``)."""
    return {str(claim[side]).partition("/")[0] for side in ("a", "b")}


def seeds_needed(entries: list[dict[str, Any]], seed_hours: dict[str, float]) -> list[dict[str, Any]]:
    """Per claim: the seeds a fixed two-sided paired t-test needs for 80% power at Holm's strictest level
    (alpha / number of claims), at the paper's effect (``paper_effect``, points) and at the observed one, both with
    the observed SD of the paired differences, and what those seeds cost: ``seed_hours`` gives each run's
    device-hours per seed (`vlkit.compare.costs`)."""
    from vlkit.compare.sequential import seeds_for_power

    level = ALPHA / max(1, len(entries))
    out = []
    for e in entries:
        sd = e.get("sd", float("nan"))
        paper = e.get("paper_effect")
        per_seed = sum(seed_hours.get(run, float("nan")) for run in claim_runs(e))
        row = {"claim": e["claim"], "metric": e["metric"], "n": e.get("n", 0), "effect": e["effect"], "sd": sd,
               "level": level, "paper_effect": None if paper is None else paper / POINTS, "hours_per_seed": per_seed}
        for name, effect in (("paper", None if paper is None else paper / POINTS), ("observed", e["effect"])):
            n = seeds_for_power(effect, sd, level, POWER) if effect is not None and math.isfinite(sd) else None
            row[f"seeds_{name}"] = n
            row[f"hours_{name}"] = n * per_seed if n is not None else None
        out.append(row)
    return out


__all__ = ["EXPECTATIONS", "check_claims", "claim_runs", "claim_values", "evaluate_claims", "seeds_needed",
           "sequential_verdicts"]
