"""METER's released Lightning checkpoints -> vlkit (key names: ``shared/spec/official-code.md`` §3.3).

zdou0830/METER ``meter_clip16_{224,288}_roberta_pretrain.ckpt``, ``meter_swinbase_384_roberta_pretrain.ckpt``
(``mlm_score`` untied, ``itm_score``) and the fine-tuned ``vqa`` (``vqa_classifier``), ``nlvr2``
(``nlvr2_classifier``, 3 token types), ``snli`` (``snli_classifier``), ``flickr`` / ``coco``
(``rank_output`` [1, 1536] + the frozen ``itm_score``). Only ``state_dict`` is read; its
``hyper_parameters.config`` (the sacred config) fills what the shapes do not say. CLIP's OpenAI names
become timm's, the CLIP position table and the Swin relative-position tables are resized bicubically to
the requested image size as the official ``adapt_position_encoding`` / ``swin_adapt_position_encoding`` do.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from vlkit.convert.official import (MODEL, PRETRAINING, ConversionError, OfficialConverter, OfficialReport, Source,
                                    agree, count_indexed, pretraining_mix, require)
from vlkit.models.embeddings import interpolate_pos_embed
from vlkit.models.encoders import CLIP_BLOCK_TO_TIMM, CLIP_VISUAL_TO_TIMM
from vlkit.models.meter import ROBERTA_BASE, MeterConfig
from vlkit.objectives import build_objective
from vlkit.objectives.mix import build_pretraining
from vlkit.registry import register_converter
from vlkit.tasks import build_task

# what vlkit reads from METER's config (meter/config.py names) and its own extra keys
CONFIG_KEYS = ("vit", "image_size", "patch_size", "tokenizer", "num_top_layer", "hidden_size", "num_heads",
               "mlp_ratio", "drop_rate", "input_image_embed_size", "input_text_embed_size", "vocab_size",
               "resolution_before", "vqav2_label_size", "max_text_len")
VLKIT_KEYS = ("text_config", "vision_heads")
# the rest of meter/config.py's config(): data, training and logging settings
METER_KEYS = ("exp_name", "seed", "datasets", "loss_names", "batch_size", "train_transform_keys", "val_transform_keys",
              "draw_false_image", "image_only", "whole_word_masking", "mlm_prob", "draw_false_text", "num_layers",
              "optim_type", "learning_rate", "weight_decay", "decay_power", "max_epoch", "max_steps", "warmup_steps",
              "end_lr", "lr_mult_head", "lr_mult_cross_modal", "get_recall_metric", "resume_from", "fast_dev_run",
              "val_check_interval", "test_only", "data_root", "log_dir", "per_gpu_batchsize", "num_gpus", "num_nodes",
              "load_path", "num_workers", "precision")
BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0)
VE_LABELS = ("contradiction", "neutral", "entailment")  # meter/utils/write_snli.py label2id
_CLIP_TEXT = ("vit_model.positional_embedding", "vit_model.ln_final.", "vit_model.token_embedding.",
              "vit_model.transformer.", "vit_model.text_projection", "vit_model.logit_scale")
_SWIN_BUFFER = re.compile(r"vit_model\.layers\.\d+\.blocks\.\d+\.(attn\.relative_position_index|attn_mask)$")


def _meter_config(config: Mapping[str, Any], meta: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The checkpoint's own ``hyper_parameters.config`` values vlkit reads, overridden by ``config``."""
    saved = meta.get("hyper_parameters")
    saved = saved.get("config") if isinstance(saved, Mapping) else None
    values = {k: v for k, v in (saved or {}).items() if k in CONFIG_KEYS}
    for key, value in config.items():
        if key in CONFIG_KEYS or key in VLKIT_KEYS:
            values[key] = value
        elif key not in METER_KEYS:
            raise ConversionError(f"{name}: unknown config key {key!r}; vlkit reads "
                                  f"{', '.join((*CONFIG_KEYS, *VLKIT_KEYS))} (other meter/config.py keys are ignored)")
    return values


