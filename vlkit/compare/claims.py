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
not shown by a test that fails to reject).
"""
from __future__ import annotations

from typing import Any

from vlkit.compare.statistics import ALPHA, _finite, holm, paired_test

EXPECTATIONS = ("higher", "not_higher")
CLAIM_KEYS = {"claim", "a", "b", "metric", "expect", "paper"}


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
        if c["expect"] not in EXPECTATIONS:
            raise ValueError(f"compare.claims {c['claim']!r}: expect must be one of {EXPECTATIONS}, not {c['expect']!r}")
        for side in ("a", "b"):
            run, _, variant = str(c[side]).partition("/")
            if run not in runs or variant not in ("", "pretrained", "scratch"):
                raise KeyError(f"compare.claims {c['claim']!r}: {side}={c[side]!r} is not a run of this comparison "
                               f"({', '.join(runs)}; add /scratch for a baseline)")


def evaluate_claims(records: list[dict[str, Any]], claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each claim with its paired test (a - b over the seeds both have), Holm over the claims, and a verdict."""
    out = []
    for c in claims:
        a, b = _rows(records, c["a"]), _rows(records, c["b"])
        va = {r["seed"]: r.get(c["metric"]) for r in a}
        vb = {r["seed"]: r.get(c["metric"]) for r in b}
        seeds = [s for s in va if s in vb and _finite([va[s], vb[s]]) == [va[s], vb[s]]]
        entry = {**c, "seeds": seeds}
        if len(seeds) >= 2:
            entry.update(paired_test([va[s] for s in seeds], [vb[s] for s in seeds]))
        else:
            entry.update(effect=float("nan"), ci95=float("nan"), p=float("nan"), n=len(seeds))
        out.append(entry)
    for entry, p in zip(out, holm([e["p"] for e in out])):
        entry["p_holm"] = p
        significant = p < ALPHA
        up = entry["effect"] > 0
        if not significant:
            entry["verdict"] = "inconclusive"
        elif entry["expect"] == "higher":
            entry["verdict"] = "reproduced" if up else "contradicted"
        else:
            entry["verdict"] = "contradicted" if up else "reproduced"
    return out


__all__ = ["EXPECTATIONS", "check_claims", "evaluate_claims"]
