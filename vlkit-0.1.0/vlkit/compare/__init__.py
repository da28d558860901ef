"""`vlkit compare`: head-to-head runs on identical data -> tables, plots and a manifest to rerun them.

A comparison is a list of runs (``conf/compare/*.yaml``, or ``compare=<path.yaml>``): each names a
model, an objective mix (or none) and optional overrides (its own task options included); every run is
pre-trained on the same examples in the same order with the same seeds and step budget, then
fine-tuned and evaluated on the same tasks, next to a no-pre-training baseline of the same model.
Results are reported per seed and as mean ± 95% CI.

    vlkit compare                          # the default comparison on the embedded shapes world
    vlkit compare compare=smoke            # tiny and quick
    vlkit compare compare=my_runs.yaml     # a comparison file of your own
    vlkit compare manifest=outputs/compare/<stamp>/manifest.json   # rerun exactly

Modules: `config` (runs, task configs), `statistics` (CIs, tests, summaries), `scheduling` (units of
work over worker processes), `report` and `plots` (outputs), `manifest` (what reruns a comparison).
"""
from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from vlkit.compare.claims import check_claims
from vlkit.compare.config import RunSpec, objective_mix, resolve_config, run_specs, task_cfg
from vlkit.compare.statistics import HEADLINE, mean_ci, paired_p_value, summarize
from vlkit.compare.scheduling import Comparison, digest


def main(cfg: Any) -> int:
    import torch

    from vlkit.compare.manifest import write_manifest
    from vlkit.compare.plots import plot_transport_plan
    from vlkit.compare.report import write_outputs
    from vlkit.train import pipeline

    cfg = resolve_config(cfg)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    output_dir = Path(cfg.get("output_dir") or Path("outputs") / "compare" / stamp)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise FileExistsError(f"{output_dir} is not empty: choose another output_dir= (results are never overwritten)")
    output_dir.mkdir(parents=True, exist_ok=True)
    workers = int(cfg.get("workers") or min(2, os.cpu_count() or 1))
    threads = int(cfg.get("threads") or 1)
    torch.set_num_threads(threads)
    start = time.perf_counter()
    comparison = Comparison(cfg, output_dir, progress=cfg.get("progress", True))
    check_claims(cfg["compare"].get("claims") or [], [s.name for s in comparison.specs])
    comparison.say(f"{len(comparison.specs)} run(s) x {len(cfg['compare']['seeds'])} seed(s) = "
                   f"{len(comparison.all_units())} units of work on {workers} worker(s) x {threads} thread(s)")
    records = comparison.run(workers, threads)
    wall = time.perf_counter() - start
    audit = comparison.audit
    audit["data_hash"] = digest(sorted(audit["data"].items()))
    expected = cfg.get("expected_data_hash")
    if expected and expected != audit["data_hash"]:
        raise RuntimeError(f"the data differ from the manifest's (hash {audit['data_hash'][:12]} != {expected[:12]})")
    wra = next((s for s in comparison.specs if s.objectives is not None and "wra" in (objective_mix(s) or {})
                .get("objectives", {}).get("itm", {})), None)
    if wra is not None:  # the transport plan of the first run with WRA, first seed
        run_dir = output_dir / "runs" / wra.name / f"seed{cfg['compare']['seeds'][0]}" / "pretrain"
        plot_transport_plan(output_dir, pipeline.load_pretraining(run_dir), comparison.environment(wra))
    store = next((env.data["image"].get("path") for env in comparison._environments.values()
                  if env.data["image"].get("source") == "features"), None)
    write_manifest(output_dir, cfg, audit, store, wall)
    table = write_outputs(output_dir, cfg, records, audit, comparison.curves, wall)
    print(f"\n{table}\n\nwall time {wall:.0f} s; results in {output_dir} (tests, chance levels and verdicts: "
          f"{output_dir / 'results.md'})")
    return 0


__all__ = ["Comparison", "HEADLINE", "RunSpec", "digest", "main", "mean_ci", "objective_mix", "paired_p_value",
           "resolve_config", "run_specs", "summarize", "task_cfg"]
