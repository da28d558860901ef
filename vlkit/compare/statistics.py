"""A comparison's tables over seeds: per (run, variant) means with t confidence intervals, paired t-tests
(pre-trained vs scratch, and every pair of contestants) Holm-corrected over a table, detectable effects, chance
levels; the tests themselves are `vlkit.stats`."""
from __future__ import annotations

import math
import statistics
from itertools import combinations
from typing import Any, Sequence

from vlkit.stats.paired import ALPHA, finite, holm, mean_ci, min_detectable_effect, paired_test

# Metrics the tables show first, in this order (anything else follows alphabetically).
HEADLINE = ("itm_acc", "vqa", "ir_r1", "tr_r1", "zs_ir_r1", "zs_tr_r1", "refexp", "nlvr2", "snli_ve", "meta_sum")
COSTS = ("params", "train_samples_per_s", "latency_ms", "wall_s")
VQA_ANSWER_TYPES = ("vqa_yes_no", "vqa_number", "vqa_other")


def baseline_key(metric: str, baseline: str = "blind") -> str:
    """The record key of a VQA answer type's question-only baseline: ``vqa_yes_no`` -> ``vqa_blind_yes_no``."""
    return metric.replace("vqa_", f"vqa_{baseline}_", 1)


# record keys holding a metric's chance / trivial-baseline level on the evaluation set: metric -> key
# (VQA: the question-only model, overall and per answer type)
CHANCE_KEYS = {"vqa": "vqa_blind_baseline", **{m: baseline_key(m) for m in VQA_ANSWER_TYPES},
               "refexp": "refexp_random_box", "nlvr2": "nlvr2_majority_baseline",
               "snli_ve": "snli_ve_majority_baseline", "ir_r1": "ir_r1_chance", "tr_r1": "tr_r1_chance",
               "zs_ir_r1": "zs_ir_r1_chance", "zs_tr_r1": "zs_tr_r1_chance", "itm_acc": "itm_acc_chance"}
BOOKKEEPING = {"seed", "refexp_upper_bound", "vqa_majority_baseline", *COSTS, *CHANCE_KEYS.values()}
BASELINE_PREFIXES = ("vqa_blind_", "vqa_prior_")  # the question-only baselines per answer type (vlkit.tasks.vqa)


def is_bookkeeping(key: str) -> bool:
    """A record key that is no metric: seeds, costs, chance levels and baselines, per-stage wall times (``*_wall_s``)."""
    return key in BOOKKEEPING or key.endswith("_wall_s") or key.startswith(BASELINE_PREFIXES)
def metric_columns(records: list[dict[str, Any]]) -> list[str]:
    """Every numeric field of the records but bookkeeping and chance levels, headline metrics first."""
    numeric = {k for r in records for k, v in r.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and not is_bookkeeping(k)}
    head = [k for k in HEADLINE if k in numeric]
    return head + sorted(numeric - set(head))


