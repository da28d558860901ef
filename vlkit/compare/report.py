"""The report of a comparison: the markdown table with its notes, ``results.csv`` / ``results.json``."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from vlkit.compare.plots import plot_results
from vlkit.compare.statistics import COSTS, HEADLINE, summarize

BASELINES = ("vqa_majority_baseline", "refexp_random_box", "refexp_upper_bound", "nlvr2_majority_baseline",
             "snli_ve_majority_baseline")


def _cell(stat: dict[str, Any] | None, scale: float = 100.0) -> str:
    if not stat:
        return "–"
    mean, ci = stat["mean"] * scale, stat["ci95"] * scale
    text = f"{mean:.1f}" if math.isnan(ci) else f"{mean:.1f} ± {ci:.1f}"
    p = stat.get("vs_scratch_p")
    if p is not None and not (p < 0.05):
        text += " †"
    return text


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Headline metrics in points; costs as they are (parameters in millions)."""
    header = ["run", "variant"] + [{"train_samples_per_s": "train samples/s", "latency_ms": "latency ms/ex",
                                    "wall_s": "wall s"}.get(c, c) for c in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["run"], row["variant"]]
        for c in columns:
            if c == "params":
                cells.append(f"{row[c]['mean'] / 1e6:.2f}M" if c in row else "–")
            elif c in COSTS:
                cells.append(f"{row[c]['mean']:.1f}" if c in row else "–")
            else:
                cells.append(_cell(row.get(c), 1.0 if c == "meta_sum" else 100.0))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def baseline_note(records: list[dict[str, Any]]) -> str:
    """The data's trivial baselines (majority answer, random box ...), the same for every run."""
    parts = []
    for key in BASELINES:
        values = [r[key] for r in records if isinstance(r.get(key), float)]
        if values:
            parts.append(f"{key.replace('_', ' ')} {100 * values[0]:.1f}")
    return "Trivial baselines on this data: " + ", ".join(parts) + "." if parts else ""


def write_outputs(output_dir: Path, cfg: dict[str, Any], records: list[dict[str, Any]], audit: dict[str, Any],
                  curves: dict[str, list[dict[str, Any]]], wall: float) -> str:
    from vlkit.io import atomic_write_text

    rows = summarize(records)
    columns = [c for c in HEADLINE if any(c in r for r in rows)]
    table = markdown_table(rows, columns + [c for c in COSTS if any(c in r for r in rows)])
    seeds = cfg["compare"]["seeds"]
    notes = [f"# vlkit compare: {cfg['compare'].get('title', 'comparison')}", "",
             f"Data: `{cfg['data'].get('name')}` (hash `{audit['data_hash'][:12]}`), seeds {seeds}, "
             f"pre-training {cfg['compare']['budget']['pretrain_steps']} steps, wall time {wall:.0f} s.", "",
             "Metrics in points (mean ± 95% CI over seeds); `†`: not significantly different from the same model "
             "without pre-training (paired t-test over seeds, p ≥ 0.05, or fewer than 2 seeds). "
             "`zs_*`: zero-shot retrieval with the pre-training ITM head. `meta_sum`: UNITER's VQA + IR@1 + TR@1 + "
             "NLVR2 + RefExp (– where a task does not apply).", baseline_note(records), "", table, "",
             "Every metric of every run and seed: `results.csv` / `results.json`; plots: `metrics.png`, "
             "`loss_curves.png`, `wra_plan.png`.", ""]
    atomic_write_text(output_dir / "results.md", "\n".join(notes))
    atomic_write_text(output_dir / "results.json", json.dumps({"records": records, "summary": rows}, indent=2,
                                                               sort_keys=True, default=json_default))
    keys = sorted({k for r in records for k in r})
    with open(output_dir / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        for r in records:
            writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()})
    plot_results(output_dir, rows, columns, curves)
    return table


def json_default(value: Any) -> Any:
    """JSON for what ``json`` cannot write: NaN as null, anything else as its string."""
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)
