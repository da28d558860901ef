"""UNITER (Chen et al. 2020): one BERT stream over ``[CLS] text [SEP]`` followed by the regions, as in
ChenRocks/UNITER ``model/model.py`` (module names without the official ``uniter.`` prefix).

The official code gathers each example's regions right after its own text length (``gather_index``);
so does vlkit's ``fuse`` (`run_single_stream` with ``pack=True``), padding only to the longest text +
regions pair, and it scatters the states back to ``[text padded | regions padded]`` for the objectives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlkit.models.base import BertStreamConfig, VLModel
from vlkit.models.embeddings import BertTextEmbeddings, UniterRegionEmbeddings
from vlkit.models.heads import Head, JointClassifier, RankHead, RegionScorer
from vlkit.models.layers import MASK_VALUE, Pooler, bert_layers, extend_embedding, init_bert_weights, run_single_stream
from vlkit.models.recipe import Recipe, register_recipe
from vlkit.models.rows import with_pooled
from vlkit.registry import register_head, register_model
from vlkit.released import PretrainedWeights, ReleasedFile
from vlkit.types import Encoded, VLBatch, VLOutput


@dataclass
class UniterConfig(BertStreamConfig):
    """``config/uniter-base.json`` (bert-base-cased vocabulary) and ``uniter-large.json``."""

    family = "uniter"
    presets = {
        "tiny": dict(vocab_size=1000, hidden_size=64, initializer_range=0.1, num_hidden_layers=4, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=64, v_feature_size=256, v_target_size=8,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
        "base": {},
        "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    }

    vocab_size: int = 28996  # bert-base-cased


@register_model("uniter")
class Uniter(VLModel):
    """UNITER: ``joint`` is the tanh-pooled [CLS]. ``encode_text`` / ``encode_image`` cache the
    embeddings only (everything after them is joint)."""

    family = "uniter"
    config_class = UniterConfig
    image_input = "regions"
    image_types = True
    keeps_rows = True  # fuse takes keep_rows

    def __init__(self, config: UniterConfig):
        super().__init__(config)
        c = config
        self.embeddings = BertTextEmbeddings.from_config(c)
        self.img_embeddings = UniterRegionEmbeddings(c.v_feature_size, c.hidden_size, c.layer_norm_eps,
                                                     c.hidden_dropout_prob)
        self.encoder = nn.Module()
        self.encoder.layer = bert_layers(c)
        self.pooler = Pooler(c.hidden_size, c.hidden_size, "tanh")
        self.apply(lambda m: init_bert_weights(m, c.initializer_range))

    def get_region_projection(self) -> nn.Linear:
        return self.img_embeddings.img_linear

    def encoding_modules(self, side: str) -> tuple[nn.Module, ...]:
        return (self.embeddings,) if side == "text" else (self.img_embeddings, self.embeddings.token_type_embeddings)

    def encode_text(self, batch: VLBatch, **_: Any) -> Encoded:
        return Encoded(self.embeddings(batch.input_ids), batch.attention_mask)

    def extend_image_types(self, count: int) -> None:
        self.embeddings.token_type_embeddings = extend_embedding(self.embeddings.token_type_embeddings, count)
        self.config.type_vocab_size = max(self.config.type_vocab_size, count)

    def encode_image(self, batch: VLBatch, image_type_id: int = 1, **_: Any) -> Encoded:
        if not batch.has_regions:
            raise ValueError("UNITER takes region features: the batch has no region_feats")
        # images use the text token-type table with type id 1 (official _compute_img_embeddings)
        type_emb = self.embeddings.token_type_embeddings.weight[image_type_id]
        states = self.img_embeddings(batch.region_feats, batch.region_boxes, type_emb, batch.region_masked,
                                     batch.region_wh)
        return Encoded(states, batch.region_mask)

    def fuse(self, text: Encoded, image: Encoded, pooled_only: bool = False,
             keep_rows: tuple[Tensor | None, Tensor | None] | None = None) -> VLOutput:
        keep = None if keep_rows is None else (with_pooled(keep_rows[0]), keep_rows[1])
        txt, img = run_single_stream(self.encoder.layer, text, image, ([0], []) if pooled_only else None, pack=True,
                                     keep=keep)
        pooled = self.pooler(txt)
        return VLOutput(text_states=txt, text_mask=text.mask[:, :txt.shape[1]], image_states=img,
                        image_mask=image.mask[:, :img.shape[1]], text_pooled=pooled, image_pooled=pooled, joint=pooled)


# -- task heads ----------------------------------------------------------------------------------------
@register_head("vqa", "uniter")
class UniterVQAHead(JointClassifier):
    """``vqa_output`` (Linear, GELU, LayerNorm, Linear; hidden 2 x H); BCE x answers."""

    output, loss = "vqa_output", "bce_instance"


@register_head("snli_ve", "uniter")
class UniterSNLIVEHead(UniterVQAHead):
    """UNITER's VE model subclasses its VQA model: ``vqa_output`` with 3 outputs; BCE x 3."""


