"""ViLBERT (Lu et al. 2019): two streams joined by co-attention, as in facebookresearch/vilbert-multi-task.

Module names follow the official ``BertModel`` (without its ``bert.`` prefix), so the keys of released
checkpoints line up after that prefix. Execution order of the base model
(``v_biattention_id`` 0-5, ``t_biattention_id`` 6-11): text L0-L5; co0; (L6, V0); co1; ...; co5; V5; L11.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from vlkit.models.base import BertStreamConfig, VLModel
from vlkit.models.embeddings import BertTextEmbeddings, ViLBERTRegionEmbeddings
from vlkit.models.heads import JointClassifier, PairClassifier, RankHead, RegionScorer, init_linear
from vlkit.models.layers import (BertIntermediate, BertLayer, BertOutput, BiAttention, BiOutput, Pooler,
                                 additive_mask, bert_layers, init_bert_weights, run_layers, run_single_stream)
from vlkit.models.recipe import Recipe, register_recipe
from vlkit.models.rows import with_pooled
from vlkit.registry import register_head, register_model
from vlkit.released import PretrainedWeights, ReleasedFile
from vlkit.types import Encoded, VLBatch, VLOutput


IMG_FEATURE_RULES = ("official", "mean")
OVERLAP_IOU = 0.4  # concept_cap_dataset.py random_region: regions overlapping a masked one leave the divisor


@dataclass
class ViLBERTConfig(BertStreamConfig):
    """``bert_base_6layer_6conect.json`` plus the ``BertConfig`` defaults the official code reads.

    ``num_coattention_layers`` (k in Table 2: 2/4/6/8) rewrites the layer schedule as the official
    ``bert_base_{k}layer_{k}conect.json`` files do; ``single_stream`` is the paper's single-stream
    baseline (``basebert.py``: one BERT over text and regions, tanh pooler on [CLS]).

    ``img_feature`` is the rule for the [IMG] token's feature (see `ViLBERT.global_feature`):
    ``official`` follows the official pipeline the batch comes from (pre-training or task loaders),
    ``mean`` takes the plain mean of the real regions everywhere.
    """

    family = "vilbert"
    presets = {
        "tiny": dict(vocab_size=1000, hidden_size=64, initializer_range=0.1, num_hidden_layers=4, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=64, v_feature_size=256, v_target_size=8,
                     v_hidden_size=64, v_num_hidden_layers=2, v_num_attention_heads=2, v_intermediate_size=64,
                     bi_hidden_size=64, bi_num_attention_heads=2, v_biattention_id=[0, 1], t_biattention_id=[2, 3],
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, v_hidden_dropout_prob=0.0,
                     v_attention_probs_dropout_prob=0.0),
        "base": {},
        "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                      t_biattention_id=[18, 19, 20, 21, 22, 23]),
    }

    v_hidden_size: int = 1024
    v_num_hidden_layers: int = 6
    v_num_attention_heads: int = 8
    v_intermediate_size: int = 1024
    v_hidden_act: str = "gelu"
    v_hidden_dropout_prob: float = 0.1
    v_attention_probs_dropout_prob: float = 0.1
    bi_hidden_size: int = 1024
    bi_num_attention_heads: int = 8
    v_biattention_id: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4, 5])
    t_biattention_id: list[int] = field(default_factory=lambda: [6, 7, 8, 9, 10, 11])
    num_coattention_layers: int | None = None
    fusion_method: str = "mul"
    task_specific_tokens: bool = False
    num_task_tokens: int = 20
    single_stream: bool = False
    img_feature: str = "official"  # or "mean"

    def __post_init__(self) -> None:
        k = self.num_coattention_layers
        if k is not None:
            if not 0 < k <= self.num_hidden_layers:
                raise ValueError(f"num_coattention_layers={k} must be in 1..{self.num_hidden_layers}")
            self.v_num_hidden_layers = k
            self.v_biattention_id = list(range(k))
            self.t_biattention_id = list(range(self.num_hidden_layers - k, self.num_hidden_layers))
        if len(self.v_biattention_id) != len(self.t_biattention_id):
            raise ValueError("v_biattention_id and t_biattention_id must have the same length")
        if self.fusion_method not in ("mul", "sum"):
            raise ValueError(f"fusion_method must be 'mul' or 'sum', not {self.fusion_method!r}")
        if self.img_feature not in IMG_FEATURE_RULES:
            raise ValueError(f"img_feature must be one of {', '.join(IMG_FEATURE_RULES)}, not {self.img_feature!r}")


class ViLBERTEncoder(nn.Module):
    """The text layers, visual layers and co-attention layers (official ``BertEncoder`` names)."""

    def __init__(self, c: ViLBERTConfig):
        super().__init__()
        self.layer = bert_layers(c)
        if c.single_stream:
            return
        self.v_layer = nn.ModuleList(
            BertLayer(c.v_hidden_size, c.v_num_attention_heads, c.v_intermediate_size, c.v_hidden_act, c.layer_norm_eps,
                      c.v_hidden_dropout_prob, c.v_attention_probs_dropout_prob) for _ in range(c.v_num_hidden_layers))
        self.c_layer = nn.ModuleList(ConnectionLayer(c) for _ in c.v_biattention_id)


class ConnectionLayer(nn.Module):
    """Co-TRM: cross-attention both ways from the layer inputs (streams updated simultaneously),
    then each stream's own FFN (official ``BertConnectionLayer``)."""

    def __init__(self, c: ViLBERTConfig):
        super().__init__()
        eps = c.layer_norm_eps
        self.biattention = BiAttention(c.v_hidden_size, c.hidden_size, c.bi_hidden_size, c.bi_num_attention_heads,
                                       c.attention_probs_dropout_prob)
        self.biOutput = BiOutput(c.bi_hidden_size, c.v_hidden_size, c.hidden_size, eps, c.hidden_dropout_prob)
        self.v_intermediate = BertIntermediate(c.v_hidden_size, c.v_intermediate_size, c.v_hidden_act)
        self.v_output = BertOutput(c.v_intermediate_size, c.v_hidden_size, eps, c.v_hidden_dropout_prob)
        self.t_intermediate = BertIntermediate(c.hidden_size, c.intermediate_size, c.hidden_act)
        self.t_output = BertOutput(c.intermediate_size, c.hidden_size, eps, c.hidden_dropout_prob)

    def forward(self, vis: Tensor, vis_mask: Tensor, txt: Tensor, txt_mask: Tensor, vis_proj: Tensor | None = None,
                txt_proj: Tensor | None = None) -> tuple[Tensor, Tensor]:
        ctx_vis, ctx_txt = self.biattention(vis, vis_mask, txt, txt_mask, vis_proj, txt_proj)
        vis, txt = self.biOutput(ctx_vis, vis, ctx_txt, txt)
        return self.v_output(self.v_intermediate(vis), vis), self.t_output(self.t_intermediate(txt), txt)


