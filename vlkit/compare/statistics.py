"""Statistics over seeds: mean and t confidence interval, paired t-test, and the per-(run, variant)
summary of the records."""
from __future__ import annotations

import math
from typing import Any, Sequence

# Metrics the tables show first, in this order (anything else follows alphabetically).
HEADLINE = ("vqa", "ir_r1", "tr_r1", "zs_ir_r1", "zs_tr_r1", "refexp", "nlvr2", "snli_ve", "meta_sum")
COSTS = ("params", "train_samples_per_s", "latency_ms", "wall_s")


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its t-distribution confidence interval (0 for a single value)."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n))


def paired_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided paired t-test over seeds; NaN (not significant) when it cannot be computed: fewer than
    two seeds, or differences without spread (the t statistic is undefined, not infinitely sure)."""
    from scipy import stats

    if len(a) != len(b) or len(a) < 2:
        return float("nan")
    diffs = [x - y for x, y in zip(a, b)]
    if all(d == diffs[0] for d in diffs):
        return float("nan")
    return float(stats.ttest_rel(a, b).pvalue)


def metric_columns(records: list[dict[str, Any]]) -> list[str]:
    """Every numeric field of the records but the bookkeeping ones, headline metrics first."""
    numeric = {k for r in records for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    numeric -= {"seed", "pretrain_wall_s", *COSTS}
    head = [k for k in HEADLINE if k in numeric]
    return head + sorted(numeric - set(head))


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (run, variant): mean ± CI of every metric and, for pre-trained runs, whether the
    difference to the same model without pre-training is significant (paired t-test over seeds)."""
    rows = []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["run"], r["variant"]), []).append(r)
    columns = metric_columns(records) + list(COSTS)
    for (run, variant), group in groups.items():
        group = sorted(group, key=lambda r: r["seed"])
        row: dict[str, Any] = {"run": run, "variant": variant, "family": group[0]["family"],
                               "preset": group[0]["preset"], "objectives": group[0]["objectives"],
                               "seeds": [r["seed"] for r in group]}
        baseline = sorted(groups.get((run, "scratch"), []), key=lambda r: r["seed"]) if variant == "pretrained" else []
        for col in columns:
            values = [r[col] for r in group if isinstance(r.get(col), (int, float)) and not math.isnan(r[col])]
            if not values:
                continue
            mean, ci = mean_ci(values)
            row[col] = {"mean": mean, "ci95": ci, "n": len(values)}
            base = [r[col] for r in baseline if isinstance(r.get(col), (int, float)) and not math.isnan(r[col])]
            if base and len(base) == len(values):
                row[col]["vs_scratch_p"] = paired_p_value(values, base)
        rows.append(row)
    return rows
