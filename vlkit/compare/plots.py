"""The plots of a comparison: metric bars with CIs and chance lines, pre-training loss curves (one colour
per run in every panel) and a WRA transport plan next to its image, boxes and caption."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

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


def plot_metrics(path: Path, rows: list[dict[str, Any]], metrics: list[str], chance: dict[str, float]) -> None:
    """Bars (mean, points) with 95% CIs clipped to the metric's range; a metric a row lacks gets no bar (not
    a zero); a dashed line per metric at its chance level."""
    plt = _pyplot()
    shown = [m for m in metrics if m != "meta_sum"]
    if not shown or not rows:
        return
    colours = _colours(list(dict.fromkeys(r["run"] for r in rows)))
    fig, ax = plt.subplots(figsize=(max(6, 1.7 * len(shown)), 4.2))
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        xs, means, low, high = [], [], [], []
        for j, m in enumerate(shown):
            if m not in row:
                continue
            mean, ci = 100 * row[m]["mean"], 100 * row[m]["ci95"]
            ci = 0.0 if not math.isfinite(ci) else ci
            xs.append(j + (i - (len(rows) - 1) / 2) * width)
            means.append(mean)
            low.append(mean - max(0.0, mean - ci))
            high.append(min(100.0, mean + ci) - mean)
        scratch = row["variant"] == "scratch"
        ax.bar(xs, means, width, yerr=[low, high], capsize=2, color=colours[row["run"]], alpha=0.45 if scratch else 1,
               hatch="//" if scratch else None, label=f"{row['run']} ({row['variant']})")
    for j, m in enumerate(shown):
        if m in chance:
            ax.hlines(100 * chance[m], j - 0.45, j + 0.45, colors="black", linestyles="dashed", linewidth=1,
                      label="chance / trivial baseline" if j == next(k for k, x in enumerate(shown) if x in chance) else None)
    ax.set_xticks(range(len(shown)))
    ax.set_xticklabels(shown)
    ax.set_ylim(0, 100)
    ax.set_ylabel("points (mean, 95% CI)")
    ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("downstream metrics")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_curves(path: Path, curves: dict[str, list[dict[str, Any]]]) -> None:
    """One panel per objective's loss; every seed of a run drawn in the run's colour in every panel, one
    legend for the figure."""
    plt = _pyplot()
    objectives = sorted({k[: -len("/loss")] for hist in curves.values() for r in hist for k in r if k.endswith("/loss")})
    if not objectives:
        return
    runs = list(dict.fromkeys(tag.split("/seed")[0] for tag in curves))
    colours = _colours(runs)
    fig, axes = plt.subplots(1, len(objectives), figsize=(3.4 * len(objectives), 3.2), squeeze=False)
    for ax, name in zip(axes[0], objectives):
        for tag, hist in curves.items():
            points = [(r["step"], r[f"{name}/loss"]) for r in hist if f"{name}/loss" in r]
            if points:
                ax.plot(*zip(*points), color=colours[tag.split("/seed")[0]], linewidth=0.7, alpha=0.8)
        ax.set_title(f"{name} loss", fontsize=9)
        ax.set_xlabel("step")
    handles = [plt.Line2D([], [], color=colours[r], label=r) for r in runs]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(runs), 6), fontsize=7)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_results(output_dir: Path, rows: list[dict[str, Any]], metrics: list[str],
                 curves: dict[str, list[dict[str, Any]]], chance: dict[str, float]) -> None:
    plot_metrics(output_dir / "metrics.png", rows, metrics, chance)
    plot_curves(output_dir / "loss_curves.png", curves)


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
