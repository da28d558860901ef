"""The analysis a comparison pre-registers at its first session: the claims (each with its direction, kind, margin and
contradiction test), ``compare.alpha``, ``compare.until``, ``compare.max_seeds``, ``compare.round_seeds``, the look
schedule and ``compare.max_device_hours``, frozen in ``plan.json`` (``preregistered``). Changing any of them after a
look voids the error guarantee (the spending and Holm's), so a resume that changes one is refused, naming it.
The budget's prices (`spend_factor`, `seeds_cost`): the plan's device-hours per seed, corrected by what the finished
units actually spent against what the plan gave them."""
from __future__ import annotations

import math
from typing import Any

from vlkit.compare.config import look_sizes_of
from vlkit.stats.paired import ALPHA

PREREGISTERED = ("compare.claims", "compare.alpha", "compare.until", "compare.max_seeds", "compare.round_seeds",
                 "compare.max_device_hours")
CLAIM_FIELDS = ("a", "b", "metric", "expect", "kind", "margin", "contradict")  # what a claim's test is


def alpha_of(compare: dict[str, Any]) -> float:
    """``compare.alpha``, checked: the family-wise error over the claims, in (0, 0.5]."""
    alpha = compare.get("alpha", ALPHA)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha <= 0.5:
        raise ValueError(f"compare.alpha={alpha!r}: the family-wise error over compare.claims, a number in (0, 0.5]")
    return float(alpha)


def max_device_hours(compare: dict[str, Any]) -> float | None:
    """``compare.max_device_hours``, checked: None (no budget) or a positive number of device-hours."""
    hours = compare.get("max_device_hours")
    if hours is not None and (not isinstance(hours, (int, float)) or isinstance(hours, bool)
                              or not math.isfinite(hours) or hours <= 0):
        raise ValueError(f"compare.max_device_hours={hours!r}: a positive number of device-hours, or null")
    return None if hours is None else float(hours)


def preregistration(compare: dict[str, Any]) -> dict[str, Any]:
    """The design as ``plan.json`` freezes it; every key checked (naming it) before any work."""
    claims = [{"claim": c.get("claim"), **{k: c.get(k) for k in CLAIM_FIELDS}} for c in compare.get("claims") or []]
    return {"claims": claims, "alpha": alpha_of(compare), "until": compare.get("until") or "fixed",
            "max_seeds": compare.get("max_seeds"), "round_seeds": compare.get("round_seeds"),
            "looks": look_sizes_of(compare), "max_device_hours": max_device_hours(compare)}


def _claim_changes(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[str]:
    old, new = {c["claim"]: c for c in before}, {c["claim"]: c for c in now}
    changes = [f"claim {name!r} dropped" for name in old if name not in new]
    changes += [f"claim {name!r} added" for name in new if name not in old]
    changes += [f"compare.claims[{name!r}].{k}: {old[name].get(k)!r} -> {c.get(k)!r}"
                for name, c in new.items() if name in old for k in CLAIM_FIELDS if old[name].get(k) != c.get(k)]
    return changes


def check_preregistered(saved: dict[str, Any], compare: dict[str, Any], plan: Any) -> None:
    """Refuse a resume whose pre-registered design differs from the one ``plan`` (``plan.json``, ``saved``) froze at
    the comparison's first session (a plan written before vlkit froze them: its config's values)."""
    before = saved.get("preregistered") or preregistration(saved["config"]["compare"])
    now = preregistration(compare)
    changes = _claim_changes(before["claims"], now["claims"])
    changes += [f"compare.{k}: {before.get(k)!r} -> {now[k]!r}" for k in now
                if k not in ("claims", "looks") and before.get(k) != now[k]]
    if not changes and before.get("looks") != now["looks"]:
        changes.append(f"the look schedule: {before.get('looks')} -> {now['looks']}")
    if changes:
        raise ValueError(f"resume=true: the analysis was pre-registered in {plan} at the comparison's first session, "
                         "and changing it after a look voids its error guarantee; changed: " + "; ".join(changes)
                         + ". A new analysis goes to a new output_dir (or is reported as exploratory, never as "
                         "decided); resume with the pre-registered settings to go on")


def spend_factor(account: dict[str, Any]) -> float:
    """Device-hours the finished units spent over the plan's hours for them (`vlkit.compare.account.account`;
    attempts that died included); 1 before any unit finished."""
    done = [u for u in account["units"].values() if u["state"] == "finished" and u["planned_hours"]]
    planned = sum(u["planned_hours"] for u in done)
    return sum(u["device_hours"] for u in done) / planned if planned > 0 else 1.0


def seeds_cost(seed_hours: dict[str, float], now: dict[str, int], target: dict[str, int], factor: float = 1.0
               ) -> float:
    """Device-hours of taking each run from ``now`` to ``target`` seeds at the plan's ``seed_hours`` per seed
    (`vlkit.compare.plan.seed_costs`) times ``factor`` (`spend_factor`)."""
    return factor * sum(max(0, n - now.get(run, 0)) * seed_hours[run] for run, n in target.items())


__all__ = ["PREREGISTERED", "alpha_of", "check_preregistered", "max_device_hours", "preregistration", "seeds_cost",
           "spend_factor"]
