"""The report of a comparison: ``results.md`` (the tables, chance levels, detectable effects and verdict
lines), ``results.csv`` and a strict ``results.json`` (no bare NaN)."""
from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import Any, Sequence

from vlkit.compare.claims import claim_runs, seeds_needed, verdicts
from vlkit.compare.config import comparison_title, look_sizes_of
from vlkit.compare.plots import plot_results
from vlkit.compare.preregistration import max_device_hours, seeds_cost, spend_factor
from vlkit.compare.records import POINTS, UNITS
from vlkit.compare.statistics import (COSTS, HEADLINE, VQA_ANSWER_TYPES, baseline_key, chance_levels,
                                      detectable_effects, pairwise_tests, scratch_tests, summarize)
from vlkit.io import atomic_write_text, clean_json, dump_json
from vlkit.runtime import GEMM_PROBE
from vlkit.stats.paired import ALPHA

COST_LABELS = {"params": "params", "train_samples_per_s": "train samples/s", "latency_ms": "latency ms/ex",
               "wall_s": "wall s"}


def _num(value: float, digits: int = 1) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def figure(value: float | None) -> str:
    """Three significant figures, thousands separated: 0.00123, 4.56, 1,234 (– for none)."""
    if value is None:
        return "–"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def _cell(stat: dict[str, Any] | None, factor: float = 100.0) -> str:
    """``mean ± CI`` in points; ``–`` for a metric the row does not have."""
    if not stat:
        return "–"
    mean, ci = stat["mean"] * factor, stat["ci95"] * factor
    return _num(mean) if not math.isfinite(ci) else f"{mean:.1f} ± {ci:.1f}"


def markdown_table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out)


def results_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """One line per (run, variant): every metric as mean ± 95% CI over seeds, then the costs."""
    lines = []
    for row in rows:
        cells = [row["run"], row["variant"]]
        for c in columns:
            if c == "params":
                cells.append(f"{row[c]['mean'] / 1e6:.2f}M" if c in row else "–")
            elif c in COSTS:
                cells.append(_num(row[c]["mean"]) if c in row else "–")
            else:
                cells.append(_cell(row.get(c), POINTS))
        lines.append(cells)
    return markdown_table(["run", "variant"] + [COST_LABELS.get(c, c) for c in columns], lines)


def _effect(test: dict[str, Any]) -> str:
    """``+4.3 ± 2.1 (p 0.003)*``: the paired difference in points, its 95% CI, Holm's p and a star when significant."""
    ci = test["ci95"] * POINTS
    text = f"{test['effect'] * POINTS:+.1f}" + (f" ± {ci:.1f}" if math.isfinite(ci) else "")
    p = test.get("p_holm", float("nan"))
    return text + (f" (p {p:.3f})" if math.isfinite(p) else " (p –)") + ("*" if test.get("significant") else "")


def tests_table(tests: list[dict[str, Any]], metrics: list[str], first: str) -> str:
    """One line per comparison, one column per metric (``no baseline`` for a run that has none)."""
    by_row: dict[str, dict[str, Any]] = {}
    for t in tests:
        by_row.setdefault(t["comparison"], {})
        if "metric" in t:
            by_row[t["comparison"]][t["metric"]] = t
        else:
            by_row[t["comparison"]]["_note"] = t["kind"]
    lines = []
    for name, cells in by_row.items():
        note = cells.get("_note")
        lines.append([name] + [note if note else (_effect(cells[m]) if m in cells else "–") for m in metrics])
    return markdown_table([first] + metrics, lines)


def verdict_lines(scratch: list[dict[str, Any]], pairwise: list[dict[str, Any]]) -> list[str]:
    """Plain sentences for what the tests found (Holm-corrected, p < 0.05), and which runs lack a baseline."""
    out = []
    for t in scratch:
        if "metric" not in t:
            out.append(f"- {t['comparison']}: no scratch baseline, so no claim about pre-training.")
    for metric in dict.fromkeys(t["metric"] for t in scratch if "metric" in t):
        tests = [t for t in scratch if t.get("metric") == metric]
        better = [t["comparison"] for t in tests if t["significant"] and t["effect"] > 0]
        worse = [t["comparison"] for t in tests if t["significant"] and t["effect"] < 0]
        unclear = [t["comparison"] for t in tests if not t["significant"]]
        parts = []
        if better:
            parts.append(f"pre-training beats scratch for {', '.join(better)}")
        if worse:
            parts.append(f"scratch beats pre-training for {', '.join(worse)}")
        if unclear:
            parts.append(f"no significant difference for {', '.join(unclear)}")
        out.append(f"- `{metric}`: " + "; ".join(parts) + ".")
    for t in pairwise:
        if t["significant"]:
            a, b = t["comparison"].split(" − ")
            winner, loser = (a, b) if t["effect"] > 0 else (b, a)
            out.append(f"- `{t['metric']}`: {winner} > {loser} by {abs(t['effect']) * POINTS:.1f} points "
                       f"(Holm p {t['p_holm']:.3f}).")
    return out


