"""UNITER's released checkpoints -> vlkit (key names: ``shared/spec/official-code.md`` §2.4).

ChenRocks/UNITER ``uniter-base.pt`` / ``uniter-large.pt`` (``UniterForPretraining``: ``cls`` MLM,
``feat_regress`` MRFR tied to ``img_linear``ᵀ, one ``region_classifier`` for MRC and MRC-kl, ``itm_output``)
and the fine-tuned files: VQA / VE (``vqa_output``), ITR (``itm_output`` + ``rank_output``), NLVR2
(``nlvr2_output``, paired or paired-attention), RefCOCO+ (``re_output``). Plain state dicts, possibly fp16.
"""
from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from vlkit.convert.official import (MODEL, PRETRAINING, ConversionError, OfficialConverter, OfficialReport, Source,
                                    agree, config_fields, count_indexed, pretraining_mix, rename_legacy_layer_norm,
                                    require)
from vlkit.models.uniter import UniterConfig
from vlkit.objectives import build_objective
from vlkit.objectives.mix import build_pretraining
from vlkit.registry import register_converter
from vlkit.tasks import build_task

# config/uniter-base.json keys vlkit reads
CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
               "type_vocab_size", "initializer_range", "v_feature_size", "v_target_size")
IGNORED_KEYS = {"output_attentions": "debug output", "output_hidden_states": "debug output"}
VE_LABELS = ("contradiction", "entailment", "neutral")  # utils/misc.py VE_ENT2IDX
_REGION_CLASSIFIER = [("transform.dense.", "net.0."), ("transform.LayerNorm.", "net.2."), ("decoder.", "net.3.")]


@register_converter("uniter", signature=("uniter.img_embeddings.", "uniter.encoder.layer."),
                    description="a UNITER checkpoint")
