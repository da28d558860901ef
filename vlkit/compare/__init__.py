"""`vlkit compare`: head-to-head runs on identical data -> tables, plots and a manifest to rerun them.

A comparison is a list of runs (``conf/compare/*.yaml``, or ``compare=<path.yaml>``): each names a
model, an objective mix (or none) and optional overrides (its own task options included); every run is
pre-trained on the same examples in the same order with the same seeds and step budget, then
fine-tuned and evaluated on the same tasks, next to a no-pre-training baseline of the same model.
Results are reported per seed and as mean ± 95% CI.

    vlkit compare                          # the default comparison on the embedded shapes world
    vlkit compare compare=smoke            # tiny and quick
    vlkit compare compare=my_runs.yaml     # a comparison file of your own
    vlkit compare ... output_dir=D resume=true      # go on where a killed or failed comparison stopped
    vlkit compare ... dry_run=true         # the units, their resources and a measured cost estimate
    vlkit compare-report output_dir=D      # the report from the folder, also while units still run

Each unit of work (a pre-training, or one fine-tuning of one variant on one task) records its state and
result in its own folder the moment it ends (`units`), wherever it ran (`executors`: local processes,
SLURM through submitit, Ray); the report is always rebuilt from those folders (`report_from_folder`).

Modules, by role:
- the plan of units: `config` (runs, task configs), `comparison` (`Comparison`: every unit, its trainer, folder and
  identity), `units` (a unit and its state on disk);
- the work of a unit: `unit_work` (pre-train or fine-tune one unit, with the probes of `vlkit.tasks.probes`: ITM
  accuracy, zero-shot retrieval, latency), `worker` (a unit in the process an executor started);
- the scheduler: `scheduler` (this session's units on the executor, look after look), `looks` (seeds until
  decided), `executor_base` (the executor contract) and `executors` (local, SLURM, Ray);
- the command: `command` (`vlkit compare`, `vlkit compare-report`, the plan file), `records` (what finished
  units give), `report`, `plots` and `manifest` (outputs), `account` (what it spent, across every session);
- the cost plan and the statistics: `estimate` (dry run), `plan`, `flops` and `devices` (the FLOP plan),
  `statistics` and `claims` (tables, verdicts), `preregistration` (the analysis frozen at the first session) and
  `looks` (seeds until decided); the tests themselves and the rule are `vlkit.stats`.
"""

from __future__ import annotations

from vlkit.compare.command import RESUME_SAFE, main, report_from_folder, report_main
from vlkit.compare.comparison import Comparison
from vlkit.compare.config import RunSpec, look_sizes_of, objective_mix, resolve_config, run_specs, task_cfg
from vlkit.compare.looks import next_look, replay_looks
from vlkit.compare.records import collect, finished_records, unit_states
from vlkit.compare.statistics import HEADLINE, summarize
from vlkit.compare.unit_work import UnitWork
from vlkit.compare.units import digest
from vlkit.stats.paired import mean_ci, paired_p_value

__all__ = ["Comparison", "HEADLINE", "RESUME_SAFE", "RunSpec", "UnitWork", "collect", "digest", "finished_records",
           "look_sizes_of", "main", "mean_ci", "next_look", "objective_mix", "paired_p_value", "replay_looks",
           "report_from_folder", "report_main", "resolve_config", "run_specs", "summarize", "task_cfg", "unit_states"]
