"""`vlkit compare`: head-to-head runs on identical data -> tables, plots and a manifest to rerun them.

A comparison is a list of runs (``conf/compare/*.yaml``): each names a model, an objective mix
(or none) and optional overrides; every run is pre-trained on the same examples in the same order
with the same seeds and step budget, then fine-tuned and evaluated on the same tasks, next to a
no-pre-training baseline of the same model. Results are reported per seed and as mean ± 95% CI.

    vlkit compare                          # the default comparison on the embedded shapes world
    vlkit compare compare=smoke            # tiny and quick
    vlkit compare manifest=outputs/compare/<stamp>/manifest.json   # rerun exactly
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from vlkit.train import pipeline

# Metrics the tables show first, in this order (anything else follows alphabetically).
HEADLINE = ("vqa", "ir_r1", "tr_r1", "zs_ir_r1", "zs_tr_r1", "refexp", "nlvr2", "snli_ve", "meta_sum")
PACKAGES = ("torch", "torchvision", "transformers", "timm", "accelerate", "hydra-core", "datasets", "h5py", "pot",
            "safetensors", "numpy")


# ------------------------------------------------------------------------------------------------
# configuration
# ------------------------------------------------------------------------------------------------
@dataclass
class RunSpec:
    """One contestant: a model, an objective mix (None: no pre-training) and its overrides."""

    name: str
    model: dict[str, Any]
    objectives: Any = None
    mix: dict[str, Any] = field(default_factory=dict)  # overrides of the mix (masking, sampling ...)
    trainer: dict[str, Any] = field(default_factory=dict)  # overrides of the pre-training trainer
    baseline: bool = True  # also fine-tune the same model without pre-training

    @property
    def family(self) -> str:
        return self.model["name"]


def resolve_config(cfg: Any) -> dict[str, Any]:
    """The comparison as plain data: from ``manifest=`` when given, else the composed config."""
    cfg = pipeline.plain(cfg)
    if cfg.get("manifest"):
        manifest = json.loads(Path(cfg["manifest"]).read_text())
        resolved = manifest["config"]
        resolved["output_dir"] = cfg.get("output_dir")
        resolved["expected_data_hash"] = manifest["data"]["hash"]
        return resolved
    return cfg


def run_specs(compare: dict[str, Any]) -> list[RunSpec]:
    specs = []
    for entry in compare["runs"]:
        entry = dict(entry)
        if "name" not in entry or "model" not in entry:
            raise KeyError(f"compare.runs entry {entry} needs 'name' and 'model'")
        model = entry.pop("model")
        model = {"name": model} if isinstance(model, str) else dict(model)
        entry.setdefault("baseline", compare.get("baseline", True))
        unknown = set(entry) - {"name", "objectives", "mix", "trainer", "baseline"}
        if unknown:
            raise KeyError(f"compare.runs[{entry['name']}]: unknown key(s) {', '.join(sorted(unknown))}")
        specs.append(RunSpec(model=model, **entry))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"compare.runs: run names must be unique, got {names}")
    return specs


def objective_mix(spec: RunSpec) -> dict[str, Any] | None:
    from vlkit.objectives import load_mix

    if spec.objectives is None:
        return None
    mix = load_mix(spec.objectives)
    mix.update(spec.mix)
    return mix


# ------------------------------------------------------------------------------------------------
# statistics
# ------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------------
def digest(items: Iterable[Any]) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(json.dumps(item, sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def inference_latency(model: Any, dataset: Any, n: int = 64, batch_size: int = 32) -> float:
    """Milliseconds per example of a forward pass over ``n`` examples of ``dataset`` in eval mode."""
    collate = dataset.collator()
    examples = [dataset[i] for i in range(min(n, len(dataset)))]
    batches = [collate(examples[i:i + batch_size]) for i in range(0, len(examples), batch_size)]
    was_training = model.training
    model.eval()
    model(batches[0])  # warm-up
    start = time.perf_counter()
    for batch in batches:
        model(batch)
    model.train(was_training)
    return 1000 * (time.perf_counter() - start) / len(examples)


class Comparison:
    """Runs a resolved comparison config into ``output_dir`` (see the module docstring)."""

    def __init__(self, cfg: dict[str, Any], output_dir: Path, progress: bool = True):
        self.cfg = cfg
        self.compare = cfg["compare"]
        self.output_dir = output_dir
        self.progress = progress
        self.specs = run_specs(self.compare)
        self.records: list[dict[str, Any]] = []
        self.audit: dict[str, Any] = {"pretrain_ids": {}, "finetune_ids": {}, "data": {}}
        self.curves: dict[str, list[dict[str, Any]]] = {}
        self._environments: dict[str, pipeline.Environment] = {}

    # -- helpers ---------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        if self.progress:
            print(f"[compare {time.strftime('%H:%M:%S')}] {message}", flush=True)

    def environment(self, spec: RunSpec) -> pipeline.Environment:
        from vlkit.registry import MODELS

        key = MODELS.get(spec.family).image_input + json.dumps(spec.model, sort_keys=True)
        if key not in self._environments:
            self._environments[key] = pipeline.prepare_environment(spec.model, self.cfg["data"], self.cfg.get("cache_dir"),
                                                                   progress=self.progress)
        return self._environments[key]

    def trainer_cfg(self, stage: str, steps: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        base = dict(self.compare["trainer"]["common"])
        base.update(self.compare["trainer"].get(stage) or {})
        base.update(extra or {})
        base.update(max_steps=steps, progress=False, save_every=0, keep_checkpoints=1)
        return base

    def task_cfg(self, name: str) -> dict[str, Any]:
        from omegaconf import OmegaConf

        from vlkit.cli import CONF_DIR

        overrides = (self.compare.get("task_overrides") or {}).get(name) or {}
        return pipeline.plain(OmegaConf.merge(OmegaConf.load(CONF_DIR / "task" / f"{name}.yaml"), overrides))

    def tasks_for(self, spec: RunSpec) -> list[str]:
        from vlkit.registry import MODELS

        tasks = list(self.compare["tasks"])
        if MODELS.get(spec.family).image_input != "regions" and "refexp" in tasks:
            tasks.remove("refexp")  # patch models have no region proposals to point at (README)
        return tasks

    # -- units of work -----------------------------------------------------------------------------
    def variants(self, spec: RunSpec) -> list[str]:
        out = ["pretrained"] if spec.objectives is not None else []
        return out + (["scratch"] if spec.baseline or spec.objectives is None else [])

    def pretrain_units(self) -> list[tuple[int, int]]:
        """(run index, seed) of every pre-training."""
        return [(i, seed) for seed in self.compare["seeds"] for i, s in enumerate(self.specs) if s.objectives is not None]

    def finetune_units(self, index: int, seed: int, variant: str) -> list[tuple[int, int, str, str]]:
        return [(index, seed, variant, task) for task in self.tasks_for(self.specs[index])]

    def run(self, workers: int = 1, threads: int = 1) -> list[dict[str, Any]]:
        """Run every unit (a pre-training, or one fine-tuning of one variant on one task) in ``workers``
        processes of ``threads`` torch threads. Every unit seeds itself and a fine-tuning starts from
        the pre-training saved on disk, so the numbers do not depend on how units are scheduled."""
        for spec in self.specs:  # extract shared features once, before any worker starts
            self.environment(spec)
        pretrain = self.pretrain_units()
        scratch = [u for seed in self.compare["seeds"] for i, spec in enumerate(self.specs)
                   if "scratch" in self.variants(spec) for u in self.finetune_units(i, seed, "scratch")]
        if workers <= 1:
            done = {u: self.run_unit(u) for u in pretrain}
            units = [u for i, seed in pretrain for u in self.finetune_units(i, seed, "pretrained")] + scratch
            done.update({u: self.run_unit(u) for u in units})
        else:
            done = self._run_pool(pretrain, scratch, workers, threads)
        self._collect(done)
        return self.records

    def _run_pool(self, pretrain, scratch, workers: int, threads: int) -> dict[tuple, dict[str, Any]]:
        """Pre-trainings first, baselines behind them; a pre-training's fine-tunings are queued as soon
        as it finishes, so no worker waits for a phase to end."""
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        context = multiprocessing.get_context("spawn")
        done: dict[tuple, dict[str, Any]] = {}
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                 initargs=(self.cfg, self.output_dir, self.progress, threads)) as pool:
            pending = {pool.submit(_unit_in_worker, u): u for u in pretrain + scratch}
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    unit = pending.pop(future)
                    done[unit] = future.result()
                    if len(unit) == 2:
                        pending.update({pool.submit(_unit_in_worker, u): u
                                        for u in self.finetune_units(*unit, "pretrained")})
        return done

    def run_unit(self, unit: tuple) -> dict[str, Any]:
        return self.pretrain_unit(*unit) if len(unit) == 2 else self.finetune_unit(*unit)

    def _pretrain_dir(self, spec: RunSpec, seed: int) -> Path:
        return self.output_dir / "runs" / spec.name / f"seed{seed}" / "pretrain"

    def pretrain_unit(self, index: int, seed: int) -> dict[str, Any]:
        """Pre-train run ``index`` at ``seed`` (saved for its fine-tunings), then score zero-shot retrieval."""
        from accelerate.utils import set_seed

        spec = self.specs[index]
        env = self.environment(spec)
        steps = self.compare["budget"]["pretrain_steps"]
        self.say(f"{spec.name}/seed{seed}: pre-training {spec.family} ({spec.model.get('preset', '')}) for {steps} steps")
        set_seed(seed)
        model = pipeline.build_run_model(env, spec.model)
        seen: list[str] = []
        start = time.perf_counter()
        pre, result = pipeline.pretrain_model(env, model, objective_mix(spec), self.trainer_cfg("pretrain", steps, spec.trainer),
                                              self._pretrain_dir(spec, seed), seed, seen)
        wall = time.perf_counter() - start
        dataset = pipeline.pretraining_dataset(env)
        out = {"wall_s": wall, "ids": digest(seen), "curve": result.history,
               "data": {"pretrain": digest((r["id"], r["image_id"], r["caption"]) for r in dataset.data)},
               "stats": {"pretrain_wall_s": wall, "train_samples_per_s": len(seen) / wall if wall else float("nan"),
                         "pretrain_final_loss": result.history[-1]["loss"] if result.history else float("nan")},
               "metrics": {}}
        if "retrieval" in self.compare["tasks"] and self.compare.get("zero_shot", True):
            out["metrics"] = self._zero_shot(env, pre)
        return out

    def finetune_unit(self, index: int, seed: int, variant: str, task: str) -> dict[str, Any]:
        """Fine-tune the pre-trained (``variant="pretrained"``) or freshly initialised model on ``task``."""
        from accelerate.utils import set_seed

        spec = self.specs[index]
        env = self.environment(spec)
        steps = self.compare["budget"]["finetune_steps"][task]
        self.say(f"{spec.name}/{variant}/seed{seed}: fine-tuning {task} for {steps} steps")
        set_seed(seed)
        model = (pipeline.load_pretraining(self._pretrain_dir(spec, seed)) if variant == "pretrained"
                 else pipeline.build_run_model(env, spec.model))
        out_dir = self.output_dir / "runs" / spec.name / f"seed{seed}" / f"{variant}-{task}"
        seen: list[str] = []
        start = time.perf_counter()
        module, data, _, raw = pipeline.finetune_task(env, model, self.task_cfg(task), self.trainer_cfg("finetune", steps),
                                                      out_dir, seed, (self.compare.get("eval_split", "val"),), seen)
        metrics = {_metric_name(task, k.split("/", 1)[1]): v for k, v in raw.items()}
        out = {"wall_s": time.perf_counter() - start, "metrics": metrics, "params": _parameters(module.model),
               "finetune_ids": {str(out_dir.relative_to(self.output_dir)): digest(seen)},
               "data": {task: digest(_dataset_keys(data.train))}}
        if task == "vqa":
            out["latency_ms"] = inference_latency(module.model, data.train)
        shown = ", ".join(f"{k} {v:.3f}" for k, v in metrics.items() if k in HEADLINE)
        self.say(f"{spec.name}/{variant}/seed{seed}: {task} done ({shown})")
        return out

    def _collect(self, done: dict[tuple, dict[str, Any]]) -> None:
        """One record per (run, variant, seed) from the units' results, in report order."""
        for seed in self.compare["seeds"]:
            for i, spec in enumerate(self.specs):
                for variant in self.variants(spec):
                    pre = done.get((i, seed)) if variant == "pretrained" else None
                    record: dict[str, Any] = {
                        "run": spec.name, "variant": variant, "family": spec.family,
                        "preset": spec.model.get("preset"), "objectives": spec.objectives if pre else None,
                        "mix": spec.mix if pre else None, "seed": seed, **(pre["stats"] if pre else {})}
                    parts = ([pre] if pre else []) + [done[u] for u in self.finetune_units(i, seed, variant)]
                    if pre:
                        self.audit["pretrain_ids"][f"{spec.name}/seed{seed}"] = pre["ids"]
                        self.curves[f"{spec.name}/seed{seed}"] = pre["curve"]
                    for part in parts:
                        record.update(part["metrics"])
                        self.audit["data"].update(part["data"])
                        self.audit["finetune_ids"].update(part.get("finetune_ids", {}))
                        for key in ("params", "latency_ms"):
                            if key in part:
                                record[key] = part[key]
                    record["wall_s"] = sum(p["wall_s"] for p in parts)
                    record["meta_sum"] = _meta_sum(record)
                    self.records.append(record)

    def _zero_shot(self, env, pre: Any) -> dict[str, float]:
        from vlkit.registry import TASKS
        from vlkit.tasks import build_task

        task_cfg = self.task_cfg("retrieval")
        data = TASKS.get("retrieval").build_data(task_cfg, env.tokenizer, env.image_source, env.world)
        task = build_task("retrieval", pre, scorer="itm")
        raw = task.evaluate(data.eval[self.compare.get("eval_split", "val")], batch_size=task_cfg.get("eval_batch_size", 64))
        return {f"zs_{k}": float(v) for k, v in raw.items()}


