"""Write the comparison tables of the documentation from real runs, so that every figure there can be
regenerated.

    python scripts/readme_tables.py default             # runs `vlkit compare` (cold cache), then updates its page
                                                        # and README.md's figure of the main job
    python scripts/readme_tables.py claims              # the same for compare=claims, and its verdicts in README.md
    python scripts/readme_tables.py default --from outputs/readme/default   # reuse a finished run's results
    python scripts/readme_tables.py claims compare.until=decided compare.max_seeds=6 --from D --wall 4200
    python scripts/readme_tables.py plans               # the FLOP plans: docs/cluster.md, docs/compare-plans.md, README
    python scripts/readme_tables.py account             # a smoke comparison killed twice and resumed: its account
                                                        # of what it spent, in docs/compare.md
    python scripts/readme_tables.py smoke-time          # the wall time of `vlkit compare compare=smoke` (cold
                                                        # cache), with the machine's load: README.md's tour

Each comparison's block lies on its own page, ``docs/compare-<NAME>.md``, between ``<!-- BEGIN compare:NAME -->``
and ``<!-- END compare:NAME -->``, and holds the command, the wall time of the whole command (cold feature
cache unless ``--cache-dir`` is given), the git commit and the report `vlkit compare` wrote (``results.md``
without its title). The comparison's ``metrics.png`` is copied beside the page, to
``docs/compare_<NAME>_metrics.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def page(name: str) -> Path:
    """The documentation page that holds comparison ``name``'s block."""
    return DOCS / f"compare-{name}.md"


def run_comparison(name: str, output: Path, cache_dir: Path | None, extra: list[str]) -> float:
    """``vlkit compare compare=NAME EXTRA`` into ``output``; the wall time of the whole command."""
    cache = cache_dir or Path(tempfile.mkdtemp(prefix="vlkit-readme-cache-"))  # cold: extraction included
    command = [sys.executable, "-m", "vlkit.cli", "compare", f"compare={name}", *extra, f"output_dir={output}",
               f"cache_dir={cache}"]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    wall = time.perf_counter() - start
    if cache_dir is None:
        shutil.rmtree(cache, ignore_errors=True)
    return wall


def provenance(name: str, manifest: dict) -> tuple[str, str]:
    """Where figures come from: ``commit `<12 hex>` `` (a comparison's ``manifest.json`` or ``{"git_commit": ...}``)
    and ``written by `python scripts/readme_tables.py NAME` ``."""
    return f"commit `{(manifest.get('git_commit') or 'unknown')[:12]}`", f"written by `python scripts/readme_tables.py {name}`"


def shown(name: str, extra: list[str] = ()) -> str:
    return " ".join(["vlkit compare", f"compare={name}", *extra])


def without_paths(text: str, output: Path) -> str:
    """``text`` with this machine's paths replaced: the comparison's folder by D, a ``cache_dir=`` by CACHE."""
    text = text.replace(str(Path(output).resolve()), "D").replace(str(output), "D")
    return re.sub(r"cache_dir=[^\s`|]+", "cache_dir=CACHE", text)


def block(name: str, output: Path, wall: float | None, extra: list[str] = ()) -> str:
    manifest = json.loads((output / "manifest.json").read_text())
    report = without_paths((output / "results.md").read_text().split("\n", 2)[2].strip(), output)  # without the title
    report = re.sub(r"^#+ ", "## ", report, flags=re.M)  # sections of the page
    sessions = len((manifest.get("account") or {}).get("sessions") or [None])
    wall_text = f"{wall:.0f} s wall for the whole command" if wall is not None else \
        f"{manifest['wall_s']:.0f} s of comparison over {sessions} session(s) (reused results)"
    figure = f"compare_{name}_metrics.png"  # beside the page
    commit, written = provenance(name, manifest)
    return "\n".join([
        f"`{shown(name, extra)}`: {wall_text}, {commit}, torch {manifest['packages'].get('torch')}, {written}.", "",
        report, "", f"![{name} metrics]({figure})"])