@register_model("vilbert")
class ViLBERT(VLModel):
    """ViLBERT: ``joint = pooled_t * pooled_v`` (ReLU poolers 768->1024 and 1024->1024).

    ``encode_text`` caches the text stream up to its first co-attention layer, ``encode_image``
    the region embeddings with the leading [IMG] token (`global_feature`, box [0,0,1,1]); each also caches
    the first co-attention's projections of its stream (``extra["co_proj"]``).
    """

    family = "vilbert"
    config_class = ViLBERTConfig
    image_input = "regions"
    image_offset = 1  # the [IMG] token
    keeps_rows = True  # fuse takes keep_rows
    # vilbert_tasks.yml TASK<n> (retrieval: Flickr30k, COCO is 7; refexp: refcoco+, refcoco 9, refcocog 11; GQA 15)
    official_task_ids = {"vqa": 1, "retrieval": 8, "refexp": 10, "nlvr2": 12, "snli_ve": 13}

    def __init__(self, config: ViLBERTConfig):
        super().__init__(config)
        c = config
        self.embeddings = BertTextEmbeddings.from_config(c)
        if c.task_specific_tokens:
            self.embeddings.task_embeddings = nn.Embedding(c.num_task_tokens, c.hidden_size)
        v_hidden = c.hidden_size if c.single_stream else c.v_hidden_size
        self.v_embeddings = ViLBERTRegionEmbeddings(c.v_feature_size, v_hidden, c.layer_norm_eps, c.v_hidden_dropout_prob,
                                                    type_vocab_size=c.type_vocab_size if c.single_stream else 0)
        self.encoder = ViLBERTEncoder(c)
        if c.single_stream:
            self.pooler = Pooler(c.hidden_size, c.hidden_size, "tanh")
        else:
            self.t_pooler = Pooler(c.hidden_size, c.bi_hidden_size, "relu")
            self.v_pooler = Pooler(c.v_hidden_size, c.bi_hidden_size, "relu")
        self.apply(lambda m: init_bert_weights(m, c.initializer_range))

    @property
    def image_hidden_size(self) -> int:
        return self.config.hidden_size if self.config.single_stream else self.config.v_hidden_size

    @property
    def joint_size(self) -> int:
        return self.config.hidden_size if self.config.single_stream else self.config.bi_hidden_size

    def get_region_projection(self) -> nn.Linear:
        return self.v_embeddings.image_embeddings

    def _first_layers(self) -> tuple[int, int]:
        c = self.config
        return (c.num_hidden_layers, 0) if c.single_stream else (c.t_biattention_id[0], c.v_biattention_id[0])

    def encode_text(self, batch: VLBatch, task_ids: Tensor | None = None, **_: Any) -> Encoded:
        emb = self.embeddings.summed(batch.input_ids)
        mask = batch.attention_mask
        if self.config.task_specific_tokens:
            if task_ids is None:
                raise ValueError("this ViLBERT has task_specific_tokens=True: pass task_ids [B] to the model")
            # inserted after [CLS], before the LayerNorm, with no position / type embedding (official)
            task = self.embeddings.task_embeddings(task_ids.view(-1, 1))
            emb = torch.cat([emb[:, :1], task, emb[:, 1:]], dim=1)
            mask = torch.cat([mask[:, :1], torch.ones_like(mask[:, :1]), mask[:, 1:]], dim=1)
        states = self.embeddings.normalize(emb)
        if self.config.single_stream:
            return Encoded(states, mask)
        first_co = self._first_layers()[0]
        states = run_layers(self.encoder.layer[:first_co], states, additive_mask(mask, states.dtype))
        # the first co-attention's query2 / key2 / value2 read this alone: cached with it
        return Encoded(states, mask, {"co_proj": self.encoder.c_layer[0].biattention.project_text(states)})

    def encode_image(self, batch: VLBatch, **_: Any) -> Encoded:
        if not batch.has_regions:
            raise ValueError("ViLBERT takes region features: the batch has no region_feats")
        feats, boxes, mask = batch.region_feats, batch.region_boxes, batch.region_mask
        img_feat = self.global_feature(batch)[:, None]
        img_box = boxes.new_tensor([0.0, 0.0, 1.0, 1.0]).expand(feats.shape[0], 1, 4)
        feats = torch.cat([img_feat, feats], dim=1)
        boxes = torch.cat([img_box, boxes], dim=1)
        mask = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1)
        states = self.v_embeddings(feats, boxes)
        if self.config.single_stream:
            return Encoded(states, mask)
        first_co = self._first_layers()[1]
        states = run_layers(self.encoder.v_layer[:first_co], states, additive_mask(mask, states.dtype))
        return Encoded(states, mask, {"co_proj": self.encoder.c_layer[0].biattention.project_vision(states)})

    def global_feature(self, batch: VLBatch) -> Tensor:
        """The [IMG] token's feature [B, D] under ``config.img_feature``.

        ``official``: a batch that went through region masking (``region_masked`` set: the pre-training
        pipeline) follows ``ConceptCapLoaderTrain.__iter__`` (L250-253): the sum of the (masked) features
        over every slot divided by the number of slots that are neither masked nor overlap a masked
        region (IoU > 0.4 on pixel boxes, +1 convention; padded slots count), at least 1. Any other batch
        follows the task loaders (``_image_features_reader.py`` L148-149): the mean of all the image's
        stored regions, i.e. ``region_global`` when the image source gives it (it survives the cut to
        ``max_region_num``), else the mean of the real regions.
        ``mean``: the mean of the real regions, in every pipeline.
        """
        feats, mask = batch.region_feats, batch.region_mask
        real = mask.to(feats.dtype)[..., None]
        total = (feats * real).sum(1)
        rule = self.config.img_feature
        if rule == "official" and batch.region_masked is not None:
            excluded = _overlapping(batch.region_boxes, batch.region_masked.bool() & mask.bool(), batch.image_size)
            excluded &= mask.bool()
            kept = (excluded.shape[1] - excluded.sum(1, keepdim=True)).clamp(min=1)
            return total / kept.to(feats.dtype)
        if rule == "official" and batch.region_global is not None:
            return batch.region_global.to(feats.dtype)
        return total / real.sum(1).clamp(min=1.0)

    def fuse(self, text: Encoded, image: Encoded, pooled_only: bool = False,
             keep_rows: tuple[Tensor | None, Tensor | None] | None = None) -> VLOutput:
        c = self.config
        txt, vis = text.states, image.states
        first = [0] if pooled_only else None  # the poolers read position 0 ([CLS], [IMG])
        t_keep = v_keep = None
        if keep_rows is not None and not pooled_only:
            t_keep, v_keep = keep_rows
            if t_keep is not None and c.task_specific_tokens:  # the inserted task token is never read
                t_keep = torch.cat([t_keep[:, :1], torch.zeros_like(t_keep[:, :1]), t_keep[:, 1:]], dim=1)
            t_keep, v_keep = with_pooled(t_keep), with_pooled(v_keep, offset=1)
        if c.single_stream:
            txt, vis = run_single_stream(self.encoder.layer, text, image, (first, first) if pooled_only else None,
                                         keep=None if keep_rows is None else (t_keep, v_keep))
            text_pooled, image_pooled = self.pooler(txt), self.pooler(vis)
            joint = text_pooled
        else:
            t_mask, v_mask = additive_mask(text.mask, txt.dtype), additive_mask(image.mask, vis.dtype)
            t_start, v_start = self._first_layers()
            for count, (v_end, t_end) in enumerate(zip(c.v_biattention_id, c.t_biattention_id)):
                txt = run_layers(self.encoder.layer[t_start:t_end], txt, t_mask)
                vis = run_layers(self.encoder.v_layer[v_start:v_end], vis, v_mask)
                cached = (image.extra.get("co_proj"), text.extra.get("co_proj")) if count == 0 else (None, None)
                vis, txt = self.encoder.c_layer[count](vis, v_mask, txt, t_mask, *cached)
                t_start, v_start = t_end, v_end
            vis = run_layers(self.encoder.v_layer[v_start:], vis, v_mask, first, keep=v_keep)
            txt = run_layers(self.encoder.layer[t_start:], txt, t_mask, first, keep=t_keep)
            text_pooled, image_pooled = self.t_pooler(txt), self.v_pooler(vis)
            joint = text_pooled * image_pooled if c.fusion_method == "mul" else text_pooled + image_pooled
        text_mask, image_mask = text.mask[:, :txt.shape[1]], image.mask[:, :vis.shape[1]]
        if c.task_specific_tokens and not pooled_only:  # drop the task token so text states align with input_ids
            txt = torch.cat([txt[:, :1], txt[:, 2:]], dim=1)
            text_mask = torch.cat([text_mask[:, :1], text_mask[:, 2:]], dim=1)
        return VLOutput(text_states=txt, text_mask=text_mask, image_states=vis, image_mask=image_mask,
                        text_pooled=text_pooled, image_pooled=image_pooled, joint=joint, image_offset=1)

    def task_inputs(self, task: str, batch: VLBatch, task_id: int | None = None) -> dict[str, Any]:
        """``task_ids`` (the official task number unless ``task_id`` is given) when the model has task tokens."""
        if not self.config.task_specific_tokens:
            return {}
        task_id = self.official_task_ids.get(task, 0) if task_id is None else int(task_id)
        return {"task_ids": torch.full((batch.batch_size,), task_id, dtype=torch.long, device=batch.device)}