class UniterConverter(OfficialConverter):
    family = "uniter"
    backbone = "uniter."
    head_kinds = {
        PRETRAINING: ("cls.predictions.", "cls.", "feat_regress.", "region_classifier.", "itm_output."),
        "vqa": ("vqa_output.",),
        "snli_ve": ("vqa_output.",),  # UniterForVisualEntailment is the VQA model with 3 answers
        "retrieval": ("rank_output.", "itm_output."),
        "nlvr2": ("nlvr2_output.", "attn1.", "attn2.", "fc.", "attn_pool."),
        "refexp": ("re_output.",),
    }

    head_names = {
        PRETRAINING: (("objectives.mlm.predictions.", "cls.predictions."),
                      ("objectives.mrfr.net.dense.", "feat_regress.net.0."),
                      ("objectives.mrfr.net.LayerNorm.", "feat_regress.net.2."),
                      ("objectives.mrfr.", "feat_regress."),
                      ("objectives.itm.itm_head.fc.", "itm_output."),
                      *((f"objectives.{name}.predictions.{ours}", f"region_classifier.{theirs}")
                        for name in ("mrc", "mrc_kl") for ours, theirs in _REGION_CLASSIFIER)),
        "retrieval": (("rank_output.", "rank_output."), ("itm.itm_head.fc.", "itm_output.")),
        **{kind: tuple((p, p) for p in prefixes) for kind, prefixes in head_kinds.items()
           if kind not in (PRETRAINING, "retrieval")},
    }

    def normalize(self, state: dict[str, Tensor], report: OfficialReport) -> dict[str, Tensor]:
        return rename_legacy_layer_norm(state, report)

    def choose_kind(self, state: dict[str, Tensor], task: str | None, name: str) -> str:
        if task is None and "vqa_output.3.weight" in state:  # VE: 3 answers (contradiction, entailment, neutral)
            return "snli_ve" if state["vqa_output.3.weight"].shape[0] == 3 else "vqa"
        return super().choose_kind(state, task, name)

    def model_config(self, state: dict[str, Tensor], config: dict[str, Any], meta: dict[str, Any], name: str):
        v = config_fields(config, CONFIG_KEYS, IGNORED_KEYS, name)
        # NLVR2 models grow the token types to 3 after reading uniter-base.json (nlvr2.py init_type_embedding)
        v.pop("type_vocab_size", None)
        word = require(state, "uniter.embeddings.word_embeddings.weight", name)
        image = require(state, "uniter.img_embeddings.img_linear.weight", name)
        for key, value, evidence in (
                ("vocab_size", word.shape[0], "uniter.embeddings.word_embeddings.weight"),
                ("hidden_size", word.shape[1], "uniter.embeddings.word_embeddings.weight"),
                ("max_position_embeddings", require(state, "uniter.embeddings.position_embeddings.weight", name).shape[0],
                 "uniter.embeddings.position_embeddings.weight"),
                ("type_vocab_size", require(state, "uniter.embeddings.token_type_embeddings.weight", name).shape[0],
                 "uniter.embeddings.token_type_embeddings.weight"),
                ("v_feature_size", image.shape[1], "uniter.img_embeddings.img_linear.weight"),
                ("num_hidden_layers", count_indexed(list(state), "uniter.encoder.layer."), "the uniter.encoder.layer.N keys"),
                ("intermediate_size", require(state, "uniter.encoder.layer.0.intermediate.dense.weight", name).shape[0],
                 "uniter.encoder.layer.0.intermediate.dense.weight")):
            agree(v, key, value, evidence, name)
        if "region_classifier.net.3.weight" in state:
            agree(v, "v_target_size", state["region_classifier.net.3.weight"].shape[0], "region_classifier.net.3.weight",
                  name)
        if "num_attention_heads" not in v:
            if v["hidden_size"] % 64:
                raise ConversionError(f"{name}: hidden_size={v['hidden_size']} is not a multiple of 64: give "
                                      "num_attention_heads in config= (uniter-*.json)")
            v["num_attention_heads"] = v["hidden_size"] // 64
        return UniterConfig(**v)

    def build(self, model: nn.Module, kind: str, state: dict[str, Tensor], options: dict[str, Any]) -> nn.Module:
        if kind == MODEL:
            return model
        if kind == PRETRAINING:
            present = [name for name, key in (("mlm", "cls.predictions.bias"), ("mrfr", "feat_regress.bias"),
                                              ("mrc", "region_classifier.net.3.weight"),
                                              ("mrc_kl", "region_classifier.net.3.weight"),
                                              ("itm", "itm_output.weight")) if key in state]
            # one region_classifier serves MRC and MRC-kl: mrc (not drawn by the all-data mix) shares mrc_kl's head
            mix = pretraining_mix(model, present, extra={"mrc": {"ratio": 0.0}},
                                  options={"mrc": {"share_head": "mrc_kl"}})
            return build_pretraining(model, mix)
        if kind in ("vqa", "snli_ve"):
            answers = state["vqa_output.3.weight"].shape[0]
            if kind == "snli_ve":
                if answers != 3:
                    raise ConversionError(f"vqa_output has {answers} outputs: not a 3-way UNITER VE head")
                return build_task("snli_ve", model, **{"labels": VE_LABELS, **options})
            return build_task("vqa", model, **{"num_answers": answers, **options})
        if kind == "retrieval":
            itm = build_objective("itm", model) if "itm_output.weight" in state else None
            return build_task("retrieval", model, **{"itm": itm, "init_from_itm": False, **options})
        if kind == "nlvr2":
            if state["nlvr2_output.weight"].shape[1] != 2 * model.config.hidden_size:
                raise ConversionError("nlvr2_output reads one pooled vector: UniterForNlvr2Triplet has no vlkit head "
                                      "(the paired and paired-attention models have)")
            head = "pair_biattn" if "attn1.in_proj_weight" in state else "pair"
            return build_task("nlvr2", model, **{"head": head, **options})
        return build_task("refexp", model, **{"mlp": 2 if "re_output.0.weight" in state else 1, **options})

    def source(self, key: str, kind: str, state: dict[str, Tensor]) -> Source | None:
        if key == "objectives.mlm.predictions.decoder.weight":
            return Source(("cls.predictions.decoder.weight", "uniter.embeddings.word_embeddings.weight"))
        if key == "objectives.mrfr.weight":  # tied to img_linear (used transposed)
            return Source(("feat_regress.weight", "uniter.img_embeddings.img_linear.weight"))
        return super().source(key, kind, state)

    def transform(self, key: str, value: Tensor, target: Tensor, report: OfficialReport) -> Tensor:
        if key.endswith("img_embeddings.mask_embedding.weight"):
            report.transformed.append(f"{key}: row 0 zeroed (the official forward zeroes it in place; only row 1 is "
                                      "ever added)")
            value = value.clone()
            value[0] = 0
        return value