def verdicts(name: str, output: Path, wall: float | None, extra: list[str] = ()) -> str | None:
    """README.md's summary of a comparison's claims (None when it tests none): each claim's verdict with its
    effect and Holm p, the counts, and where the run came from."""
    from vlkit.compare.report import claims_table

    result = json.loads((output / "results.json").read_text())
    claims = result["claims"]
    if not claims:
        return None
    detectable = ", ".join(f"{metric} {100 * result['detectable_effects'][metric]['mde']:.1f}"
                           for metric in sorted({c["metric"] for c in claims}) if metric in result["detectable_effects"])
    manifest = json.loads((output / "manifest.json").read_text())
    counts = {v: sum(c["verdict"] == v for c in claims) for v in ("reproduced", "contradicted", "inconclusive",
                                                                   "running") if v != "running" or
              any(c["verdict"] == v for c in claims)}
    seeds = f"seeds until decided at looks after {result['looks']} seeds" if result.get("looks") else \
        f"{len(manifest['seeds'])} seeds"
    wall_text = f"{wall:,.0f} s wall" if wall is not None else f"{manifest['wall_s']:,.0f} s of comparison"
    commit, written = provenance(name, manifest)
    return "\n".join([
        f"`{shown(name, extra)}` ({seeds}, {wall_text}, {commit}, {written}): "
        + ", ".join(f"{n} {v}" for v, n in counts.items()) + f". Minimum detectable effect (points): {detectable}.", "",
        claims_table(claims)])


def main_job_wall(output: Path, wall: float) -> str:
    """README.md's figure of the main job: its wall time and the machine's speed while it ran."""
    gemm = json.loads((output / "manifest.json").read_text())["machine"]["gemm_gflops"]
    return (f"({wall:,.0f} s at the last documented run, on 2 CPU cores whose one-thread fp32 GEMM measured "
            f"{gemm['median']:.0f} GFLOPS, median after each unit)")


def update_page(name: str, text: str) -> None:
    update_block(page(name), f"compare:{name}", text)


def update_block(path: Path, marker: str, text: str) -> None:
    """Replace what lies between ``<!-- BEGIN marker -->`` and ``<!-- END marker -->`` in ``path``."""
    begin, end = f"<!-- BEGIN {marker} -->", f"<!-- END {marker} -->"
    current = path.read_text(encoding="utf-8") if path.is_file() else ""
    if begin not in current or end not in current:
        raise SystemExit(f"{path.relative_to(ROOT)} has no {begin} ... {end} block")
    head, rest = current.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{tail}", encoding="utf-8")


