"""Where a finished comparison's unit time went: training steps against everything else (model building, the
first unit's data building in each worker, evaluation, saving, garbage collection), per kind of unit.

    python benchmarks/unit_time.py OUTPUT_DIR                      # a `vlkit compare` output folder
    python benchmarks/unit_time.py OUTPUT_DIR --tag after          # writes results/unit_time_after.json

A unit's wall time is the ``wall_s`` its record holds; its step time is the sum of the trainer's ``step_s``
(batch fetching, forward, backward and optimizer) over its ``metrics.jsonl``. Prints a table, writes
benchmarks/results/unit_time[_<tag>].json.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def unit_times(output_dir: Path) -> list[dict]:
    """One row per finished unit: its kind (``pretrain`` or the task), wall and step seconds."""
    rows = []
    for record in sorted(output_dir.glob("runs/*/seed*/*/unit.json")):
        result = json.loads(record.read_text()).get("result") or {}
        if "wall_s" not in result:
            continue  # not finished
        metrics = record.parent / "metrics.jsonl"
        steps = [json.loads(line)["step_s"] for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        rows.append({"unit": str(record.parent.relative_to(output_dir / "runs")),
                     "kind": record.parent.name.split("-")[-1], "wall_s": result["wall_s"], "step_s": sum(steps),
                     "steps": len(steps)})
    return rows


def by_kind(rows: list[dict]) -> dict[str, dict]:
    kinds = defaultdict(list)
    for row in rows:
        kinds[row["kind"]].append(row)
    return {kind: {"units": len(rs), "wall_s": sum(r["wall_s"] for r in rs), "step_s": sum(r["step_s"] for r in rs),
                   "other_s": sum(r["wall_s"] - r["step_s"] for r in rs),
                   "median_other_s": statistics.median(r["wall_s"] - r["step_s"] for r in rs)}
            for kind, rs in sorted(kinds.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir", type=Path, help="a finished `vlkit compare` output folder")
    parser.add_argument("--tag", default="", help="suffix of the JSON file")
    args = parser.parse_args()
    rows = unit_times(args.output_dir)
    if not rows:
        raise SystemExit(f"{args.output_dir}: no finished unit (runs/*/seed*/*/unit.json with a result)")
    kinds = by_kind(rows)
    total = {key: sum(k[key] for k in kinds.values()) for key in ("units", "wall_s", "step_s", "other_s")}
    print("| kind | units | unit wall s | step s | other s | median other s/unit |")
    print("|---|---|---|---|---|---|")
    for kind, k in [*kinds.items(), ("all", total)]:
        median = f"{k['median_other_s']:.1f}" if "median_other_s" in k else "–"
        print(f"| {kind} | {k['units']} | {k['wall_s']:.0f} | {k['step_s']:.0f} | {k['other_s']:.0f} | {median} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "unit_time" + (f"_{args.tag}" if args.tag else "") + ".json"
    (RESULTS / name).write_text(json.dumps({"kinds": kinds, "total": total, "units": rows}, indent=2))


if __name__ == "__main__":
    main()
