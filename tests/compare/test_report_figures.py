"""Issue 43: a comparison's report and figures are titled with the runs it compares (a preset's title only with
the preset's runs); loss curves give each run its colour and each seed its line style; CI bars stay in [0, 100]."""
from __future__ import annotations

import math

import pytest
from matplotlib.colors import to_rgba

from vlkit.cli import compose
from vlkit.compare.config import comparison_title, drop_preset_run_keys
from vlkit.compare.plots import confidence_bar, curves_figure, metrics_figure
from vlkit.compare.report import write_outputs

RUNS = "- {name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter}\n" \
       "- {name: meter, model: meter, objectives: meter}\n"
DEFAULT_TITLE = "ViLBERT vs UNITER vs METER on the shapes world (tiny presets)"


# -- the title --------------------------------------------------------------------------------------------
def test_the_title_comes_from_the_runs_compared(tmp_path):
    assert comparison_title(compose("compare", []).compare) == DEFAULT_TITLE  # the default keeps its own
    listed = tmp_path / "mine.yaml"
    listed.write_text(RUNS)
    assert comparison_title(compose("compare", [f"compare={listed}"]).compare) == "uniter vs meter"
    partial = tmp_path / "partial.yaml"
    partial.write_text("seeds: [0]\nruns:\n  - {name: a, model: uniter}\n  - {name: b, model: vilbert}\n")
    assert comparison_title(compose("compare", [f"compare={partial}"]).compare) == "a vs b"
    seeds_only = tmp_path / "seeds.yaml"  # the default's runs: its title stays
    seeds_only.write_text("seeds: [0, 1]\n")
    assert comparison_title(compose("compare", [f"compare={seeds_only}"]).compare) == DEFAULT_TITLE
    titled = tmp_path / "titled.yaml"
    titled.write_text("title: my ablation\nruns:\n  - {name: a, model: uniter}\n")
    assert comparison_title(compose("compare", [f"compare={titled}"]).compare) == "my ablation"
    # compare.runs= on the command line: the preset's title and claims (they name its runs) go unless given too
    headline = [{"claim": "c", "a": "vilbert", "b": "vilbert/scratch", "metric": "vqa"}]
    compare = {"title": DEFAULT_TITLE, "claims": headline,
               "runs": [{"name": "x", "model": "uniter"}, {"name": "y", "model": "meter"}]}
    drop_preset_run_keys(compare, {"compare.seeds"})
    assert comparison_title(compare) == DEFAULT_TITLE and compare["claims"] == headline
    drop_preset_run_keys(compare, {"compare.runs", "compare.seeds"})
    assert comparison_title(compare) == "x vs y" and compare["claims"] == []
    compare.update(title="given", claims=headline)
    drop_preset_run_keys(compare, {"compare.runs", "compare.title", "compare.claims"})
    assert comparison_title(compare) == "given" and compare["claims"] == headline
    # a comparison file with runs of its own inherits neither the default's title nor its claims
    assert compose("compare", [f"compare={partial}"]).compare.claims == []
    assert len(compose("compare", [f"compare={seeds_only}"]).compare.claims) == 3  # the default's runs: its claims


def _write(tmp_path, compare):
    recs = [{"run": run, "variant": variant, "family": run, "preset": "tiny", "objectives": None, "seed": s,
             "vqa": 0.5 + 0.01 * s + (0.05 if variant == "pretrained" else 0)}
            for run in ("uniter", "meter") for variant in ("pretrained", "scratch") for s in range(3)]
    account = {"sessions": [], "wall_s": 1.0, "unit_s": 1.0, "wasted_unit_s": 0.0, "attempts": 1, "died": 0,
               "failed": 0, "device_hours": 1 / 3600, "wasted_device_hours": 0.0, "mfu": None, "units": {},
               "plan": {"device": "cpu", "mfu": 0.3, "mfu_source": "s", "flops": 1e9, "device_hours": 0.001}}
    cfg = {"compare": {"seeds": [0, 1, 2], "budget": {"pretrain_steps": 1}, **compare}, "data": {"name": "d"}}
    curves = {f"{run}/seed{s}": [{"step": k, "mlm/loss": 2.0 - k / 10} for k in range(3)]
              for run in ("uniter", "meter") for s in range(3)}
    write_outputs(tmp_path, cfg, recs, {"data_hash": "0" * 12}, curves, account)
    return (tmp_path / "results.md").read_text()