class UniterNLVR2Pair(Head):
    """``nlvr2_output`` Linear(2H, 2) over the two pooled [CLS] (``UniterForNlvr2Paired``); CE."""

    output, loss = "nlvr2_output", "ce"

    def __init__(self, model: Uniter, num_outputs: int = 2):
        super().__init__()
        self.nlvr2_output = nn.Linear(2 * model.joint_size, num_outputs)
        self.build_attention(model.config)
        for module in self.children():  # official init_weights: Linear layers (out_proj included), not in_proj
            module.apply(lambda m: init_bert_weights(m, model.config.initializer_range))

    def build_attention(self, c: UniterConfig) -> None:
        """The layers between the model and ``nlvr2_output`` (none here)."""

    def forward(self, left: VLOutput, right: VLOutput) -> Tensor:
        return self.nlvr2_output(torch.cat([left.joint, right.joint], dim=-1))


class AttentionPool(nn.Module):
    """UNITER's attention pooling: softmax over positions of ``ReLU(Linear(h))`` (pads at -1e4), dropout."""

    def __init__(self, hidden_size: int, dropout: float = 0.0):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(hidden_size, 1), nn.ReLU())
        self.dropout = nn.Dropout(dropout)

    def forward(self, states: Tensor, pad: Tensor) -> Tensor:
        score = self.fc(states).squeeze(-1) + pad.to(states.dtype) * MASK_VALUE
        weights = self.dropout(F.softmax(score, dim=1))
        return (weights.unsqueeze(1) @ states).squeeze(1)


class UniterNLVR2PairedAttention(UniterNLVR2Pair):
    """``UniterForNlvr2PairedAttn`` (the official default, ``paired-attn``): ``attn1`` / ``attn2``
    cross-attention left -> right and right -> left over the whole sequences, ``fc`` on ``[attended,
    own]``, ``attn_pool`` per side, ``nlvr2_output`` on both pools; CE."""

    pooled_only = False

    def build_attention(self, c: UniterConfig) -> None:
        h, heads, drop = c.hidden_size, c.num_attention_heads, c.attention_probs_dropout_prob
        self.attn1 = nn.MultiheadAttention(h, heads, drop, batch_first=True)  # left queries the right
        self.attn2 = nn.MultiheadAttention(h, heads, drop, batch_first=True)  # right queries the left
        self.fc = nn.Sequential(nn.Linear(2 * h, h), nn.ReLU(), nn.Dropout(c.hidden_dropout_prob))
        self.attn_pool = AttentionPool(h, drop)

    def forward(self, left: VLOutput, right: VLOutput) -> Tensor:
        (left, left_pad), (right, right_pad) = _sequence(left), _sequence(right)
        l2r, _ = self.attn1(left, right, right, key_padding_mask=right_pad, need_weights=False)
        r2l, _ = self.attn2(right, left, left, key_padding_mask=left_pad, need_weights=False)
        left = self.attn_pool(self.fc(torch.cat([l2r, left], dim=-1)), left_pad)
        right = self.attn_pool(self.fc(torch.cat([r2l, right], dim=-1)), right_pad)
        return self.nlvr2_output(torch.cat([left, right], dim=-1))