def _overlapping(boxes: Tensor, masked: Tensor, image_size: Tensor | None) -> Tensor:
    """[B, K] bool: the masked regions and every region whose IoU with a masked one exceeds 0.4 (the
    official ``masked_label``). IoU as ``concept_cap_dataset.iou``: pixel boxes with the +1 convention
    when ``image_size`` [B, 2] (h, w) is known, else the normalised boxes as they are."""
    if image_size is not None:
        h, w = image_size.to(boxes.dtype).unbind(-1)
        boxes = boxes * torch.stack([w, h, w, h], -1)[:, None]
        one = 1.0
    else:
        one = 0.0
    x1, y1, x2, y2 = boxes.unbind(-1)
    area = (x2 - x1 + one) * (y2 - y1 + one)
    iw = (torch.minimum(x2[:, :, None], x2[:, None]) - torch.maximum(x1[:, :, None], x1[:, None]) + one).clamp(min=0)
    ih = (torch.minimum(y2[:, :, None], y2[:, None]) - torch.maximum(y1[:, :, None], y1[:, None]) + one).clamp(min=0)
    inter = iw * ih
    iou = inter / (area[:, :, None] + area[:, None] - inter)
    return masked | ((iou > OVERLAP_IOU) & masked[:, :, None]).any(1)