_WORKER: Comparison | None = None  # the comparison a worker process serves (its environments cached)


def _init_worker(cfg: dict[str, Any], output_dir: Path, progress: bool, threads: int) -> None:
    global _WORKER
    torch.set_num_threads(threads)
    _WORKER = Comparison(cfg, output_dir, progress)


def _unit_in_worker(unit: tuple) -> dict[str, Any]:
    assert _WORKER is not None, "_init_worker did not run"
    return _WORKER.run_unit(unit)


def _dataset_keys(dataset: Any) -> Iterable[Any]:
    data = getattr(dataset, "data", None)
    if data is not None and hasattr(data, "column_names"):
        columns = [c for c in ("id", "image_id") if c in data.column_names]
        return zip(*(data[c] for c in columns))
    return (str(i) for i in range(len(dataset)))


def _metric_name(task: str, key: str) -> str:
    """Task metrics as record keys: the task's own name for its main metric (``vqa``, ``refexp``,
    ``nlvr2``), retrieval's ``ir_r1`` ..., anything else prefixed with the task."""
    return key if task == "retrieval" or key == task or key.startswith(f"{task}_") else f"{task}_{key}"


def _meta_sum(metrics: dict[str, float]) -> float:
    """UNITER's Meta-Sum (VQA + IR R@1 + TR R@1 + NLVR2 + RefExp, in points); NaN when one is missing."""
    keys = ("vqa", "ir_r1", "tr_r1", "nlvr2", "refexp")
    if not all(k in metrics for k in keys):
        return float("nan")
    return 100 * sum(metrics[k] for k in keys)