def _sequence(out: VLOutput) -> tuple[Tensor, Tensor]:
    """The whole sequence [n, T + K, H] of an output and its padding (True = pad)."""
    states = torch.cat([out.text_states, out.image_states], dim=1)
    return states, torch.cat([out.text_mask, out.image_mask], dim=1) == 0


register_head("nlvr2", "uniter", "pair")(UniterNLVR2Pair)
register_head("nlvr2", "uniter", "pair_biattn", default=True)(UniterNLVR2PairedAttention)


@register_head("refexp", "uniter")
class UniterRefExpHead(RegionScorer):
    """``re_output`` (``model/re.py``; ``mlp=2`` in the RefCOCO+ config); CE toward the best region."""

    output, loss = "re_output", "ce"


@register_head("retrieval", "uniter")
class UniterRetrievalHead(RankHead):
    """``rank_output`` (initialised from the ITM "matched" row, ``init_output``); hard-negative triplets."""

    output, recipe = "rank_output", "hard_negatives"


# -- the recipe: config/pretrain-alldata-base-8gpu.json and the released files of ChenRocks/UNITER
UNITER = "ChenRocks/UNITER"
_BLOB = "https://convaisharables.blob.core.windows.net/uniter/pretrained"
register_recipe("uniter", Recipe(
    mix="uniter",  # ITM (+ WRA) : MLM : MRFR : MRC-kl, one per step
    tokenizer="bert-base-cased",
    objective_defaults={
        "itm": {"negatives": "image", "split": "bernoulli", "match_index": 1, "dropout": 0.0},
        "mrc": {"reduction": "mean"},
        "mrc_kl": {"reduction": "mean"},
    },
    # config/pretrain-*-base-8gpu.json, optim/misc.py (AdamW eps 1e-6), optim/sched.py
    trainer_preset=dict(max_steps=200000, lr=5e-5, betas=[0.9, 0.98], eps=1e-6, weight_decay=0.01, no_decay="bert",
                        adamw_rule="hf", warmup=10000, schedule="linear", schedule_offset=1, grad_clip=5.0,
                        batching="units", max_units=10240, bucket_size=8192, size_multiple=8),
    # data/re.py computeIoU, train_re.validate: xywh boxes, the intersection counted only when both its sides exceed
    # one pixel, areas w x h, IoU > 0.5
    refexp=("uniter", ">"),
    released=(
        ReleasedFile("uniter-base.pt", "uniter", "UNITER-base pre-trained (`src=`)", f"{_BLOB}/uniter-base.pt",
                     f"{UNITER} scripts/download_pretrained.sh"),
        ReleasedFile("uniter-large.pt", "uniter", "UNITER-large pre-trained (`src=`)", f"{_BLOB}/uniter-large.pt",
                     f"{UNITER} scripts/download_pretrained.sh"),
        ReleasedFile("uniter-base.json", "uniter", "the UNITER-base model config (`config=`)",
                     f"https://github.com/{UNITER}/blob/master/config/uniter-base.json",
                     f"{UNITER} README.md (--model_config)"),
        ReleasedFile("nlvr-base.tar", "uniter",
                     "UNITER-base fine-tuned on NLVR2 (a training folder; its ckpt/*.pt go to `src=`)",
                     "https://acvrpublicycchen.blob.core.windows.net/uniter/finetune/nlvr-base.tar",
                     f"{UNITER} scripts/download_nlvr2.sh"),
    ),
    pretrained=(
        PretrainedWeights("uniter", "base.official", "uniter-base.pt", "UNITER-base pre-trained"),
        PretrainedWeights("uniter", "large.official", "uniter-large.pt", "UNITER-large pre-trained"),
    ),
))