# -- task heads (``VILBertForVLTasks``): each reads dropout(0.1) of the joint vector / region states ------------
@register_head("vqa", "vilbert")
class ViLBERTVQAHead(JointClassifier):
    """``vil_prediction``: ``SimpleClassifier`` (hidden 2 x joint); BCE x answers."""

    output, loss, dropout_prob = "vil_prediction", "bce_instance", 0.1


@register_head("vqa", "vilbert", "gqa")
class ViLBERTGQAHead(ViLBERTVQAHead):
    """``vil_prediction_gqa``: the multi-task model's GQA classifier (TASK15, ``VL-classifier-GQA``, 1533
    answers); build the VQA task with ``head="gqa", task_id=15``."""

    output = "vil_prediction_gqa"


@register_head("vqa", "vilbert", "beta")
class ViLBERTBetaVQAHead(ViLBERTVQAHead):
    """vilbert_beta's ``vil_prediction``: ``SimpleClassifier`` = Linear, ReLU, Dropout(0.5), Linear (the
    released weight-normalised layers are folded into plain weights by the converter)."""

    def layers(self, model: VLModel, in_size: int, num_outputs: int) -> nn.Module:
        hidden = int(self.hidden_mult * in_size)
        return init_linear(nn.Sequential(nn.Linear(in_size, hidden), nn.ReLU(), nn.Dropout(0.5),
                                         nn.Linear(hidden, num_outputs)), model.config.initializer_range)