def _groups(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["run"], r["variant"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in groups.items()}


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (run, variant): mean, 95% CI and n of every metric and cost (absent metrics are left out)."""
    rows = []
    columns = metric_columns(records) + list(COSTS)
    for (run, variant), group in _groups(records).items():
        row: dict[str, Any] = {"run": run, "variant": variant, "family": group[0]["family"],
                               "preset": group[0]["preset"], "objectives": group[0]["objectives"],
                               "seeds": [r["seed"] for r in group]}
        for col in columns:
            values = finite([r.get(col) for r in group])
            if values:
                mean, ci = mean_ci(values)
                row[col] = {"mean": mean, "ci95": ci, "n": len(values)}
        rows.append(row)
    return rows


def _paired(a: list[dict[str, Any]], b: list[dict[str, Any]], metric: str) -> tuple[list[float], list[float]]:
    """Values of ``metric`` in the seeds both groups have, in seed order."""
    va = {r["seed"]: r.get(metric) for r in a}
    vb = {r["seed"]: r.get(metric) for r in b}
    seeds = [s for s in sorted(va) if s in vb and finite([va[s]]) and finite([vb[s]])]
    return [float(va[s]) for s in seeds], [float(vb[s]) for s in seeds]


def _tests(pairs: list[tuple[str, str, list[dict], list[dict]]], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """Paired tests ``a - b`` for each (label, note, a, b) and metric, Holm-corrected over all of them."""
    out = []
    for label, kind, a, b in pairs:
        for metric in metrics:
            xa, xb = _paired(a, b, metric)
            if not xa:
                continue
            out.append({"comparison": label, "kind": kind, "metric": metric, **paired_test(xa, xb)})
    for t, p in zip(out, holm([t["p"] for t in out])):
        t["p_holm"] = p
        t["significant"] = bool(p < ALPHA)
    return out


def scratch_tests(records: list[dict[str, Any]], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """Pre-trained minus scratch of the same run, paired by seed, Holm over the table; a pre-trained run
    without a scratch baseline gets one ``no baseline`` entry."""
    groups = _groups(records)
    pairs, missing = [], []
    for (run, variant), group in groups.items():
        if variant != "pretrained":
            continue
        if (run, "scratch") in groups:
            pairs.append((run, "vs scratch", group, groups[(run, "scratch")]))
        else:
            missing.append({"comparison": run, "kind": "no baseline"})
    return _tests(pairs, metrics) + missing


def pairwise_tests(records: list[dict[str, Any]], metrics: Sequence[str], variant: str = "pretrained"
                   ) -> list[dict[str, Any]]:
    """Every pair of runs of ``variant`` (``a - b``, paired by seed), Holm over the table."""
    groups = {run: g for (run, v), g in _groups(records).items() if v == variant}
    pairs = [(f"{a} − {b}", variant, groups[a], groups[b]) for a, b in combinations(groups, 2)]
    return _tests(pairs, metrics)


def detectable_effects(tests: list[dict[str, Any]], n: int) -> dict[str, dict[str, float]]:
    """Per metric: the pooled SD of the tests' paired differences and the minimum detectable effect at
    ``n`` seeds (alpha 0.05, power 0.8), also at Holm's strictest level (alpha / number of tests)."""
    m = sum(1 for t in tests if "p" in t and not math.isnan(t["p"]))
    out: dict[str, dict[str, float]] = {}
    for metric in dict.fromkeys(t["metric"] for t in tests if "metric" in t):
        sds = [t["sd"] for t in tests if t.get("metric") == metric and math.isfinite(t.get("sd", float("nan")))]
        if not sds:
            continue
        sd = math.sqrt(sum(s * s for s in sds) / len(sds))
        out[metric] = {"sd": sd, "mde": min_detectable_effect(sd, n),
                       "mde_holm_strict": min_detectable_effect(sd, n, ALPHA / max(m, 1))}
    return out


def machine_summary(machines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The machine speed the units recorded (`vlkit.compare.worker.machine_speed`): their GEMM rate's median and
    range, threads, hosts and float kernels (older records lack them); None when no unit recorded one (units finished
    before vlkit recorded it)."""
    rates = sorted(m["gemm_gflops"] for m in machines)
    if not rates:
        return None
    return {"gemm_gflops": {"median": statistics.median(rates), "min": rates[0], "max": rates[-1]},
            "units": len(rates), "threads": sorted({m["threads"] for m in machines}),
            "hosts": sorted({m["host"] for m in machines}),
            "kernels": sorted({m["kernels"] for m in machines if "kernels" in m})}


def chance_levels(records: list[dict[str, Any]]) -> dict[str, float]:
    """Metric -> its chance or trivial-baseline level on the evaluation set (the same for every run);
    Meta-Sum's is the sum of its parts'."""
    out = {}
    for metric, key in CHANCE_KEYS.items():
        values = finite([r.get(key) for r in records])
        if values:
            out[metric] = values[0]
    parts = ("vqa", "ir_r1", "tr_r1", "nlvr2", "refexp")
    if all(p in out for p in parts):
        out["meta_sum"] = sum(out[p] for p in parts)
    return out


__all__ = ["BASELINE_PREFIXES", "CHANCE_KEYS", "COSTS", "HEADLINE", "VQA_ANSWER_TYPES", "baseline_key",
           "chance_levels", "detectable_effects", "metric_columns", "pairwise_tests", "scratch_tests", "summarize"]