# ------------------------------------------------------------------------------------------------
# reporting
# ------------------------------------------------------------------------------------------------
BASELINES = ("vqa_majority_baseline", "refexp_random_box", "refexp_upper_bound", "nlvr2_majority_baseline",
             "snli_ve_majority_baseline")
COSTS = ("params", "train_samples_per_s", "latency_ms", "wall_s")


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
                                                               sort_keys=True, default=_json_default))
    keys = sorted({k for r in records for k in r})
    with open(output_dir / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        for r in records:
            writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()})
    plot_results(output_dir, rows, columns, curves)
    return table


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from vlkit import __version__

    out = {"vlkit": __version__, "python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parent.parent
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


# ------------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------------
def plot_results(output_dir: Path, rows: list[dict[str, Any]], columns: list[str],
                 curves: dict[str, list[dict[str, Any]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # metric bars with 95% CIs
    shown = [c for c in columns if c in HEADLINE and c != "meta_sum"]
    if shown:
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(shown)), 4))
        width = 0.8 / max(len(rows), 1)
        for i, row in enumerate(rows):
            means = [100 * row[c]["mean"] if c in row else 0 for c in shown]
            errs = [100 * row[c]["ci95"] if c in row and not math.isnan(row[c]["ci95"]) else 0 for c in shown]
            xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(shown))]
            ax.bar(xs, means, width, yerr=errs, capsize=2, label=f"{row['run']} ({row['variant']})",
                   hatch="//" if row["variant"] == "scratch" else None, alpha=0.6 if row["variant"] == "scratch" else 1)
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels(shown)
        ax.set_ylabel("points (mean ± 95% CI)")
        ax.legend(fontsize=7, ncol=2)
        ax.set_title("downstream metrics")
        fig.tight_layout()
        fig.savefig(output_dir / "metrics.png", dpi=120)
        plt.close(fig)
    # pre-training loss curves, one panel per objective
    objectives = sorted({k[: -len("/loss")] for hist in curves.values() for r in hist for k in r if k.endswith("/loss")})
    if objectives:
        fig, axes = plt.subplots(1, len(objectives), figsize=(3.5 * len(objectives), 3), squeeze=False)
        for ax, name in zip(axes[0], objectives):
            for tag, hist in curves.items():
                points = [(r["step"], r[f"{name}/loss"]) for r in hist if f"{name}/loss" in r]
                if points:
                    ax.plot(*zip(*points), label=tag, linewidth=0.8)
            ax.set_title(f"{name} loss")
            ax.set_xlabel("step")
        axes[0][0].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(output_dir / "loss_curves.png", dpi=120)
        plt.close(fig)


