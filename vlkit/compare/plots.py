"""The plots of a comparison: metric bars with CIs (clipped to the metric's range) and chance lines, pre-training
loss curves (one colour per run, one line style per seed, in every panel) and a WRA transport plan next to its
image, boxes and caption."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from vlkit.compare.records import POINTS
from vlkit.train import pipeline


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colours(names: list[str]) -> dict[str, Any]:
    plt = _pyplot()
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: cmap(k % cmap.N) for k, name in enumerate(names)}


LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))  # one per seed of a run


def confidence_bar(mean: float, ci: float, low: float = 0.0, high: float = POINTS) -> tuple[float, float]:
    """(length below, length above) ``mean`` of its 95% CI ``mean ± ci`` clipped to the metric's range
    [``low``, ``high``]; an undefined CI (one seed) has none."""
    ci = ci if math.isfinite(ci) else 0.0
    return mean - max(low, min(high, mean - ci)), max(low, min(high, mean + ci)) - mean


def metrics_figure(rows: list[dict[str, Any]], metrics: list[str], chance: dict[str, float], title: str = ""):
    """Bars (mean, points: a record's fractions times `POINTS`) with 95% CIs clipped to [0, 100] (`confidence_bar`); a metric a row lacks gets no bar
    (not a zero); a dashed line per metric at its chance level. None when there is nothing to show."""
    plt = _pyplot()
    shown = [m for m in metrics if m != "meta_sum"]  # Meta-Sum is a sum of points, not in [0, 100]
    if not shown or not rows:
        return None
    colours = _colours(list(dict.fromkeys(r["run"] for r in rows)))
    fig, ax = plt.subplots(figsize=(max(6, 1.7 * len(shown)), 4.2))
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        xs, means, below, above = [], [], [], []
        for j, m in enumerate(shown):
            if m not in row:
                continue
            mean = POINTS * row[m]["mean"]
            down, up = confidence_bar(mean, POINTS * row[m]["ci95"])
            xs.append(j + (i - (len(rows) - 1) / 2) * width)
            means.append(mean)
            below.append(down)
            above.append(up)
        scratch = row["variant"] == "scratch"
        ax.bar(xs, means, width, yerr=[below, above], capsize=2, color=colours[row["run"]],
               alpha=0.45 if scratch else 1, hatch="//" if scratch else None, label=f"{row['run']} ({row['variant']})")
    for j, m in enumerate(shown):
        if m in chance:
            ax.hlines(POINTS * chance[m], j - 0.45, j + 0.45, colors="black", linestyles="dashed", linewidth=1,
                      label="chance / trivial baseline" if j == next(k for k, x in enumerate(shown) if x in chance) else None)
    ax.set_xticks(range(len(shown)))
    ax.set_xticklabels(shown)
    ax.set_ylim(0, 105)  # a CI clipped at 100 shows its cap below the frame, not running into it
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("points (mean, 95% CI)")
    ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(f"{title}: downstream metrics" if title else "downstream metrics", fontsize=10)
    fig.tight_layout()
    return fig


def curves_figure(curves: dict[str, list[dict[str, Any]]], title: str = ""):
    """One panel per objective's loss: one colour per run, one line style per seed (``<run>/seed<k>`` tags),
    the same in every panel, one legend for the figure. None when no curve holds a loss."""
    plt = _pyplot()
    objectives = sorted({k[: -len("/loss")] for hist in curves.values() for r in hist for k in r if k.endswith("/loss")})
    if not objectives:
        return None
    runs = list(dict.fromkeys(tag.split("/seed")[0] for tag in curves))
    seeds = list(dict.fromkeys(tag.partition("/seed")[2] for tag in curves))
    colours = _colours(runs)
    styles = {seed: LINESTYLES[k % len(LINESTYLES)] for k, seed in enumerate(seeds)}
    fig, axes = plt.subplots(1, len(objectives), figsize=(3.4 * len(objectives), 3.4), squeeze=False)
    for ax, name in zip(axes[0], objectives):
        for tag, hist in curves.items():
            points = [(r["step"], r[f"{name}/loss"]) for r in hist if f"{name}/loss" in r]
            if points:
                run, _, seed = tag.partition("/seed")
                ax.plot(*zip(*points), color=colours[run], linestyle=styles[seed], linewidth=0.8, alpha=0.85,
                        label=tag)
        ax.set_title(f"{name} loss", fontsize=9)
        ax.set_xlabel("step")
    handles = [plt.Line2D([], [], color=colours[r], label=r) for r in runs]
    handles += [plt.Line2D([], [], color="grey", linestyle=styles[s], label=f"seed {s}") for s in seeds if s]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 8), fontsize=7)
    if title:
        fig.suptitle(f"{title}: pre-training losses", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def _save(fig: Any, path: Path) -> None:
    if fig is not None:
        fig.savefig(path, dpi=120)
        _pyplot().close(fig)


def plot_results(output_dir: Path, rows: list[dict[str, Any]], metrics: list[str],
                 curves: dict[str, list[dict[str, Any]]], chance: dict[str, float], title: str = "") -> None:
    """``metrics.png`` and ``loss_curves.png``, titled with the comparison's ``title``."""
    _save(metrics_figure(rows, metrics, chance, title), output_dir / "metrics.png")
    _save(curves_figure(curves, title), output_dir / "loss_curves.png")


def plot_alignment(output_dir: Path, pre: Any, env: Any, image_index: int = 0) -> Path | None:
    """The word-region alignment of the objective of a run's mix that shows one (`Objective.alignment`: WRA's
    transport plan, words x regions, with a colour bar) beside its image with the numbered region boxes and
    the caption, for one example of the run's pre-training data: ``<objective>_plan.png``."""
    objective = pre.shown_alignment()
    if env.world is None or objective is None:
        return None
    plt = _pyplot()
    dataset = pipeline.pretraining_dataset(env)
    example = dataset[image_index]
    batch = dataset.collator()([example])
    pre.eval()
    with torch.no_grad():
        plan = objective.alignment(pre.model(batch))
    tokens = env.tokenizer.convert_ids_to_tokens(batch.input_ids[0].tolist())
    image = env.world.load_image(example["image_id"])
    boxes = batch.region_boxes[0] * torch.tensor([image.width, image.height] * 2)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5), gridspec_kw={"width_ratios": [1, 1.4]})
    left.imshow(image)
    for j, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
        left.add_patch(plt.Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, color="white", linewidth=0.8))
        left.text(x1 + 1, y1 + 4, str(j), color="white", fontsize=6)
    left.set_axis_off()
    left.set_title(f"image {example['image_id']}: {len(boxes)} regions", fontsize=9)
    shown = plan[0].numpy()
    heat = right.imshow(shown, aspect="auto", cmap="viridis")
    right.set_yticks(range(len(tokens)))
    right.set_yticklabels(tokens, fontsize=6)
    right.set_xticks(range(shown.shape[1]))
    right.set_xticklabels([str(j) for j in range(shown.shape[1])], fontsize=6)
    right.set_xlabel("region")
    fig.colorbar(heat, ax=right, label=objective.alignment_unit)
    caption = dataset.data[image_index]["caption"]
    fig.suptitle(f"{objective.alignment_title}: \"{caption}\"", fontsize=8, wrap=True)
    fig.tight_layout()
    path = output_dir / f"{objective.name}_plan.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
