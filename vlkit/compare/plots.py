"""The plots of a comparison: metric bars with CIs, pre-training loss curves, a WRA transport plan."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from vlkit.compare.statistics import HEADLINE
from vlkit.train import pipeline


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
    """A WRA transport-plan heatmap (words x regions) for one shapes image, from a run whose mix has WRA."""
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
