"""The papers' pre-training FLOPs per example counted by hand, beside vlkit's plan of the same recipes.

An independent count: no vlkit model is built. Each family's forward pass is written out from its official
configuration (layer widths, depths, vocabularies, heads), and a training step costs three forwards (the backward
twice the forward): 6 x the parameters an input passes x the inputs that pass them, plus attention (4 x queries x
keys x width per layer: scores and their weighted sum, forward) and the heads as the official code computes them:

- UNITER (config/uniter-base.json, model/pretrain.py): one BERT-base stream over text + regions; MLM, MRFR and
  MRC-kl decode the masked positions only (15%); ITM on the pooled [CLS], WRA's cosine cost between the word and
  region states; one objective a step, drawn by the mix's ratios.
- METER (meter/config.py clip32 + text_roberta, meter/modules): CLIP ViT-B/32 (11 blocks of 768) over 49 patches
  and a class token, RoBERTa-base over the text, projections, 6 co-attention layers per stream; two passes (MLM,
  ITM), each running both encoders and the fusion; MLM decodes every text position over 50,265 words.
- ViLBERT (config/bert_base_6layer_6conect.json, vilbert.py): BERT-base text stream (12 layers), visual stream of
  6 layers of 1,024 (FFN 1,024), 6 co-attention blocks of 1,024; BertPreTrainingHeads decode every text position
  over 30,522 words and every image position over 1,601 classes; one pass.

The shapes (examples a step, tokens, regions) are the plan's (`vlkit.compare.costs.unit_shapes`): the comparison
compares the arithmetic of one example at those shapes.

    python benchmarks/paper_flops.py            # the four paper presets: prints a table,
                                                # writes benchmarks/results/paper_flops.json
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

RESULTS = Path(__file__).resolve().parent / "results" / "paper_flops.json"
MASKED = 0.15  # the masked share of tokens and regions (all three papers)


def linear(inputs: float, fan_in: int, fan_out: int) -> float:
    """Forward FLOPs of ``inputs`` rows through a ``fan_in`` x ``fan_out`` matrix."""
    return 2.0 * inputs * fan_in * fan_out


def attention(queries: float, keys: float, width: int) -> float:
    """Forward FLOPs of attention's scores and weighted sum (all heads: ``width`` wide)."""
    return 4.0 * queries * keys * width


def bert_layer(tokens: float, width: int, ffn: int) -> float:
    """A transformer layer's forward over ``tokens``: Q, K, V, output projections, FFN and self-attention."""
    return linear(tokens, width, 4 * width) + linear(tokens, width, 2 * ffn) + attention(tokens, tokens, width)


def masked(n: float) -> float:
    """The positions masked out of ``n`` (at least one)."""
    return max(1.0, MASKED * n)


def uniter(text: int, regions: int, vocab: int = 28996, ratios: dict[str, float] | None = None) -> dict[str, float]:
    """UNITER-base forward FLOPs per example, per objective, and their mean over the mix's ratios."""
    h, ffn, layers, feature, classes = 768, 3072, 12, 2048, 1601
    s = text + regions
    body = linear(regions, feature, h) + linear(regions, 7, h) + layers * bert_layer(s, h, ffn)
    transform = lambda n: linear(n, h, h)  # noqa: E731  (BertPredictionHeadTransform)
    per = {"itm": body + linear(1, h, h) + linear(1, h, 2) + linear(text * regions, h, 1),  # pooler, head, WRA cost
           "mlm": body + transform(masked(text)) + linear(masked(text), h, vocab),
           "mrfr": body + transform(masked(regions)) + linear(masked(regions), h, feature),
           "mrc_kl": body + transform(masked(regions)) + linear(masked(regions), h, classes)}
    ratios = ratios or {"itm": 2, "mlm": 2, "mrfr": 1, "mrc_kl": 1}
    per["mean"] = sum(per[k] * r for k, r in ratios.items()) / sum(ratios.values())
    return per