def _text_config(state: dict[str, Tensor], c: dict[str, Any], name: str) -> tuple[str, dict[str, Any]]:
    keys = list(state)
    word = require(state, "text_transformer.embeddings.word_embeddings.weight", name)
    types_ = require(state, "text_transformer.embeddings.token_type_embeddings.weight", name).shape[0]
    tokenizer = str(c.get("tokenizer") or ("roberta-base" if types_ == 1 else "bert-base-uncased"))
    model_type = "roberta" if "roberta" in tokenizer else "bert"

    text = {**(ROBERTA_BASE if model_type == "roberta" else BERT_BASE)}
    given = dict(c.get("text_config") or {})
    for key, value, evidence in (
            ("vocab_size", word.shape[0], "text_transformer.embeddings.word_embeddings.weight"),
            ("hidden_size", word.shape[1], "text_transformer.embeddings.word_embeddings.weight"),
            ("num_hidden_layers", count_indexed(keys, "text_transformer.encoder.layer."),
             "the text_transformer.encoder.layer.N keys"),
            ("intermediate_size", require(state, "text_transformer.encoder.layer.0.intermediate.dense.weight",
                                          name).shape[0], "text_transformer.encoder.layer.0.intermediate.dense.weight"),
            ("max_position_embeddings", require(state, "text_transformer.embeddings.position_embeddings.weight",
                                                name).shape[0], "text_transformer.embeddings.position_embeddings.weight"),
            ("type_vocab_size", types_, "text_transformer.embeddings.token_type_embeddings.weight")):
        agree(given, key, value, evidence, name)
    if "num_attention_heads" not in given:  # roberta-base / bert-base: 64-d heads
        if given["hidden_size"] % 64:
            raise ConversionError(f"{name}: the text tower's hidden size {given['hidden_size']} is not a multiple of "
                                  "64: give text_config={'num_attention_heads': ...} in config=")
        given["num_attention_heads"] = given["hidden_size"] // 64
    return model_type, {**text, **given}