def test_results_md_carries_the_title_and_nothing_else_depends_on_it(tmp_path, monkeypatch):
    """The title is results.md's first line only: scripts/readme_tables.py, which leaves that line out, writes
    the same tables whatever the title."""
    titles = []
    import vlkit.compare.report as report

    real = report.plot_results
    monkeypatch.setattr(report, "plot_results", lambda *a: (titles.append(a[-1]), real(*a))[1])
    runs = [{"name": "uniter", "model": "uniter"}, {"name": "meter", "model": "meter"}]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    derived = _write(tmp_path / "a", {"title": None, "runs": runs})
    given = _write(tmp_path / "b", {"title": DEFAULT_TITLE, "runs": runs})
    assert derived.startswith("# vlkit compare: uniter vs meter\n") and titles[0] == "uniter vs meter"
    assert given.startswith(f"# vlkit compare: {DEFAULT_TITLE}\n") and titles[1] == DEFAULT_TITLE
    assert derived.split("\n", 2)[2] == given.split("\n", 2)[2]  # what readme_tables.block keeps
    assert (tmp_path / "a" / "metrics.png").stat().st_size > 0 and (tmp_path / "a" / "loss_curves.png").stat().st_size > 0


def test_figures_are_titled_with_the_comparison():
    rows = [{"run": "uniter", "variant": "pretrained", "vqa": {"mean": 0.5, "ci95": 0.1}}]
    fig = metrics_figure(rows, ["vqa"], {}, "uniter vs meter")
    assert fig.axes[0].get_title() == "uniter vs meter: downstream metrics"
    fig = curves_figure({"uniter/seed0": [{"step": 0, "mlm/loss": 1.0}]}, "uniter vs meter")
    assert fig._suptitle.get_text() == "uniter vs meter: pre-training losses"


# -- loss curves: a colour per run, a line style per seed ------------------------------------------------
def test_each_run_has_a_colour_and_each_seed_a_line_style():
    curves = {f"{run}/seed{s}": [{"step": k, "mlm/loss": 2.0 - k / 10 - s / 100, "itm/loss": 0.7} for k in range(4)]
              for run in ("uniter", "uniter_joint", "meter") for s in (0, 1, 2)}
    fig = curves_figure(curves)
    assert len(fig.axes) == 2
    for ax in fig.axes:
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == set(curves)
        colour = {tag: to_rgba(line.get_color()) for tag, line in lines.items()}
        style = {tag: line.get_linestyle() for tag, line in lines.items()}
        for run in ("uniter", "uniter_joint", "meter"):
            assert len({colour[f"{run}/seed{s}"] for s in (0, 1, 2)}) == 1  # a run's seeds share its colour
            assert len({style[f"{run}/seed{s}"] for s in (0, 1, 2)}) == 3  # and differ in line style
        for s in (0, 1, 2):
            assert len({colour[f"{run}/seed{s}"] for run in ("uniter", "uniter_joint", "meter")}) == 3
            assert len({style[f"{run}/seed{s}"] for run in ("uniter", "uniter_joint", "meter")}) == 1
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["uniter", "uniter_joint", "meter", "seed 0", "seed 1", "seed 2"]


# -- CI bars: inside the metric's range -------------------------------------------------------------------
def test_confidence_bars_are_clipped_to_0_100():
    assert confidence_bar(98.0, 5.0) == pytest.approx((5.0, 2.0))
    assert confidence_bar(1.0, 5.0) == pytest.approx((1.0, 5.0))
    assert confidence_bar(100.0, 3.0) == (3.0, 0.0) and confidence_bar(0.0, 3.0) == (0.0, 3.0)
    assert confidence_bar(50.0, math.nan) == (0.0, 0.0) and confidence_bar(50.0, math.inf) == (0.0, 0.0)
    rows = [{"run": "a", "variant": "pretrained", "vqa": {"mean": 0.98, "ci95": 0.2}, "nlvr2": {"mean": 0.03, "ci95": 0.2}},
            {"run": "a", "variant": "scratch", "vqa": {"mean": 1.0, "ci95": 0.5}},
            {"run": "b", "variant": "pretrained", "vqa": {"mean": 0.5, "ci95": 0.1}, "nlvr2": {"mean": 0.5, "ci95": math.nan}}]
    ax = metrics_figure(rows, ["vqa", "nlvr2", "meta_sum"], {"vqa": 0.3}).axes[0]
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    ends = [y for c in bars for segment in c.lines[2][0].get_segments() for _, y in segment]
    assert len(bars) == 3 and min(ends) == pytest.approx(0.0) and max(ends) == pytest.approx(100.0)
    assert all(0.0 <= y <= 100.0 for y in ends)
    assert ax.get_ylim()[1] > 100.0 and max(ax.get_yticks()) == 100  # the cap at 100 is drawn inside the frame
    assert [t.get_text() for t in ax.get_xticklabels()] == ["vqa", "nlvr2"]  # Meta-Sum (points, not %) not drawn
