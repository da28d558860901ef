"""ViLBERT's released checkpoints -> vlkit (key names: ``shared/spec/official-code.md`` §1.4).

facebookresearch/vilbert-multi-task ``pretrained_model.bin`` (``BertForMultiModalPreTraining``, CC with
``--objective 1``, ``visual_target 0``) and ``multi_task_model.bin`` (``VILBertForVLTasks`` with task
tokens: ``vil_prediction`` VQA, ``vil_prediction_gqa`` GQA, ``vil_logit`` retrieval, ``vision_logit``
RefExp, ``vil_binary_prediction`` NLVR2, ``vil_tri_prediction`` SNLI-VE, plus the pre-training heads);
jiasenlu/vilbert_beta task models (``vil_prediction.main.*`` weight-normalised classifier, no task tokens).
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from vlkit.convert.official import (MODEL, PRETRAINING, ConversionError, OfficialConverter, OfficialReport, Source,
                                    agree, config_fields, count_indexed, fold_weight_norm, pretraining_mix,
                                    rename_legacy_layer_norm, require)
from vlkit.models.vilbert import ViLBERTConfig
from vlkit.objectives.mix import build_pretraining
from vlkit.registry import register_converter
from vlkit.tasks import build_task

# bert_base_6layer_6conect.json keys (plus BertConfig defaults) vlkit reads, and vlkit's own options
CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
               "type_vocab_size", "initializer_range", "v_feature_size", "v_target_size", "v_hidden_size",
               "v_num_hidden_layers", "v_num_attention_heads", "v_intermediate_size", "v_hidden_act",
               "v_hidden_dropout_prob", "v_attention_probs_dropout_prob", "bi_hidden_size", "bi_num_attention_heads",
               "v_biattention_id", "t_biattention_id", "fusion_method", "task_specific_tokens", "img_feature")
IGNORED_KEYS = {
    "v_initializer_range": "not read by the model code", "bi_intermediate_size": "unused by the official code",
    "bi_attention_type": "unused by the official code", "pooling_method": "unused (fusion_method is read)",
    "fast_mode": "training option", "fixed_t_layer": "training option (frozen layers)",
    "fixed_v_layer": "training option (frozen layers)", "in_batch_pairs": "training option",
    "objective": "training option (train_concap.py --objective)", "num_negative": "visual_target 2 only",
    "visualization": "debug output",
}
CHECKS = {"visual_target": 0, "dynamic_attention": False, "with_coattention": True, "model": "bert"}
GQA_TASK_ID = 15  # vilbert_tasks.yml TASK15 (the other tasks' ids: ViLBERT.official_task_ids)
VE_LABELS = ("contradiction", "neutral", "entailment")  # visual_entailment_dataset.py LABEL_MAP
_Q_DENSE = re.compile(r"bert\.encoder\.c_layer\.\d+\.biOutput\.q_dense[12]\.")


@register_converter("vilbert", signature=("bert.v_embeddings.", "bert.encoder.c_layer."),
                    description="a ViLBERT checkpoint")
class ViLBERTConverter(OfficialConverter):
    family = "vilbert"
    head_kinds = {
        PRETRAINING: ("cls.predictions.", "cls."),
        "vqa": ("vil_prediction.",),
        "gqa": ("vil_prediction_gqa.",),
        "retrieval": ("vil_logit.",),
        "refexp": ("vision_logit.",),
        "nlvr2": ("vil_binary_prediction.",),
        "snli_ve": ("vil_tri_prediction.",),
    }
    backbone = "bert."
    head_names = {
        PRETRAINING: (("objectives.mlm.predictions.", "cls.predictions."),
                      ("objectives.mrc_kl.predictions.", "cls.imagePredictions."),
                      ("objectives.itm.itm_head.fc.", "cls.bi_seq_relationship.")),
        "vqa": (("vil_prediction.", "vil_prediction.logit_fc."),),
        "gqa": (("vil_prediction_gqa.", "vil_prediction_gqa.logit_fc."),),
        "retrieval": (("vil_logit.", "vil_logit."),),
        "refexp": (("vision_logit.", "vision_logit."),),
        "nlvr2": (("vil_binary_prediction.", "vil_binary_prediction.logit_fc."),),
        "snli_ve": (("vil_tri_prediction.", "vil_tri_prediction."),),
    }

    def normalize(self, state: dict[str, Tensor], report: OfficialReport) -> dict[str, Tensor]:
        return rename_legacy_layer_norm(state, report)

    def model_config(self, state: dict[str, Tensor], config: dict[str, Any], meta: dict[str, Any], name: str):
        v = config_fields(config, CONFIG_KEYS, IGNORED_KEYS, name, CHECKS)
        word = require(state, "bert.embeddings.word_embeddings.weight", name)
        image = require(state, "bert.v_embeddings.image_embeddings.weight", name)
        agree(v, "vocab_size", word.shape[0], "bert.embeddings.word_embeddings.weight", name)
        agree(v, "hidden_size", word.shape[1], "bert.embeddings.word_embeddings.weight", name)
        agree(v, "max_position_embeddings", require(state, "bert.embeddings.position_embeddings.weight", name).shape[0],
              "bert.embeddings.position_embeddings.weight", name)
        agree(v, "type_vocab_size", require(state, "bert.embeddings.token_type_embeddings.weight", name).shape[0],
              "bert.embeddings.token_type_embeddings.weight", name)
        agree(v, "v_hidden_size", image.shape[0], "bert.v_embeddings.image_embeddings.weight", name)
        agree(v, "v_feature_size", image.shape[1], "bert.v_embeddings.image_embeddings.weight", name)
        keys = list(state)
        agree(v, "num_hidden_layers", count_indexed(keys, "bert.encoder.layer."), "the bert.encoder.layer.N keys", name)
        agree(v, "v_num_hidden_layers", count_indexed(keys, "bert.encoder.v_layer."), "the bert.encoder.v_layer.N keys",
              name)
        co_layers = count_indexed(keys, "bert.encoder.c_layer.")
        agree(v, "intermediate_size", require(state, "bert.encoder.layer.0.intermediate.dense.weight", name).shape[0],
              "bert.encoder.layer.0.intermediate.dense.weight", name)
        agree(v, "v_intermediate_size", require(state, "bert.encoder.c_layer.0.v_intermediate.dense.weight",
                                                name).shape[0], "bert.encoder.c_layer.0.v_intermediate.dense.weight", name)
        agree(v, "bi_hidden_size", require(state, "bert.encoder.c_layer.0.biattention.query1.weight", name).shape[0],
              "bert.encoder.c_layer.0.biattention.query1.weight", name)
        if "cls.imagePredictions.decoder.weight" in state:
            agree(v, "v_target_size", state["cls.imagePredictions.decoder.weight"].shape[0],
                  "cls.imagePredictions.decoder.weight", name)
        tokens = state.get("bert.embeddings.task_embeddings.weight")
        if v.get("task_specific_tokens") and tokens is None:
            raise ConversionError(f"{name}: config task_specific_tokens=True but the checkpoint has no "
                                  "bert.embeddings.task_embeddings.weight")
        v["task_specific_tokens"] = tokens is not None
        if tokens is not None:
            v["num_task_tokens"] = tokens.shape[0]
        if "v_biattention_id" not in v or "t_biattention_id" not in v:
            if v["v_num_hidden_layers"] != co_layers:
                raise ConversionError(f"{name}: {co_layers} co-attention layers and {v['v_num_hidden_layers']} visual "
                                      "layers: give v_biattention_id and t_biattention_id in config=")
            v.setdefault("v_biattention_id", list(range(co_layers)))
            v.setdefault("t_biattention_id", list(range(v["num_hidden_layers"] - co_layers, v["num_hidden_layers"])))
        if len(v["v_biattention_id"]) != co_layers:
            raise ConversionError(f"{name}: config v_biattention_id has {len(v['v_biattention_id'])} entries but the "
                                  f"checkpoint has {co_layers} co-attention layers (bert.encoder.c_layer.N)")
        # heads are not in the shapes: the official configs use 64-d text heads and 128-d visual / co-attention heads
        for key, size, per_head in (("num_attention_heads", "hidden_size", 64), ("v_num_attention_heads", "v_hidden_size", 128),
                                    ("bi_num_attention_heads", "bi_hidden_size", 128)):
            if key not in v:
                if v[size] % per_head:
                    raise ConversionError(f"{name}: {size}={v[size]} is not a multiple of {per_head}: give {key} in config=")
                v[key] = v[size] // per_head
        return ViLBERTConfig(**v)

    def build(self, model: nn.Module, kind: str, state: dict[str, Tensor], options: dict[str, Any]) -> nn.Module:
        if kind not in (MODEL, PRETRAINING) and model.config.task_specific_tokens:
            options.setdefault("task_id", GQA_TASK_ID if kind == "gqa" else model.official_task_ids[kind])
        if kind == MODEL:
            return model
        if kind == PRETRAINING:
            present = [name for name, key in (("mlm", "cls.predictions.bias"), ("mrc_kl", "cls.imagePredictions.decoder.weight"),
                                              ("itm", "cls.bi_seq_relationship.weight")) if key in state]
            decoder = state.get("cls.predictions.decoder.weight")
            tied = decoder is None or torch.equal(decoder, state["bert.embeddings.word_embeddings.weight"])
            return build_pretraining(model, pretraining_mix(model, present, options={"mlm": {"tied": tied}}))
        if kind in ("vqa", "gqa"):
            beta = "vil_prediction.main.3.weight_v" in state
            out = state["vil_prediction.main.3.weight_v" if beta else f"{self.head_names[kind][0][1]}3.weight"]
            head = "gqa" if kind == "gqa" else "beta" if beta else None
            return build_task("vqa", model, **{"num_answers": out.shape[0], "head": head, **options})
        if kind == "snli_ve":
            return build_task("snli_ve", model, **{"labels": VE_LABELS, **options})
        return build_task(kind, model, **options)

    def source(self, key: str, kind: str, state: Mapping[str, Tensor]) -> Source | None:
        if key == "objectives.mlm.predictions.decoder.weight":  # tied: older files may keep only the embeddings
            return Source(("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"))
        beta = re.fullmatch(r"vil_prediction\.([03])\.(weight|bias)", key)
        if kind == "vqa" and beta and "vil_prediction.main.3.weight_v" in state:
            layer, what = beta.groups()
            if what == "bias":
                return Source((f"vil_prediction.main.{layer}.bias",))
            return Source((f"vil_prediction.main.{layer}.weight_g", f"vil_prediction.main.{layer}.weight_v"),
                          fold_weight_norm, "weight_norm(g, v) folded into one weight")
        return super().source(key, kind, state)

    def unused_reason(self, key: str, kind: str) -> str | None:
        if _Q_DENSE.match(key):
            return "BertBiOutput allocates q_dense1 / q_dense2 but its forward never uses them (vilbert.py L826-855)"
        if key.startswith("linguisic_logit."):
            return "VILBertForVLTasks.forward computes linguisic_logit but no task loss reads it (task_utils.py)"
        return super().unused_reason(key, kind)