@register_head("snli_ve", "vilbert")
class ViLBERTSNLIVEHead(JointClassifier):
    """``vil_tri_prediction``: Linear(joint, 3); BCE on one-hot targets."""

    output, loss, dropout_prob = "vil_tri_prediction", "bce", 0.1

    def layers(self, model: VLModel, in_size: int, num_outputs: int) -> nn.Module:
        head = nn.Linear(in_size, num_outputs)
        init_bert_weights(head, model.config.initializer_range)
        return head


@register_head("nlvr2", "vilbert", "pair")
class ViLBERTNLVR2Head(PairClassifier):
    """``vil_binary_prediction``: ``SimpleClassifier`` over both joint vectors (hidden 2 x joint); BCE."""

    output, loss, dropout_prob = "vil_binary_prediction", "bce", 0.1


@register_head("refexp", "vilbert")
class ViLBERTRefExpHead(RegionScorer):
    """``vision_logit``: Linear(v_hidden, 1) on each region state; BCE against the IoU targets."""

    output, loss, dropout_prob = "vision_logit", "bce", 0.1

    def layers(self, model: VLModel, size: int, mlp: int) -> nn.Module:
        return nn.Linear(size, 1)


@register_head("retrieval", "vilbert")
class ViLBERTRetrievalHead(RankHead):
    """``vil_logit``: Linear(joint, 1); 4-way multiple choice with a hard negative; randomly initialised."""

    output, dropout_prob, recipe, init_from_itm = "vil_logit", 0.1, "multiple_choice", False


