"""What a comparison's finished units give: the state of every unit read from its folder (`unit_states`), the
results of the finished ones, and the records the report shows (`collect`: one per run, variant and seed)."""
from __future__ import annotations

from typing import Any

from vlkit.compare.comparison import Comparison
from vlkit.compare.config import mix_label
from vlkit.compare.statistics import machine_summary
from vlkit.compare.units import Unit, UnitFolder, digest, status

POINTS = 100.0  # a record holds every metric as a fraction (Meta-Sum too); tables and plots show points
UNITS = "fraction"  # named in results.json and results.csv


def unit_states(comparison: Comparison) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(key, status, state) of every unit of the comparison, in start order (see `units.status`; a unit that
    never started because the unit it depends on did not finish is ``skipped``)."""
    out, seen = [], {}
    for unit in comparison.all_units():  # a unit comes after the one it depends on
        key = comparison.key(unit)
        state = UnitFolder(comparison.unit_dir(unit), key).read()
        seen[key] = status(state, comparison.unit_hash(unit))
        parent = unit.depends_on() and comparison.key(unit.depends_on())
        if seen[key] == "missing" and parent and seen[parent] in ("failed", "died", "skipped"):
            seen[key], state = "skipped", {"error": f"after {parent}"}
        out.append((key, seen[key], state))
    return out


def finished_results(comparison: Comparison, states: list | None = None) -> dict[Any, dict[str, Any]]:
    """Unit -> result of every finished unit (``states``: `unit_states`, read here when not given)."""
    states = unit_states(comparison) if states is None else states
    return {u: s["result"] for u, (_, st, s) in zip(comparison.all_units(), states) if st == "finished"}


def finished_records(comparison: Comparison) -> list[dict[str, Any]]:
    """The records of the comparison's finished units (`collect`)."""
    done = finished_results(comparison)
    return collect(comparison, done)[0] if done else []


def collect(comparison: Comparison, done: dict[Unit, dict[str, Any]]
            ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(records, audit, curves) from the results of the finished units: one record per (run, variant,
    seed) in report order with what its finished units give (none: no record)."""
    records: list[dict[str, Any]] = []
    audit: dict[str, Any] = {"pretrain_ids": {}, "finetune_ids": {}, "data": {}}
    curves: dict[str, list[dict[str, Any]]] = {}
    for seed in comparison.all_seeds():
        for i, spec in enumerate(comparison.specs):
            if seed not in comparison.seeds_of(i):
                continue
            for variant in comparison.variants(spec):
                pre = done.get(Unit(i, seed)) if variant == "pretrained" else None
                parts = ([pre] if pre else []) + [done[u] for u in comparison.finetune_units(i, seed, variant) if u in done]
                if not parts:
                    continue
                record: dict[str, Any] = {
                    "run": spec.name, "variant": variant, "family": spec.family,
                    "preset": spec.model.get("preset"), "objectives": mix_label(spec) if variant == "pretrained" else None,
                    "mix": spec.mix if variant == "pretrained" else None, "seed": seed, **(pre["stats"] if pre else {})}
                if pre:
                    audit["pretrain_ids"][f"{spec.name}/seed{seed}"] = pre["ids"]
                    curves[f"{spec.name}/seed{seed}"] = pre["curve"]
                for part in parts:
                    record.update(part["metrics"])
                    audit["data"].update(part["data"])
                    audit["finetune_ids"].update(part.get("finetune_ids", {}))
                    for key in ("params", "latency_ms"):
                        if key in part:
                            record[key] = part[key]
                record.update({f"{p['task']}_wall_s": p["wall_s"] for p in parts if "task" in p})
                record["wall_s"] = sum(p["wall_s"] for p in parts)
                record["meta_sum"] = _meta_sum(record)
                records.append(record)
    audit["data_hash"] = digest(sorted(audit["data"].items()))
    audit["machine"] = machine_summary([r["machine"] for r in done.values() if "machine" in r])
    return records, audit, curves


def _meta_sum(metrics: dict[str, float]) -> float:
    """UNITER's Meta-Sum (VQA + IR R@1 + TR R@1 + NLVR2 + RefExp), a fraction sum like every record metric
    (the report shows it in points); NaN when one is missing."""
    keys = ("vqa", "ir_r1", "tr_r1", "nlvr2", "refexp")
    if not all(k in metrics for k in keys):
        return float("nan")
    return sum(metrics[k] for k in keys)