def meter(text: int, image_size: int = 224, patch: int = 32, vocab: int = 50265) -> dict[str, float]:
    """METER-CLIP-ViT-B/32-RoBERTa forward FLOPs per example: two passes, each with both encoders and the fusion."""
    h, ffn, fusion_layers = 768, 3072, 6
    patches = (image_size // patch) ** 2
    image = patches + 1
    vision = linear(patches, 3 * patch * patch, h) + 11 * bert_layer(image, h, ffn)
    language = 12 * bert_layer(text, h, ffn)
    projections = linear(text, h, h) + linear(image, h, h)
    co_layer = lambda q, k: bert_layer(q, h, ffn) + linear(q, h, 4 * h) + attention(q, k, h)  # noqa: E731  (+ cross)
    fusion = fusion_layers * (co_layer(text, image) + co_layer(image, text))
    encode = vision + language + projections + fusion
    poolers = 2 * linear(1, h, h)
    mlm = encode + linear(text, h, h) + linear(text, h, vocab)  # every text position decoded
    itm = encode + poolers + linear(1, 2 * h, 2)
    return {"mlm": mlm, "itm": itm, "mean": mlm + itm}


def vilbert(text: int, regions: int, vocab: int = 30522) -> dict[str, float]:
    """ViLBERT forward FLOPs per example: both streams, co-attention and the pre-training heads over every position."""
    h, ffn, layers = 768, 3072, 12
    vh, vffn, vlayers, bi, classes, feature = 1024, 1024, 6, 1024, 1601, 2048
    image = regions + 1  # the [IMG] token
    embed = linear(image, feature, vh) + linear(image, 5, vh)
    text_stream = layers * bert_layer(text, h, ffn)
    image_stream = vlayers * bert_layer(image, vh, vffn)
    co = vlayers * (linear(text, h, 3 * bi) + linear(image, vh, 3 * bi) + attention(text, image, bi)
                    + attention(image, text, bi) + linear(text, bi, h) + linear(image, bi, vh)
                    + linear(text, h, 2 * ffn) + linear(image, vh, 2 * vffn))
    heads = (linear(1, h, bi) + linear(1, vh, bi) + linear(1, bi, 2)  # poolers, alignment
             + linear(text, h, h) + linear(text, h, vocab)  # MLM over every text position
             + linear(image, vh, vh) + linear(image, vh, classes))  # region classes over every image position
    total = embed + text_stream + image_stream + co + heads
    return {"mlm+mrc_kl+itm": total, "mean": total}


# preset -> the hand count of one example at the plan's (tokens, regions)
PAPERS: dict[str, Callable[[int, int], dict[str, float]]] = {
    "paper_uniter": lambda text, regions: uniter(text, regions),
    "paper_uniter_alldata": lambda text, regions: uniter(text, regions,
                                                         ratios={"itm": 3, "mlm": 4, "mrfr": 2, "mrc_kl": 2}),
    "paper_meter": lambda text, regions: meter(text),
    "paper_vilbert": lambda text, regions: vilbert(text, regions),
}


def hand_count(preset: str, text: int, regions: int) -> float:
    """Training FLOPs of one example of ``preset`` at ``text`` tokens and ``regions`` regions: 3 forwards."""
    return 3.0 * PAPERS[preset](text, regions)["mean"]


def planned(preset: str) -> dict[str, Any]:
    """vlkit's plan of ``preset`` (`vlkit.compare.costs.count_costs`): its shapes and FLOPs per example."""
    from vlkit.cli import compose
    from vlkit.compare import Comparison, resolve_config
    from vlkit.compare.costs import cost_settings, count_costs

    cfg = resolve_config(compose("compare", [f"compare={preset}"]))
    comparison = Comparison(cfg, ".", progress=False)
    row = count_costs(comparison, cost_settings(cfg["compare"]), int(cfg["compare"]["gpus_per_unit"])).units[0]
    shapes = row.shapes
    return {"batch": shapes.batch_size, "text_len": shapes.text_len, "regions": shapes.regions,
            "planned_flops_per_example": row.flops_per_step / shapes.batch_size}


def main() -> None:
    rows = []
    for preset in PAPERS:
        plan = planned(preset)
        hand = hand_count(preset, plan["text_len"], plan["regions"])
        rows.append({"preset": preset, **plan, "hand_flops_per_example": hand,
                     "planned_over_hand": plan["planned_flops_per_example"] / hand})
    print("| preset | examples / step | tokens | regions | planned GFLOP / example | hand count | plan / hand |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['preset']} | {r['batch']:,} | {r['text_len']} | {r['regions']} | "
              f"{r['planned_flops_per_example'] / 1e9:.1f} | {r['hand_flops_per_example'] / 1e9:.1f} | "
              f"{r['planned_over_hand']:.3f} |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(f"written {RESULTS.relative_to(Path.cwd()) if RESULTS.is_relative_to(Path.cwd()) else RESULTS}")


if __name__ == "__main__":
    main()