def _vision_config(state: dict[str, Tensor], c: dict[str, Any], name: str) -> dict[str, Any]:
    keys = list(state)
    if "vit_model.visual.conv1.weight" in state:
        conv = state["vit_model.visual.conv1.weight"]
        width, patch = conv.shape[0], conv.shape[-1]
        if c.get("patch_size") not in (None, patch):
            raise ConversionError(f"{name}: config patch_size={c['patch_size']} but vit_model.visual.conv1.weight has "
                                  f"{patch}-px patches")
        grid = math.isqrt(require(state, "vit_model.visual.positional_embedding", name).shape[0] - 1)
        return dict(vision_encoder="clip", vision_width=width, patch_size=patch,
                    vision_layers=count_indexed(keys, "vit_model.visual.transformer.resblocks."),
                    vision_heads=int(c.get("vision_heads") or width // 64),  # CLIP's build_model: width // 64
                    image_size=int(c.get("image_size") or grid * patch))
    if "vit_model.patch_embed.proj.weight" not in state:
        raise ConversionError(f"{name}: no CLIP (vit_model.visual.*) or Swin (vit_model.patch_embed.*) vision tower")
    conv = state["vit_model.patch_embed.proj.weight"]
    stages = count_indexed(keys, "vit_model.layers.")
    depths = tuple(count_indexed(keys, f"vit_model.layers.{i}.blocks.") for i in range(stages))
    heads = tuple(require(state, f"vit_model.layers.{i}.blocks.0.attn.relative_position_bias_table", name).shape[1]
                  for i in range(stages))
    window = (math.isqrt(state["vit_model.layers.0.blocks.0.attn.relative_position_bias_table"].shape[0]) + 1) // 2
    image_size = int(c.get("image_size") or window * 32)
    dim = conv.shape[0]
    mlp = require(state, "vit_model.layers.0.blocks.0.mlp.fc1.weight", name).shape[0] / dim
    kwargs = dict(embed_dim=dim, depths=depths, num_heads=heads, window_size=image_size // 32,  # int(img_size / 32)
                  patch_size=conv.shape[-1], mlp_ratio=mlp)
    return dict(vision_encoder="swin", vision_model="swin_base_patch4_window12_384", vision_kwargs=kwargs,
                vision_width=dim * 2 ** (stages - 1), patch_size=conv.shape[-1] * 2 ** (stages - 1),
                image_size=image_size)


def resize_relative_position_table(table: Tensor, rows: int) -> Tensor:
    """A Swin relative-position bias table [(2W-1)^2, heads] resized to ``rows`` = (2W'-1)^2 entries, bicubic,
    as METER's ``swin_adapt_position_encoding``."""
    before, after = math.isqrt(table.shape[0]), math.isqrt(rows)
    grid = table.transpose(0, 1).reshape(1, -1, before, before).float()
    grid = F.interpolate(grid, size=(after, after), mode="bicubic")
    return grid[0].permute(1, 2, 0).reshape(-1, table.shape[1]).to(table.dtype)


@register_converter("meter", signature=("cross_modal_text_transform.", "cross_modal_image_transform.",
                                       "cross_modal_text_layers."), description="a METER checkpoint")
class MeterConverter(OfficialConverter):
    family = "meter"
    head_kinds = {
        PRETRAINING: ("mlm_score.", "itm_score."),
        "vqa": ("vqa_classifier.",),
        "nlvr2": ("nlvr2_classifier.",),
        "snli_ve": ("snli_classifier.",),
        "retrieval": ("rank_output.", "itm_score."),
    }
    head_names = {
        PRETRAINING: (("objectives.mlm.predictions.", "mlm_score."), ("objectives.itm.itm_head.fc.", "itm_score.fc.")),
        "retrieval": (("rank_output.", "rank_output."), ("itm.itm_head.fc.", "itm_score.fc.")),
        "vqa": (("vqa_classifier.", "vqa_classifier."),),
        "nlvr2": (("nlvr2_classifier.", "nlvr2_classifier."),),
        "snli_ve": (("snli_classifier.", "snli_classifier."),),
    }

    def model_config(self, state: dict[str, Tensor], config: dict[str, Any], meta: dict[str, Any], name: str):
        c = _meter_config(config, meta, name)
        model_type, text = _text_config(state, c, name)
        vision = _vision_config(state, c, name)
        text_proj = require(state, "cross_modal_text_transform.weight", name)
        image_proj = require(state, "cross_modal_image_transform.weight", name)
        hidden = text_proj.shape[0]
        for key, value, expected, what in (("input_text_embed_size", text_proj.shape[1], text["hidden_size"], "text"),
                                           ("input_image_embed_size", image_proj.shape[1], vision["vision_width"],
                                            "vision")):
            if value != expected or c.get(key) not in (None, value):
                raise ConversionError(f"{name}: cross_modal_{what}_transform reads {value}-d inputs, the {what} tower "
                                      f"gives {expected}-d (config {key}={c.get(key)})")
        if c.get("hidden_size") not in (None, hidden):
            raise ConversionError(f"{name}: config hidden_size={c['hidden_size']} but cross_modal_text_transform.weight "
                                  f"is {list(text_proj.shape)}")
        heads = int(c.get("num_heads") or 0) or hidden // 64
        if hidden % heads:
            raise ConversionError(f"{name}: hidden_size={hidden} is not a multiple of {heads} heads: give num_heads")
        inter = require(state, "cross_modal_text_layers.0.intermediate.dense.weight", name).shape[0]
        return MeterConfig(preset="base", text_encoder=model_type, text_config=text, hidden_size=hidden,
                           num_heads=heads, num_top_layer=count_indexed(list(state), "cross_modal_text_layers."),
                           mlp_ratio=inter // hidden, drop_rate=float(c.get("drop_rate", 0.1)),
                           num_image_token_types=require(state, "token_type_embeddings.weight", name).shape[0], **vision)

    def build(self, model: nn.Module, kind: str, state: dict[str, Tensor], options: dict[str, Any]) -> nn.Module:
        if kind == MODEL:
            return model
        if kind == PRETRAINING:
            present = [n for n, key in (("mlm", "mlm_score.bias"), ("itm", "itm_score.fc.weight")) if key in state]
            return build_pretraining(model, pretraining_mix(model, present))
        if kind == "vqa":
            return build_task("vqa", model, **{"num_answers": state["vqa_classifier.3.weight"].shape[0], **options})
        if kind == "snli_ve":
            return build_task("snli_ve", model, **{"labels": VE_LABELS, **options})
        if kind == "retrieval":
            itm = build_objective("itm", model) if "itm_score.fc.weight" in state else None
            return build_task("retrieval", model, **{"itm": itm, "init_from_itm": False, **options})
        return build_task(kind, model, **options)

    def source(self, key: str, kind: str, state: Mapping[str, Tensor]) -> Source | None:
        inner = key if kind == MODEL else key[len("model."):] if key.startswith("model.") else None
        if inner is None or not inner.startswith("vit_model."):
            return super().source(key, kind, state)

        name = inner[len("vit_model."):]
        if "vit_model.visual.conv1.weight" in state:  # timm names -> OpenAI CLIP names
            block = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
            if block:
                clip = {v: k for k, v in CLIP_BLOCK_TO_TIMM.items()}.get(block.group(2))
                return Source((f"vit_model.visual.transformer.resblocks.{block.group(1)}.{clip}",)) if clip else None
            clip = {v: k for k, v in CLIP_VISUAL_TO_TIMM.items()}.get(name)
            return Source((f"vit_model.visual.{clip}",)) if clip else None
        # Swin: timm >= 0.6 puts each stage's patch merging at the start of the next stage (0.4.12: at the end)
        merge = re.fullmatch(r"layers\.(\d+)\.downsample\.(.+)", name)
        if merge:
            return Source((f"vit_model.layers.{int(merge.group(1)) - 1}.downsample.{merge.group(2)}",))
        return Source((f"vit_model.{name}",))

    def transform(self, key: str, value: Tensor, target: Tensor, report: OfficialReport) -> Tensor:
        if key.endswith("vit_model.cls_token"):
            return value.reshape(target.shape)
        if key.endswith("vit_model.pos_embed"):
            grid = math.isqrt(target.shape[1] - 1)
            if value.shape[0] != target.shape[1]:
                report.transformed.append(f"{key}: CLIP position table {math.isqrt(value.shape[0] - 1)}^2 -> {grid}^2 "
                                          "grid, bicubic (adapt_position_encoding)")
            return interpolate_pos_embed(value, grid)[None]
        if key.endswith("relative_position_bias_table") and value.shape != target.shape:
            report.transformed.append(f"{key}: {value.shape[0]} -> {target.shape[0]} entries, bicubic "
                                      "(swin_adapt_position_encoding)")
            return resize_relative_position_table(value, target.shape[0])
        return value

    def unused_reason(self, key: str, kind: str) -> str | None:
        if key.startswith("text_transformer.pooler."):
            return "the text tower's own pooler: METER pools the cross-modal text stream (cross_modal_text_pooler)"
        if key == "text_transformer.embeddings.position_ids":
            return "buffer 0..max_position-1 that transformers rebuilds"
        if key.startswith(_CLIP_TEXT):
            return "CLIP text-side tensors that METER's CLIP keeps but never uses (its image side only)"
        if key == "vit_model.visual.proj":
            return "CLIP's output projection: METER reads the ln_post tokens without it"
        if _SWIN_BUFFER.match(key):
            return "buffer recomputed from the window size (timm)"
        if key.startswith("vit_model.head."):
            return "the Swin classifier head: METER reads forward_features"
        return super().unused_reason(key, kind)
