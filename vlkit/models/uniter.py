"""UNITER (Chen et al. 2020): one BERT stream over ``[CLS] text [SEP]`` followed by the regions, as in
ChenRocks/UNITER ``model/model.py`` (module names without the official ``uniter.`` prefix).

The official code gathers each example's regions right after its own text length; vlkit keeps
``[text padded | regions padded]`` with the attention mask, which gives the same outputs at every
real position (attention is permutation-equivariant and positions are embedded before packing).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from vlkit.models.base import BertStreamConfig, VLModel
from vlkit.models.embeddings import BertTextEmbeddings, UniterRegionEmbeddings
from vlkit.models.layers import Pooler, bert_layers, init_bert_weights, run_single_stream
from vlkit.registry import register_model
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

    def encode_text(self, batch: VLBatch, **_: Any) -> Encoded:
        return Encoded(self.embeddings(batch.input_ids), batch.attention_mask)

    def encode_image(self, batch: VLBatch, img_type_id: int = 1, **_: Any) -> Encoded:
        if not batch.has_regions:
            raise ValueError("UNITER takes region features: the batch has no region_feats")
        # images use the text token-type table with type id 1 (official _compute_img_embeddings)
        type_emb = self.embeddings.token_type_embeddings.weight[img_type_id]
        states = self.img_embeddings(batch.region_feats, batch.region_boxes, type_emb, batch.region_masked)
        return Encoded(states, batch.region_mask)

    def fuse(self, text: Encoded, image: Encoded, pooled_only: bool = False) -> VLOutput:
        txt, img = run_single_stream(self.encoder.layer, text, image, ([0], []) if pooled_only else None)
        pooled = self.pooler(txt)
        return VLOutput(text_states=txt, text_mask=text.mask[:, :txt.shape[1]], image_states=img,
                        image_mask=image.mask[:, :img.shape[1]], text_pooled=pooled, image_pooled=pooled, joint=pooled)