def _shapes_classes() -> tuple[str, ...]:
    from vlkit.data.shapes import OBJECT_CLASSES

    return ("bg",) + OBJECT_CLASSES[1:]


def plot_transport_plan(output_dir: Path, pre: Any, env: Any, image_index: int = 0) -> Path | None:
    """A WRA transport-plan heatmap (words x regions) for one shapes image, from a UNITER run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vlkit.objectives.ot import cosine_cost, ipot

    if env.world is None or "wra" not in pre.objectives:
        return None
    dataset = pipeline.pretraining_dataset(env)
    batch = dataset.collator()([dataset[image_index]])
    pre.eval()
    with torch.no_grad():
        out = pre.model(batch)
        cost = cosine_cost(out.text_states.float(), out.region_states.float())
        _, plan = ipot(cost, out.text_mask.bool(), out.region_mask.bool())
    tokens = env.tokenizer.convert_ids_to_tokens(batch.input_ids[0].tolist())
    soft = batch.region_soft_labels[0] if batch.region_soft_labels is not None else None
    names = getattr(env.world, "object_classes", None) or _shapes_classes()
    labels = [f"{j}:{names[int(c.argmax())]}" for j, c in enumerate(soft)] if soft is not None else None
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.imshow(plan[0].numpy(), aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(tokens)))
    ax.set_yticklabels(tokens, fontsize=7)
    if labels:
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=90, fontsize=6)
    ax.set_title(f"WRA transport plan, image {batch.image_ids[0]}")
    fig.tight_layout()
    path = output_dir / "wra_plan.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------------------
def main(cfg: Any) -> int:
    cfg = resolve_config(cfg)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    output_dir = Path(cfg.get("output_dir") or Path("outputs") / "compare" / stamp)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise FileExistsError(f"{output_dir} is not empty: choose another output_dir= (results are never overwritten)")
    output_dir.mkdir(parents=True, exist_ok=True)
    import os

    workers = int(cfg.get("workers") or min(2, os.cpu_count() or 1))
    threads = int(cfg.get("threads") or 1)
    torch.set_num_threads(threads)
    start = time.perf_counter()
    comparison = Comparison(cfg, output_dir, progress=cfg.get("progress", True))
    comparison.say(f"{len(comparison.specs)} run(s) x {len(cfg['compare']['seeds'])} seed(s) on {workers} worker(s) "
                   f"x {threads} thread(s)")
    records = comparison.run(workers, threads)
    wall = time.perf_counter() - start
    audit = comparison.audit
    audit["data_hash"] = digest(sorted(audit["data"].items()))
    expected = cfg.get("expected_data_hash")
    if expected and expected != audit["data_hash"]:
        raise RuntimeError(f"the data differ from the manifest's (hash {audit['data_hash'][:12]} != {expected[:12]})")
    wra = next((s for s in comparison.specs if s.objectives is not None and "wra" in (objective_mix(s) or {})
                .get("objectives", {}).get("itm", {})), None)
    if wra is not None:  # the transport plan of the first UNITER-style run with WRA, first seed
        run_dir = output_dir / "runs" / wra.name / f"seed{cfg['compare']['seeds'][0]}" / "pretrain"
        plot_transport_plan(output_dir, pipeline.load_pretraining(run_dir), comparison.environment(wra))
    store = next((env.data["image"].get("path") for env in comparison._environments.values()
                  if env.data["image"].get("source") == "features"), None)
    manifest = {
        "config": {k: v for k, v in cfg.items() if k not in ("output_dir", "manifest", "expected_data_hash")},
        "seeds": cfg["compare"]["seeds"],
        "data": {"hash": audit["data_hash"], "parts": audit["data"]},
        "ids_seen": {"pretrain": audit["pretrain_ids"], "finetune": audit["finetune_ids"]},
        "feature_store": {"path": store, "sha256": pipeline.file_digest(store)} if store else None,
        "packages": package_versions(),
        "git_commit": git_commit(),
        "command": " ".join(sys.argv),
        "wall_s": wall,
    }
    from vlkit.io import atomic_write_text

    atomic_write_text(output_dir / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True, default=_json_default))
    table = write_outputs(output_dir, cfg, records, audit, comparison.curves, wall)
    print(f"\n{table}\n\nwall time {wall:.0f} s; results in {output_dir}")
    return 0