def chance_note(chance: dict[str, float]) -> str:
    if not chance:
        return ""
    parts = [f"{m} {c * POINTS:.1f}" for m, c in chance.items()]
    return ("Chance or trivial-baseline level of each metric on the evaluation set (points): " + ", ".join(parts)
            + " (VQA and its answer types: a question-only model, `vqa_blind_*`; RefExp: a random candidate box; NLVR2 / SNLI-VE: the majority label; "
            "R@1: a random ranking; ITM accuracy: balanced matched / mismatched pairs).")


def answer_types_section(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[str]:
    """VQA per answer type, next to the two blind baselines (the same for every run: read from the first record)."""
    columns = [m for m in VQA_ANSWER_TYPES if any(m in r for r in rows)]
    if not columns:
        return []
    first = next(r for r in records if columns[0] in r)

    def baseline(name: str) -> str:
        return ", ".join(f"{m.removeprefix('vqa_')} {first[k] * POINTS:.1f}" for m in columns
                         if isinstance(first.get(k := baseline_key(m, name)), (int, float)))

    return ["## VQA per answer type", "", results_table(rows, columns), "",
            f"Question-only baselines on the same questions (points): a bag-of-words model of the question (`vqa_blind_*`, "
            f"Antol et al.'s BoW Q) {baseline('blind') or '–'}; the most common answer of the question's type "
            f"(`vqa_prior_*`) {baseline('prior') or '–'}.", ""]


def detectable_note(mde: dict[str, dict[str, float]], seeds: int) -> str:
    if not mde:
        return ""
    parts = [f"{m} {v['mde'] * POINTS:.1f} ({v['mde_holm_strict'] * POINTS:.1f})" for m, v in mde.items()]
    return (f"Minimum detectable effect at {seeds} seeds (points; paired t-test, alpha 0.05, power 0.8, from the pooled "
            "SD of the pre-trained − scratch differences; in brackets at Holm's strictest level): " + ", ".join(parts) + ".")


def claims_table(claims: list[dict[str, Any]]) -> str:
    """The claims with their effect and verdict, and beside each the assumptions it rests on: the test and its
    direction or margin, the per-seed differences, the look that decided it (or the last one) with its p against the
    level (and a fixed comparison's Holm-adjusted p), the exact sign-flip p with the smallest one these seeds allow, and
    whether the decision is parametric-only (`vlkit.compare.claims.verdicts`)."""
    lines = []
    for c in claims:
        rule = c["rule"]
        effect = "–" if c["effect"] != c["effect"] else f"{c['effect'] * POINTS:+.1f} ± {c['ci95'] * POINTS:.1f}"
        diffs = " ".join(f"{d * POINTS:+.1f}" for d in c["differences"]) or "–"
        p = "–" if not rule["look"] else f"look {rule['look']} ({rule['n']} seeds): p {_p(rule['p'])} vs {_p(rule['level'])}" \
            + (f" (Holm p {_p(rule['holm_p'])})" if "holm_p" in rule else "")
        lines.append([c["claim"], f"{c['a']} vs {c['b']}", c["metric"], c.get("paper", ""),
                      f"{c['test']}: {c['direction']}", effect, diffs, p, sign_flip_cell(rule),
                      f"**{c['verdict']}**" + (" (decided under normality)" if rule["parametric_only"] else "")])
    return markdown_table(["claim", "compared", "metric", "paper", "test: hypothesis (points)", "effect (points)",
                           "per-seed a − b", "p vs level", "sign-flip p (smallest possible)", "verdict"], lines)


def sign_flip_cell(rule: dict[str, Any]) -> str:
    """The exact sign-flip p at the seeds used, its floor ``2^-n``, and whether the floor reaches the claim's level."""
    if not rule["look"]:
        return "–"
    reach = "can reach the level" if rule["sign_flip_floor"] <= rule["level"] else "cannot reach the level"
    return f"{_p(rule['sign_flip_p'])} ({_p(rule['sign_flip_floor'])}: {reach})"


def budget_section(compare: dict[str, Any], claims: list[dict[str, Any]], records: list[dict[str, Any]],
                   account: dict[str, Any], costs: dict[str, Any] | None) -> list[str]:
    """results.md's lines on ``compare.max_device_hours``: what was spent against it, which claims it left undecided
    and what deciding them (their runs to ``compare.max_seeds``) would cost, at the plan's hours per seed corrected by
    what finished units spent (`vlkit.compare.preregistration.seeds_cost`)."""
    budget = max_device_hours(compare)
    if budget is None or not claims:
        return []
    spent = account["device_hours"]
    left = [c for c in claims if c["verdict"] == "running"]
    line = f"Budget: compare.max_device_hours={budget:g}; spent {spent:.3g} device-hours."
    if not left:
        return ["### Budget", "", line + " No claim was left undecided by it.", ""]
    seeds: dict[str, set[int]] = {}
    for r in records:
        seeds.setdefault(r["run"], set()).add(r["seed"])
    runs = sorted({run for c in left for run in claim_runs(c)})
    factor = spend_factor(account)
    now = {run: len(s) for run, s in seeds.items()}
    cost = seeds_cost(costs["seed_hours"], now, {run: compare["max_seeds"] for run in runs}, factor) \
        if costs else float("nan")
    return ["### Budget", "", line + f" It left {len(left)} claim(s) undecided: "
            + "; ".join(c["claim"] for c in left) + f". Deciding them, every look up to compare.max_seeds="
            f"{compare['max_seeds']} for their runs ({', '.join(runs)}), would cost up to {cost:.3g} more "
            f"{(costs or {}).get('device', 'device')}-hours (the plan's hours per seed x {factor:.2f}, what finished "
            "units spent over what the plan gave them).", ""]


def verdict_line(c: dict[str, Any]) -> str:
    """One claim's verdict with its test, direction or margin, sign-flip p and basis (results.md's Verdicts)."""
    rule = c["rule"]
    basis = ("decided under normality: parametric-only" if rule["parametric_only"] else
             "t-test and sign-flip test agree" if rule["state"] == "decided" else "not decided")
    return (f"- Claim: {c['claim']}: **{c['verdict']}** ({c['test']}, {c['direction']}; p {_p(rule['p'])} vs "
            f"{_p(rule['level'])}; sign-flip p {sign_flip_cell(rule)}; {basis})")


def _p(value: float) -> str:
    return "–" if value != value else f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


def seeds_table(rows: list[dict[str, Any]], device: str) -> str:
    """Per claim: the observed effect and SD of the paired differences, and the seeds (and device-hours) a fixed
    design needs for 80% power at the paper's effect and at the observed one (`vlkit.compare.claims.seeds_needed`)."""
    def cell(n: Any, hours: Any) -> str:
        return "> 1,000" if n is None else f"{n} ({hours:,.2f} h)" if hours == hours else str(n)

    lines = []
    for r in rows:
        observed = "–" if r["effect"] != r["effect"] else \
            f"{r['effect'] * POINTS:+.1f} (SD {r['sd'] * POINTS:.1f}, {r['n']} seeds)"
        paper = "–" if r["paper_effect"] is None else f"{r['paper_effect'] * POINTS:+.2f}"
        lines.append([r["claim"], r["metric"], observed, paper,
                      "–" if r["paper_effect"] is None else cell(r["seeds_paper"], r["hours_paper"]),
                      cell(r["seeds_observed"], r["hours_observed"])])
    return markdown_table(["claim", "metric", "observed effect (points)", "paper effect",
                           f"seeds at paper effect ({device}-h)", f"seeds at observed effect ({device}-h)"], lines)


def analyse(records: list[dict[str, Any]], claims: list[dict[str, Any]] | None = None, sizes: list[int] | None = None,
            costs: dict[str, Any] | None = None, alpha: float = ALPHA) -> dict[str, Any]:
    """Everything the report shows, as data: summary rows, tests, chance levels, detectable effects, claims (by the
    group-sequential rule over the looks ``sizes`` when given, family-wise error ``alpha``), and the seeds each claim
    needs at the per-seed device-hours of each run in ``costs`` (``{"device": ..., "seed_hours": {run: hours}}``)."""
    rows = summarize(records)
    entries = verdicts(records, claims or [], sizes, alpha)
    metrics = [c for c in HEADLINE if any(c in r for r in rows)]
    scratch = scratch_tests(records, metrics)
    pairwise = pairwise_tests(records, metrics)
    seeds = max((len(r["seeds"]) for r in rows), default=0)
    return {"summary": rows, "metrics": metrics, "tests": {"vs_scratch": scratch, "pairwise": pairwise},
            "chance": chance_levels(records), "detectable_effects": detectable_effects(scratch, seeds),
            "claims": entries, "seeds": seeds, "looks": sizes,
            "seeds_needed": seeds_needed(entries, (costs or {}).get("seed_hours") or {}, alpha) if entries else [],
            "plan": {k: v for k, v in (costs or {}).items() if k != "seed_hours"} or None}


def machine_note(machine: dict[str, Any] | None) -> str:
    """The machine speed beside the wall time (a machine's speed drifts, so a wall time alone compares badly) and the
    float kernels the units computed with (records are bit-identical only between equal kernels)."""
    if not machine:
        return ""
    rate, threads = machine["gemm_gflops"], "/".join(str(t) for t in machine["threads"])
    note = (f" Machine speed after each unit ({GEMM_PROBE} on its {threads} thread(s)): median {rate['median']:.0f} "
            f"GFLOPS, {rate['min']:.0f}-{rate['max']:.0f} over {machine['units']} units.")
    return note + (f" Kernels: {'; '.join(machine['kernels'])}." if machine.get("kernels") else "")


def units_markdown(output_dir: Path, states: list, acct: dict[str, Any]) -> str:
    """``units.md`` of the comparison in ``output_dir``: every unit (``states``: `vlkit.compare.records.unit_states`) with its
    status, attempts, what it spent beside its plan (``acct``: `vlkit.compare.account.account`), its error or start."""
    counts: dict[str, int] = {}
    for _, st, _ in states:
        counts[st] = counts.get(st, 0) + 1
    rows = []
    for key, st, s in states:
        unit = acct["units"].get(key) or {}
        note = (s or {}).get("error", "") if st in ("failed", "died", "skipped") else \
            (time.strftime("%Y-%m-%d %H:%M", time.localtime(s["started"])) + f" on {s.get('host')}"
             if st == "running" else "")
        rows.append([key, st, str(unit.get("attempts", 0)), f"{unit.get('unit_s', 0):,.1f}",
                     f"{unit.get('wasted_s', 0):,.1f}", figure(unit.get("planned_hours")), figure(unit.get("device_hours")),
                     "–" if unit.get("mfu") is None else f"{unit['mfu']:.1%}", note])
    device = (acct["plan"] or {}).get("device", "device")
    summary = ", ".join(f"{n} {st}" for st, n in sorted(counts.items()))
    return (f"# Units of {output_dir}\n\n{len(states)} units: {summary}.\n\n"
            + markdown_table(["unit", "status", "attempts", "unit-s", "wasted s", f"planned {device}-h",
                              f"spent {device}-h", "achieved MFU", "error / started"], rows) + "\n")


def account_notes(acct: dict[str, Any]) -> list[str]:
    """What the account could not make (``not_accounted``) and the records it set aside (``set_aside``), one line
    each naming the file and why."""
    return [f"Not accounted: {why}." for why in acct.get("not_accounted", [])] + \
        [f"Set aside: {a['file']}: {a['why']}." for a in acct.get("set_aside", [])]


def account_line(acct: dict[str, Any]) -> str:
    """The account in one sentence (results.md's header, `vlkit compare-report`), then its notes (`account_notes`)."""
    if acct["wall_s"] is None:
        return "\n".join(account_notes(acct))
    plan, sessions = acct["plan"], len(acct["sessions"])
    mfu = "" if acct["mfu"] is None else f", achieved MFU {acct['mfu']:.1%}"
    device = plan["device"] if plan else "device"
    planned = f" against {figure(plan['device_hours'])} planned at MFU {plan['mfu']:.1%}" if plan else ""
    line = (f"Spent: wall time {acct['wall_s']:,.0f} s over {sessions} session(s); {acct['unit_s']:,.0f} unit-s in "
            f"{acct['attempts']} attempt(s) ({acct['died']} died, {acct['failed']} failed: {acct['wasted_unit_s']:,.0f} "
            f"unit-s wasted); {figure(acct['device_hours'])} {device}-hours{planned}{mfu}.")
    return "\n".join([line, *account_notes(acct)])


def _stage(key: str) -> str:
    """A unit's row in results.md's account: a run's pre-training, or a task's fine-tunings."""
    run, _, rest = key.partition("/seed")
    stage = rest.partition("/")[2]
    return f"{run} pre-training" if stage == "pretrain" else f"{stage.partition('-')[2]} fine-tuning"


def account_section(acct: dict[str, Any]) -> list[str]:
    """results.md's account: every session, then spent beside planned per stage (a run's pre-training, a task's
    fine-tunings) and in total."""
    def clock(t: float | None) -> str:
        return "–" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    if acct["wall_s"] is None:  # the account itself failed: what failed, and the units' records are kept
        return ["## What it spent", "", account_line(acct), "",
                "Each finished unit's record is kept under `runs/`; `vlkit compare-report` accounts again.", ""]
    rows = [[str(s["session"]), clock(s["started"]), clock(s["ended"] or s["last_seen"]), f"{s['span_s']:,.0f}",
             s["end"], s["host"], s["executor"], str(s["finished"]), str(s["failed"]), str(s["died"]),
             str(s["retried"]), f"`{s['command']}`"] for s in acct["sessions"]]
    stages: dict[str, dict[str, float]] = {}
    for key, unit in acct["units"].items():
        stage = stages.setdefault(_stage(key), {"units": 0, "attempts": 0, "unit_s": 0.0, "device_hours": 0.0,
                                                  "planned_hours": 0.0, "flops": 0.0, "peak_s": 0.0})
        stage["units"] += 1
        stage["attempts"] += unit["attempts"]
        stage["unit_s"] += unit["unit_s"]
        stage["device_hours"] += unit["device_hours"]
        stage["planned_hours"] += unit["planned_hours"] or 0.0
        if unit["mfu"]:
            stage["flops"] += unit["planned_flops"]
            stage["peak_s"] += unit["planned_flops"] / unit["mfu"]
    plan = acct["plan"] or {"device": "device"}
    lines = [[name, str(s["units"]), str(s["attempts"]), f"{s['unit_s']:,.0f}", figure(s["planned_hours"]),
              figure(s["device_hours"]), f"{s['flops'] / s['peak_s']:.1%}" if s["peak_s"] else "–"]
             for name, s in stages.items()]
    lines.append(["**total**", str(len(acct["units"])), str(acct["attempts"]), f"{acct['unit_s']:,.0f}",
                  figure(sum(u["planned_hours"] or 0.0 for u in acct["units"].values())), figure(acct["device_hours"]),
                  "–" if acct["mfu"] is None else f"{acct['mfu']:.1%}"])
    return ["## What it spent", "", account_line(acct), "",
            "Every session (each run of `vlkit compare` on this folder; a killed one ends at its last heartbeat) and "
            "the attempts it started:", "",
            markdown_table(["session", "started", "ended", "wall s", "end", "host", "executor", "finished", "failed",
                            "died", "retried", "command"], rows), "",
            (f"Spent beside planned: the FLOP plan of these units on {plan['device']} at MFU {plan['mfu']:.1%} "
             f"({plan['mfu_source']}); spent device-hours count every attempt; achieved MFU = planned FLOPs of the "
             "finished units / (their spent seconds x devices x the device's peak): set `compare.plan.mfu` from it. "
             if "mfu" in plan else "Spent, without the plan (it failed, above); spent device-hours count every "
             "attempt. ") + "Each unit: `units.md`.", "",
            markdown_table(["stage", "units", "attempts", "unit-s", f"planned {plan['device']}-h",
                            f"spent {plan['device']}-h", "achieved MFU"], lines), ""]


def write_outputs(output_dir: Path, cfg: dict[str, Any], records: list[dict[str, Any]], audit: dict[str, Any],
                  curves: dict[str, list[dict[str, Any]]], account: dict[str, Any], costs: dict[str, Any] | None = None
                  ) -> str:
    """results.md, results.json, results.csv and the plots; ``account``: what the comparison spent
    (`vlkit.compare.account`): its line in the header, its section at the end."""
    sizes = look_sizes_of(cfg["compare"])
    alpha = cfg["compare"].get("alpha", ALPHA)
    result = analyse(records, cfg["compare"].get("claims"), sizes, costs, alpha)
    rows, metrics = result["summary"], result["metrics"]
    table = results_table(rows, metrics + [c for c in COSTS if any(c in r for r in rows)])
    seeds = sorted({r["seed"] for r in records})
    title = comparison_title(cfg["compare"])
    notes = [f"# vlkit compare: {title}", "",
             f"Data: `{cfg['data'].get('name')}` (hash `{audit['data_hash'][:12]}`), seeds {seeds}, "
             f"pre-training {cfg['compare']['budget']['pretrain_steps']} steps." + machine_note(audit.get("machine")),
             "", account_line(account), "",
             "Metrics in points (mean ± 95% t-interval over seeds). `itm_acc`: the pre-training ITM head on held-out "
             "pairs; `zs_*`: zero-shot retrieval with it; `meta_sum`: UNITER's VQA + IR@1 + TR@1 + NLVR2 + RefExp "
             "(– where a task does not apply).", chance_note(result["chance"]), "", table, ""]
    notes += answer_types_section(rows, records)
    if result["claims"]:
        how = (f"decided by the group-sequential rule at looks after {sizes} seeds (exact one-sided t boundaries, "
               "O'Brien-Fleming-type spending, graphical Holm over the claims" if sizes else
               "decided at the seeds there are, Holm over the claims")
        notes += ["## The papers' claims", "", "Each claim as its pre-registered one-sided paired test over seeds "
                  "(TOST for an equivalence claim; effect = first minus second, in points, ± 95% CI), "
                  f"{how}: family-wise error {alpha}. A decision needs the t-test's p at its level and, where the "
                  "exact sign-flip test can reach that level (2^-n ≤ level), the sign-flip p too; a decision it could "
                  "not check is marked *decided under normality* (docs/compare-sequential.md).", "",
                  claims_table(result["claims"]), ""]
        if result["plan"]:
            plan = result["plan"]
            notes += ["### Seeds a claim needs", "", "The seeds a fixed design needs for 80% power (one-sided paired "
                      f"t-test at Holm's strictest level, {alpha} / {len(result['claims'])}), at the paper's effect and "
                      "at the observed one, with the observed SD of the paired differences; in brackets their cost: "
                      f"the claim's two runs per seed on {plan['device']} at MFU {plan['mfu']:.1%} (`compare.plan`).",
                      "", seeds_table(result["seeds_needed"], plan["device"]), ""]
        notes += budget_section(cfg["compare"], result["claims"], records, account, costs)
    notes += ["## Pre-training vs scratch", "",
              f"The same model fine-tuned after pre-training minus without it, paired by seed; `*`: Holm-corrected "
              f"p < {ALPHA} over this table.", "", tests_table(result["tests"]["vs_scratch"], metrics, "run"), "",
              detectable_note(result["detectable_effects"], result["seeds"]), ""]
    if result["tests"]["pairwise"]:
        notes += ["## Contestants against each other", "",
                  f"Every pair of pre-trained runs (first minus second), paired by seed; `*`: Holm-corrected p < {ALPHA} "
                  "over this table.", "", tests_table(result["tests"]["pairwise"], metrics, "pair"), ""]
    notes += ["## Verdicts", "", *verdict_lines(result["tests"]["vs_scratch"], result["tests"]["pairwise"]),
              *[verdict_line(c) for c in result["claims"]], "",
              "Every metric of every run and seed: `results.csv` / `results.json`; plots: `metrics.png`, "
              "`loss_curves.png`, `wra_plan.png`.", "", *account_section(account)]
    atomic_write_text(output_dir / "results.md", "\n".join(notes))
    atomic_write_text(output_dir / "results.json", dump_json({"units": UNITS, "records": records, **result,
                                                             "account": account}))
    keys = ["units"] + sorted({k for r in records for k in r})
    with open(output_dir / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        for r in records:
            writer.writerow({"units": UNITS, **{k: json.dumps(clean_json(v)) if isinstance(v, (dict, list)) else v
                                                 for k, v in r.items()}})
    plot_results(output_dir, rows, metrics, curves, result["chance"], title)
    return "\n\n".join(p for p in (table, claims_table(result["claims"]) if result["claims"] else "") if p)