# -- the recipe: train_concap.py (pretrained_model.bin) and the released files of facebookresearch/vilbert-multi-task
VILBERT = "facebookresearch/vilbert-multi-task"
_FB = "https://dl.fbaipublicfiles.com/vilbert-multi-task"
_CONFIG = "bert_base_6layer_6conect.json"
register_recipe("vilbert", Recipe(
    mix="vilbert",  # MLM + MRC-kl + ITM summed, joint masking
    tokenizer="bert-base-uncased",
    objective_defaults={
        "itm": {"negatives": "text", "split": "bernoulli", "match_index": 0, "dropout": 0.1},
        "mrc": {"reduction": "per_region"},
        "mrc_kl": {"reduction": "per_region"},
    },
    # AdamW, WarmupLinearSchedule stepped before the optimizer, no clipping
    trainer_preset=dict(lr=1e-4, betas=[0.9, 0.98], eps=1e-8, weight_decay=0.01, no_decay="bert", warmup=0.1,
                        adamw_rule="hf", schedule="linear", schedule_offset=1, grad_clip=0.0, batching="fixed",
                        batch_size=512),
    # refer_expression_dataset.iou + task_utils "V-logit": +1 pixel in widths, heights and the intersection, IoU > 0.5
    refexp=("plus_one", ">"),
    released=(
        ReleasedFile("pretrained_model.bin", "vilbert", "ViLBERT pre-trained on Conceptual Captions (`src=`)",
                     f"{_FB}/pretrained_model.bin", f"{VILBERT} README.md"),
        ReleasedFile("multi_task_model.bin", "vilbert", "12-in-1 multi-task ViLBERT, every task head (`src=`, `task=`)",
                     f"{_FB}/multi_task_model.bin", f"{VILBERT} README.md"),
        ReleasedFile(_CONFIG, "vilbert", "the model config of both files (`config=`)",
                     f"https://github.com/{VILBERT}/blob/master/config/{_CONFIG}",
                     f"{VILBERT} config/ (named by README.md's commands)"),
        ReleasedFile("trainval_label2ans.pkl", "vilbert", "VQA answers in label order (`answers=`)",
                     f"{_FB}/datasets.tar.gz (the VQA data root's cache/ folder)", f"{VILBERT} data/README.md"),
    ),
    pretrained=(
        PretrainedWeights("vilbert", "base.official", "pretrained_model.bin", "ViLBERT pre-trained on Conceptual Captions",
                          config=_CONFIG),
        PretrainedWeights("vilbert", "base.multitask", "multi_task_model.bin", "12-in-1 multi-task ViLBERT",
                          task="pretraining", config=_CONFIG),
    ),
))
