"""METER (Dou et al. 2022): a `transformers` text encoder and a CLIP / Swin vision tower, each
projected to the fusion width, joined by co-attention layers (zdou0830/METER ``meter_module.py``).

``fusion="merged"`` is the merged-attention variant of Table 6 (one transformer over the
concatenated streams). Module names follow the official code; the unused CLIP text-side tensors
and the RoBERTa pooler are not built, so the ``clip16-roberta`` model without heads has
318,650,112 parameters (the official 319,281,152 minus 39,424 + 1,024 CLIP-text and 590,592 pooler).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from vlkit.models.base import ModelConfig, VLModel
from vlkit.models.encoders import TEXT_ENCODERS, vision_has_cls, vision_tokens
from vlkit.models.heads import JointClassifier, PairClassifier, RankHead, init_linear
from vlkit.models.layers import (BertCrossLayer, BertLayer, Pooler, additive_mask, extend_embedding, init_bert_weights,
                                 run_single_stream)
from vlkit.models.recipe import Recipe, register_recipe
from vlkit.models.rows import keep_index, scatter_rows, with_pooled
from vlkit.registry import ENCODERS, register_head, register_model
from vlkit.released import PretrainedWeights, ReleasedFile
from vlkit.types import Encoded, VLBatch, VLOutput

ROBERTA_BASE = dict(vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                    intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5,
                    pad_token_id=1, bos_token_id=0, eos_token_id=2, hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1)
_TINY_TEXT = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                  max_position_embeddings=64, pad_token_id=0, initializer_range=0.1, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
_CLIP16 = dict(vision_encoder="clip", vision_width=768, vision_layers=11, vision_heads=12, patch_size=16, image_size=288)


@dataclass
class MeterConfig(ModelConfig):
    """``task_mlm_itm_clip_bert`` + ``clip16`` + ``text_roberta`` (official ``meter/config.py``).

    ``text_pretrained`` / ``vision_pretrained`` name local weights (a ``from_pretrained`` directory,
    a CLIP / timm state dict file); without them the towers are built from ``text_config`` and the
    vision fields. ``vocab_size`` (when set) overrides ``text_config["vocab_size"]``.
    """

    family = "meter"
    presets = {
        "tiny": dict(text_encoder="bert", text_config=_TINY_TEXT, vision_encoder="clip", vision_width=64,
                     vision_layers=2, vision_heads=2, patch_size=8, image_size=64, hidden_size=64, num_heads=2,
                     num_top_layer=2, initializer_range=0.1, drop_rate=0.0),
        "clip16-roberta": dict(_CLIP16),
        "base": dict(_CLIP16),
        "clip32-roberta": dict(_CLIP16, patch_size=32, image_size=224),
        "swin-roberta": dict(vision_encoder="swin", vision_model="swin_base_patch4_window12_384", vision_width=1024,
                             image_size=384),
    }
    default_preset = "clip16-roberta"

    preset: str = "clip16-roberta"
    text_encoder: str = "roberta"  # any transformers model_type
    text_pretrained: str | None = None
    text_config: dict[str, Any] = field(default_factory=lambda: dict(ROBERTA_BASE))
    vocab_size: int | None = None
    vision_encoder: str = "clip"  # a registered vision encoder: clip | swin
    vision_pretrained: str | None = None
    vision_model: str = ""  # timm model name for swin
    vision_kwargs: dict[str, Any] = field(default_factory=dict)  # extra timm.create_model arguments (swin)
    vision_width: int = 768
    vision_layers: int = 11  # CLIP ViT-B/16 has 12 blocks; METER builds 11 and drops the last
    vision_heads: int = 12
    patch_size: int = 16
    image_size: int = 288
    hidden_size: int = 768
    num_heads: int = 12
    num_top_layer: int = 6
    mlp_ratio: int = 4
    drop_rate: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    fusion: str = "co_attention"  # or "merged"
    merged_num_layers: int | None = None  # default 2 * num_top_layer
    num_image_token_types: int = 2  # NLVR2 fine-tuning uses 3 (image type ids 1 and 2)

    def __post_init__(self) -> None:
        if self.vocab_size is not None:
            self.text_config = {**self.text_config, "vocab_size": self.vocab_size}
        if self.fusion not in ("co_attention", "merged"):
            raise ValueError(f"fusion must be 'co_attention' or 'merged', not {self.fusion!r}")
        if self.vision_encoder in TEXT_ENCODERS or self.vision_encoder not in ENCODERS:
            vision = [n for n in ENCODERS.names() if n not in TEXT_ENCODERS]
            raise ValueError(f"vision_encoder must be one of {', '.join(vision)}, not {self.vision_encoder!r}")

    @property
    def pad_token_id(self) -> int:
        return self.text_config.get("pad_token_id", 0)


@register_model("meter")
class Meter(VLModel):
    """METER: ``joint = cat(text_pool, image_pool)``; ``encode_text`` / ``encode_image`` cache both
    unimodal towers (projected, with their modality type embedding)."""

    family = "meter"
    config_class = MeterConfig
    image_input = "pixels"
    image_types = True
    mlm_tied = False
    encoder_prefixes = ("text_transformer", "vit_model")
    keeps_rows = True  # fuse takes keep_rows

    size_fields = {"vocab_size": "vocab_size", "region_feature_size": None, "region_classes": None}

    @classmethod
    def data_fields(cls, values: Mapping[str, Any]) -> dict[str, str]:
        """The tokenizer sizes ``vocab_size`` unless a pre-trained text tower is named (``text_pretrained``:
        its own vocabulary); METER takes pixels, no region sizes."""
        fields = super().data_fields(values)
        return {k: v for k, v in fields.items() if k != "vocab_size"} if values.get("text_pretrained") else fields

    def __init__(self, config: MeterConfig):
        super().__init__(config)
        c = config
        self.text_transformer = ENCODERS.get("hf_text")(c)
        self.vit_model = ENCODERS.get(c.vision_encoder)(c)
        text_width = self.text_transformer.config.hidden_size
        self.cross_modal_text_transform = nn.Linear(text_width, c.hidden_size)
        self.cross_modal_image_transform = nn.Linear(c.vision_width, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.num_image_token_types, c.hidden_size)
        inter = c.hidden_size * c.mlp_ratio
        if c.fusion == "co_attention":
            def cross() -> nn.ModuleList:
                return nn.ModuleList(BertCrossLayer(c.hidden_size, c.num_heads, inter, "gelu", c.layer_norm_eps,
                                                    c.drop_rate, c.drop_rate) for _ in range(c.num_top_layer))
            self.cross_modal_text_layers = cross()
            self.cross_modal_image_layers = cross()
        else:
            self.cross_modal_layers = nn.ModuleList(
                BertLayer(c.hidden_size, c.num_heads, inter, "gelu", c.layer_norm_eps, c.drop_rate, c.drop_rate)
                for _ in range(c.merged_num_layers or 2 * c.num_top_layer))
        self.cross_modal_text_pooler = Pooler(c.hidden_size, c.hidden_size, "tanh")
        self.cross_modal_image_pooler = Pooler(c.hidden_size, c.hidden_size, "tanh")
        for name, module in self.named_children():
            if name not in self.encoder_prefixes:
                module.apply(lambda m: init_bert_weights(m, c.initializer_range))
        self.image_offset = 1 if vision_has_cls(self.vit_model) else 0

    def config_to_save(self) -> dict[str, Any]:
        # rebuildable without the original pretrained files: record the towers' actual configs
        values = self.config.to_dict()
        values.update(text_pretrained=None, vision_pretrained=None, vocab_size=None,
                      text_config=self.text_transformer.config.to_diff_dict())
        values["text_config"].pop("architectures", None)
        values["text_config"].pop("model_type", None)
        values["text_config"].pop("transformers_version", None)
        return values

    @property
    def text_hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def joint_size(self) -> int:
        return 2 * self.config.hidden_size

    def get_input_embeddings(self) -> nn.Embedding:
        return self.text_transformer.get_input_embeddings()

    @property
    def patch_size(self) -> int:
        """Pixels per image-token side: the ViT patch, or a Swin's total stride."""
        return self.config.patch_size if self.image_offset else self.vit_model.feature_info[-1]["reduction"]

    def encoding_modules(self, side: str) -> tuple[nn.Module, ...]:
        if side == "text":
            return self.text_transformer, self.cross_modal_text_transform, self.token_type_embeddings
        return self.vit_model, self.cross_modal_image_transform, self.token_type_embeddings

    def encode_text(self, batch: VLBatch, **_: Any) -> Encoded:
        states = self.text_transformer(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        states = self.cross_modal_text_transform(states) + self.token_type_embeddings.weight[0]
        return Encoded(states, batch.attention_mask)

    def extend_image_types(self, count: int) -> None:
        self.token_type_embeddings = extend_embedding(self.token_type_embeddings, count)
        self.config.num_image_token_types = max(self.config.num_image_token_types, count)

    def encode_image(self, batch: VLBatch, image_type_id: int = 1, **_: Any) -> Encoded:
        if not batch.has_pixels:
            raise ValueError("METER takes pixels: the batch has no pixel_values")
        states = self.cross_modal_image_transform(vision_tokens(self.vit_model, batch.pixel_values))
        states = states + self.token_type_embeddings.weight[image_type_id]
        return Encoded(states, torch.ones(states.shape[:2], dtype=torch.long, device=states.device))

    def fuse(self, text: Encoded, image: Encoded, pooled_only: bool = False,
             keep_rows: tuple[Tensor | None, Tensor | None] | None = None) -> VLOutput:
        x, y = text.states, image.states
        length_x, length_y = x.shape[1], y.shape[1]
        x_mask, y_mask = additive_mask(text.mask, x.dtype), additive_mask(image.mask, y.dtype)
        # the poolers read [CLS] of each stream; a Swin's pooler averages every image token
        x_rows = [0] if pooled_only else None
        y_rows = [0] if pooled_only and self.image_offset else None
        keep = None
        if keep_rows is not None and not pooled_only:
            image_keep = with_pooled(keep_rows[1], self.image_offset) if self.image_offset else None  # Swin: all
            keep = (with_pooled(keep_rows[0]), image_keep)
            x_rows, y_rows = (None if k is None else keep_index(k) for k in keep)
        if self.config.fusion == "co_attention":
            last = len(self.cross_modal_text_layers) - 1
            for i, (text_layer, image_layer) in enumerate(zip(self.cross_modal_text_layers,
                                                              self.cross_modal_image_layers)):
                rx, ry = (x_rows, y_rows) if i == last else (None, None)
                x, y = text_layer(x, x_mask, y, y_mask, rx), image_layer(y, y_mask, x, x_mask, ry)  # simultaneous
            if keep is not None:  # the kept rows back at their positions
                x = x if x_rows is None else scatter_rows(x, x_rows, length_x)
                y = y if y_rows is None else scatter_rows(y, y_rows, length_y)
        else:
            x, y = run_single_stream(self.cross_modal_layers, text, image,
                                     (x_rows, y_rows or range(y.shape[1])) if pooled_only else None, keep=keep)
        text_pooled = self.cross_modal_text_pooler(x)
        image_pooled = self.cross_modal_image_pooler(y if self.image_offset else y.mean(1, keepdim=True))
        return VLOutput(text_states=x, text_mask=text.mask[:, :x.shape[1]], image_states=y,
                        image_mask=image.mask[:, :y.shape[1]],
                        text_pooled=text_pooled, image_pooled=image_pooled,
                        joint=torch.cat([text_pooled, image_pooled], dim=-1), image_offset=self.image_offset)


# -- task heads (``meter_module.py``): Linear, LayerNorm(1e-5), GELU, Linear ---------------------------------
class _MeterClassifier(JointClassifier):
    hidden_mult = 1.0

    def layers(self, model: VLModel, in_size: int, num_outputs: int) -> nn.Module:
        hidden = int(self.hidden_mult * in_size)
        return init_linear(nn.Sequential(nn.Linear(in_size, hidden), nn.LayerNorm(hidden, eps=1e-5), nn.GELU(),
                                         nn.Linear(hidden, num_outputs)), model.config.initializer_range)


@register_head("vqa", "meter")
class MeterVQAHead(_MeterClassifier):
    """``vqa_classifier`` on ``cat(text_pool, image_pool)``; BCE x answers."""

    output, loss = "vqa_classifier", "bce_instance"


@register_head("snli_ve", "meter")
class MeterSNLIVEHead(_MeterClassifier):
    """``snli_classifier``; cross-entropy."""

    output, loss = "snli_classifier", "ce"


@register_head("nlvr2", "meter", "pair")
class MeterNLVR2Head(_MeterClassifier, PairClassifier):
    """``nlvr2_classifier`` [Linear(2 x joint, joint), LN, GELU, Linear(joint, 2)] over the joint vectors of
    the two passes (image token types 1 and 2); cross-entropy."""

    output, loss, hidden_mult = "nlvr2_classifier", "ce", 0.5


@register_head("retrieval", "meter")
class MeterRetrievalHead(RankHead):
    """``rank_output`` (from ``itm_score.fc.weight[1:]``); 1 positive + ``num_negatives`` captions softmax, plus
    the ITM loss with the pre-training head frozen (``loss_names`` itm + irtr)."""

    output, recipe, frozen_itm_weight = "rank_output", "softmax", 1.0


# -- the recipe: meter/config.py task_mlm_itm_clip_bert and the released files of zdou0830/METER
METER = "zdou0830/METER"
_RELEASES = "https://github.com/zdou0830/METER/releases/download"


def meter_tokenizer(config: MeterConfig) -> str:
    """``roberta-base`` for a RoBERTa text tower, ``bert-base-uncased`` for a BERT one (meter/config.py)."""
    return "roberta-base" if config.text_encoder == "roberta" else "bert-base-uncased"


register_recipe("meter", Recipe(
    mix="meter",  # MLM + ITM in two forward passes, weight 1 each
    tokenizer=meter_tokenizer,
    objective_defaults={"itm": {"negatives": "image", "split": "half", "match_index": 1, "dropout": 0.0}},
    # meter_utils.set_schedule (no gradient clipping)
    trainer_preset=dict(max_steps=100000, lr=1e-5, lr_mult=5.0, lr_mult_head=5.0, betas=[0.9, 0.98], eps=1e-8,
                        adamw_rule="hf", weight_decay=0.01, no_decay="bert_timm", warmup=0.1, schedule="polynomial",
                        power=1.0, end_lr=0.0, schedule_offset=0, grad_clip=0.0, batching="fixed"),
    released=tuple(
        ReleasedFile(f"meter_{name}.ckpt", "meter", f"METER-{what} (`src=`)", f"{_RELEASES}/{tag}/meter_{name}.ckpt",
                     f"{METER} README.md")
        for name, tag, what in (
            ("clip16_288_roberta_pretrain", "checkpoint", "CLIP16-RoBERTa pre-trained, 288 px"),
            ("clip16_224_roberta_pretrain", "checkpoint2", "CLIP16-RoBERTa pre-trained, 224 px"),
            ("swinbase_384_roberta_pretrain", "checkpoint2", "SwinBase-RoBERTa pre-trained, 384 px"),
            ("clip16_288_roberta_vqa", "checkpoint", "CLIP16-RoBERTa fine-tuned on VQAv2, 576 px"),
            ("clip16_288_roberta_nlvr2", "checkpoint", "CLIP16-RoBERTa fine-tuned on NLVR2, 288 px"),
            ("clip16_288_roberta_snli", "checkpoint", "CLIP16-RoBERTa fine-tuned on SNLI-VE, 384 px"),
            ("clip16_288_roberta_flickr", "checkpoint", "CLIP16-RoBERTa fine-tuned on Flickr30k IR/TR, 384 px"),
            ("clip16_288_roberta_coco", "checkpoint", "CLIP16-RoBERTa fine-tuned on COCO IR/TR, 384 px"))),
    pretrained=(
        PretrainedWeights("meter", "clip16-roberta.288", "meter_clip16_288_roberta_pretrain.ckpt",
                          "METER CLIP16-RoBERTa pre-trained, 288 px"),
        PretrainedWeights("meter", "clip16-roberta.224", "meter_clip16_224_roberta_pretrain.ckpt",
                          "METER CLIP16-RoBERTa pre-trained, 224 px"),
        PretrainedWeights("meter", "swin-roberta.384", "meter_swinbase_384_roberta_pretrain.ckpt",
                          "METER SwinBase-RoBERTa pre-trained, 384 px"),
    ),
))