def vlkit(*args: str, cwd: Path = ROOT) -> str:
    """The standard output of ``vlkit ARGS``; exits with the end of its standard error when it fails."""
    done = subprocess.run([sys.executable, "-m", "vlkit.cli", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"vlkit {' '.join(args)} failed (exit code {done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


BASE_RUNS = """# @package _global_
defaults:
  - base
  - _self_
compare:
  task_overrides:
    vqa: {{source: files, files: {{train: {{questions: {data}/vqa/v2_OpenEnded_mscoco_train2014_questions.json,
                                         annotations: {data}/vqa/v2_mscoco_train2014_annotations.json}},
                                  val: {{questions: {data}/vqa/v2_OpenEnded_mscoco_val2014_questions.json,
                                       annotations: {data}/vqa/v2_mscoco_val2014_annotations.json}}}}}}
    retrieval: {{source: files, path: {data}/dataset_coco.json}}
    refexp: {{source: files, refs: "{data}/refcoco/refs(unc).json", instances: {data}/refcoco/instances.json}}
    nlvr2: {{source: files, files: {{train: {data}/nlvr2/train.json, val: {data}/nlvr2/dev.json}}}}
  runs:
    - {{name: vilbert, model: {{name: vilbert, preset: base}}, objectives: vilbert}}
    - {{name: uniter, model: {{name: uniter, preset: base}}, objectives: uniter}}
    - {{name: meter, model: {{name: meter, preset: clip16-roberta}}, objectives: meter,
       data: {{image: {{source: folder, path: {data}/images}}}}}}
"""


# a paper's recipe as a plan (conf/compare/paper_*.yaml) -> (what, the device-hours its paper reports, where, word for
# word, and whether that figure is traced to this recipe); an implied MFU is shown only for a traced pairing
PAPERS = {
    "paper_uniter": ("UNITER-base, in-domain (COCO + VG)", 882.0,
                     "882 V100 GPU-hours, as this project has quoted the UNITER paper since issue 42; the sentence "
                     "could not be retrieved word for word here, nor whether it is this in-domain run or the all-data "
                     "run of the paper's main base model", False),
    "paper_uniter_alldata": ("UNITER-base, all data (COCO + VG + CC + SBU)", None,
                             "not traced: the figure above may belong to this run", False),
    "paper_meter": ("METER, CLIP-ViT-B/32 + RoBERTa-base", None,
                    "not traced: \"3 days on 8 A100s\", quoted here before, is not found in the paper; a review "
                    "(issue 53) reads about 8 days for CLIP-ViT-B/16 and Swin-B, not this B/32 model", False),
    "paper_vilbert": ("ViLBERT, Conceptual Captions", None, "not reported (the paper names 8 TitanX GPUs, no time)",
                      False),
}


def paper_plans() -> list[str]:
    """The papers' recipes planned in FLOPs beside the hours each paper reports: a markdown table."""
    from vlkit.cli import compose
    from vlkit.compare import Comparison, resolve_config
    from vlkit.compare.costs import cost_settings, count_costs

    lines = ["| recipe | device | steps | examples / step | planned PFLOP | paper's device-hours (source) | implied MFU "
             "| vlkit's default MFU | planned device-hours at it |", "|---|---|---|---|---|---|---|---|---|"]
    for name, (what, reported, where, traced) in PAPERS.items():
        cfg = resolve_config(compose("compare", [f"compare={name}"]))
        comparison = Comparison(cfg, ".", progress=False)
        costs = count_costs(comparison, cost_settings(cfg["compare"]), int(cfg["compare"]["gpus_per_unit"]))
        row = costs.units[0]
        peak = costs.device.peak(row.precision)
        implied = f"{row.flops / (reported * 3600 * peak):.1%}" if reported and traced else "–"
        lines.append(f"| {what} (`compare={name}`) | {costs.device.name}, {row.precision} | {row.steps:,} | "
                     f"{row.shapes.batch_size:,} | {row.flops / 1e15:,.0f} | "
                     f"{f'{reported:,.0f}' if reported else '–'} ({where}) | {implied} | {costs.mfu:.1%} | "
                     f"{costs.hours:,.0f} |")
    return lines


def plans(cache_dir: Path | None) -> None:
    """The FLOP plans of the default comparison (this CPU), of the base-size one on real data files (8 GPUs a unit,
    no file read) and of the papers' own recipes; written to docs/cluster.md, docs/compare-plans.md and README.md."""
    work = Path(tempfile.mkdtemp(prefix="vlkit-plans-"))
    cache = cache_dir or work / "cache"
    start = time.perf_counter()
    default = vlkit("compare", "compare=default", "dry_run=true", f"cache_dir={cache}")
    default_s = time.perf_counter() - start
    runs = work / "my_base.yaml"
    runs.write_text(BASE_RUNS.format(data="DATA_DIR"))
    base_args = [f"compare={runs}", "data=coco", "data.path=DATA_DIR/dataset_coco.json", "data.split=[train]",
                 "data.image.path=DATA_DIR/feats.h5", "dry_run=true", "compare.gpus_per_unit=8",
                 "compare.slurm.nodes=1", "compare.slurm.array_parallelism=16", f"cache_dir={cache}"]
    start = time.perf_counter()
    base = vlkit("compare", *base_args)
    base_s = time.perf_counter() - start
    shown = " ".join(a for a in base_args if not a.startswith(("cache_dir=", "compare=")))
    texts = {"default": ("vlkit compare compare=default dry_run=true", default, default_s),
             "base": (f"vlkit compare compare=my_base.yaml {shown}", base, base_s)}
    commit, written = provenance("plans", {"git_commit": subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()})
    summary = []
    for name, (command, out, seconds) in texts.items():
        update_block(DOCS / "cluster.md", f"plan:{name}", "\n".join([
            f"`{command}` ({commit}, {seconds:.0f} s on this project's 2-core CPU, {written}):", "",
            "```text", out.strip(), "```"]))
        summary.append(f"- `{name}`: " + next(line for line in out.splitlines() if line.startswith("Total:")))
    update_block(DOCS / "cluster.md", "base-runs", f"```yaml\n# my_base.yaml\n{BASE_RUNS.format(data='DATA_DIR')}```")
    papers = paper_plans()
    update_block(DOCS / "compare-plans.md", "plans:papers", "\n".join([f"{commit}, {written}:", "", *papers]))
    update_block(ROOT / "README.md", "plan-summary", f"FLOP plans, {written} at {commit} (docs/cluster.md, "
                 "docs/compare-plans.md):\n\n" + "\n".join(summary) + "\n\nThe papers' own pre-training recipes "
                 "planned the same way, beside the hours they report:\n\n" + "\n".join(papers))
    shutil.rmtree(work, ignore_errors=True)
    print("docs/cluster.md, docs/compare-plans.md and README.md: plans written")


def _finished_units(output: Path) -> tuple[int, bool]:
    """How many of a comparison's units finished, and whether one is running now."""
    states = []
    for path in (output / "runs").glob("*/*/*/unit.json"):
        try:
            states.append(json.loads(path.read_text())["state"])
        except (OSError, json.JSONDecodeError, KeyError):
            continue
    return states.count("finished"), "running" in states


def account(cache_dir: Path | None) -> None:
    """The smoke comparison SIGKILLed (its whole process group) after 6 and after 20 finished units, each time
    while a unit runs, then finished by a third session: the "What it spent" section of its results.md, with the
    commands, in docs/compare.md."""
    work = Path(tempfile.mkdtemp(prefix="vlkit-account-"))
    output, cache = work / "smoke", cache_dir or work / "cache"
    extra = ["compare=smoke", "compare.checkpoint_every=2", "compare.heartbeat_s=1", "progress=false"]
    command = [sys.executable, "-m", "vlkit.cli", "compare", *extra, f"output_dir={output}", f"cache_dir={cache}"]
    for kill_after in (6, 20, None):
        process = subprocess.Popen(command + (["resume=true"] if output.exists() else []), cwd=ROOT,
                                   start_new_session=True, stdout=subprocess.DEVNULL)
        while kill_after is not None:
            done, running = _finished_units(output)
            if done >= kill_after and running:
                os.killpg(process.pid, signal.SIGKILL)
                break
            if process.poll() is not None:
                raise SystemExit(f"the comparison ended before {kill_after} units finished")
            time.sleep(0.2)
        process.wait()
    section = (output / "results.md").read_text().split("## What it spent", 1)[1].strip()
    manifest = json.loads((output / "manifest.json").read_text())
    commit, written = provenance("account", manifest)
    shown_command = f"vlkit compare {' '.join(extra)} output_dir=D cache_dir=CACHE"
    text = "\n".join([f"`{shown_command}`, SIGKILLed (its process group) after 6 and after 20 finished units, then "
                      f"`{shown_command} resume=true` twice; {commit}, {written}. From its `results.md`:", "",
                      without_paths(section, output)])
    update_block(DOCS / "compare.md", "account:smoke", text)
    shutil.rmtree(work, ignore_errors=True)
    print("docs/compare.md: the account of a resumed smoke comparison written")


def smoke_time(cache_dir: Path | None) -> None:
    """``vlkit compare compare=smoke`` timed as a user runs it (a cold feature cache unless ``--cache-dir``), with
    the CPUs and their 1-minute load average before and after: the tour's figure in README.md."""
    work = Path(tempfile.mkdtemp(prefix="vlkit-smoke-time-"))
    load = os.getloadavg()[0]
    wall = run_comparison("smoke", work / "smoke", cache_dir, ["progress=false"])
    after = os.getloadavg()[0]
    manifest = json.loads((work / "smoke" / "manifest.json").read_text())
    commit, written = provenance("smoke-time", manifest)
    update_block(ROOT / "README.md", "smoke-time",
                 f"{wall:.0f} s (`vlkit compare compare=smoke`, cold feature cache, {os.cpu_count()} CPUs at a 1-minute "
                 f"load average of {load:.1f} before and {after:.1f} after, {commit}, {written})")
    shutil.rmtree(work, ignore_errors=True)
    print(f"README.md: the smoke comparison took {wall:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="a comparison preset: default, claims, ...")
    parser.add_argument("--from", dest="source", type=Path, help="a finished comparison's output_dir to reuse")
    parser.add_argument("--output", type=Path, help="where to run the comparison (default: outputs/readme/NAME)")
    parser.add_argument("--cache-dir", type=Path, help="a feature cache to reuse (default: a cold, temporary one)")
    parser.add_argument("--wall", type=float, help="with --from: the wall seconds of the commands that made it (a "
                        "resumed comparison: the sum of its sessions, measured outside)")
    parser.add_argument("extra", nargs="*", help="overrides of the comparison (e.g. compare.until=decided), shown in "
                        "the command")
    args = parser.parse_args()
    if args.name == "plans":
        return plans(args.cache_dir)
    if args.name == "account":
        return account(args.cache_dir)
    if args.name == "smoke-time":
        return smoke_time(args.cache_dir)
    if args.source:
        output, wall = args.source, args.wall
    else:
        output = args.output or ROOT / "outputs" / "readme" / args.name
        if output.exists():
            raise SystemExit(f"{output} exists: pass --from {output} to reuse it, or remove it")
        wall = run_comparison(args.name, output, args.cache_dir, args.extra)
    update_page(args.name, block(args.name, output, wall, args.extra))
    summary = verdicts(args.name, output, wall, args.extra)
    if summary is not None:
        update_block(ROOT / "README.md", f"verdicts:{args.name}", summary)
    if args.name == "default" and wall is not None:  # README's tour quotes the main job's wall time
        update_block(ROOT / "README.md", "wall:default", main_job_wall(output, wall))
    shutil.copyfile(output / "metrics.png", DOCS / f"compare_{args.name}_metrics.png")
    print(f"{page(args.name).relative_to(ROOT)}: compare:{args.name} block written from {output}")


if __name__ == "__main__":
    main()
