"""ViLT-style family for vlkit: one transformer over [text tokens; image patches], no region features."""
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import vlkit


@dataclass
class ViLTConfig(vlkit.ModelConfig):
    family = "vilt"
    presets = {
        "tiny": dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                     image_size=32, patch_size=8, initializer_range=0.1),
        "base": {},
    }

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 64
    type_vocab_size: int = 2
    modality_types: int = 2  # 0 text, 1 image (NLVR2 adds 2 for the second image)
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    image_size: int = 384
    patch_size: int = 32


# the recipe beside the model (VisualBERT's plugin still declares its recipe on the class, as older plugins do)
vlkit.register_recipe("vilt", vlkit.Recipe(
    mix={"sampling": "sum", "masking": "conditional",
         "objectives": {"mlm": {"weight": 1.0}, "itm": {"weight": 1.0, "split": "half"}}},
    trainer_preset=dict(lr=1e-4, weight_decay=0.01, no_decay="bert", warmup=0.1, schedule="linear", grad_clip=1.0),
))


@vlkit.register_model("vilt")
class ViLT(vlkit.VLModel):
    family = "vilt"
    config_class = ViLTConfig
    image_input = "pixels"
    image_types = True

    def __init__(self, config: ViLTConfig):
        super().__init__(config)
        c = config
        self.embeddings = vlkit.BertTextEmbeddings.from_config(c)
        self.patch_embed = nn.Conv2d(3, c.hidden_size, c.patch_size, stride=c.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.hidden_size))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + (c.image_size // c.patch_size) ** 2, c.hidden_size))
        self.token_type_embeddings = nn.Embedding(c.modality_types, c.hidden_size)
        self.layers = vlkit.bert_layers(c)
        self.pooler = vlkit.Pooler(c.hidden_size, c.hidden_size, "tanh")
        self.apply(lambda m: vlkit.init_bert_weights(m, c.initializer_range))
        nn.init.normal_(self.pos_embed, std=c.initializer_range)

    def extend_image_types(self, count: int) -> None:
        self.token_type_embeddings = vlkit.extend_embedding(self.token_type_embeddings, count)
        self.config.modality_types = max(self.config.modality_types, count)

    def encode_text(self, batch: vlkit.VLBatch, **_: Any) -> vlkit.Encoded:
        states = self.embeddings(batch.input_ids) + self.token_type_embeddings.weight[0]
        return vlkit.Encoded(states, batch.attention_mask)

    def encode_image(self, batch: vlkit.VLBatch, image_type_id: int = 1, **_: Any) -> vlkit.Encoded:
        if not batch.has_pixels:
            raise ValueError("ViLT takes pixels: the batch has no pixel_values")
        patches = self.patch_embed(batch.pixel_values)  # [B, H, h, w]
        pos = vlkit.interpolate_pos_embed(self.pos_embed, tuple(patches.shape[-2:]))
        tokens = torch.cat([self.cls_token.expand(len(patches), -1, -1), patches.flatten(2).transpose(1, 2)], dim=1)
        states = tokens + pos + self.token_type_embeddings.weight[image_type_id]
        return vlkit.Encoded(states, torch.ones(states.shape[:2], dtype=torch.long, device=states.device))

    def fuse(self, text: vlkit.Encoded, image: vlkit.Encoded, pooled_only: bool = False) -> vlkit.VLOutput:
        txt, img = vlkit.run_single_stream(self.layers, text, image, ([0], []) if pooled_only else None)
        pooled = self.pooler(txt)
        return vlkit.VLOutput(text_states=txt, text_mask=text.mask[:, :txt.shape[1]], image_states=img,
                              image_mask=image.mask[:, :img.shape[1]], text_pooled=pooled, image_pooled=pooled,
                              joint=pooled, image_offset=1)


@vlkit.register_head("vqa", "vilt")
class ViLTVQAHead(vlkit.JointClassifier):
    """ViLT's ``vqa_classifier``: Linear(H, 2H), LayerNorm, GELU, Linear; BCE x answers. Every other task
    uses vlkit's generic head on the joint vector."""

    output, loss = "vqa_classifier", "bce_instance"

    def layers(self, model: vlkit.VLModel, in_size: int, num_outputs: int) -> nn.Module:
        hidden = 2 * in_size
        return vlkit.init_linear(nn.Sequential(nn.Linear(in_size, hidden), nn.LayerNorm(hidden), nn.GELU(),
                                               nn.Linear(hidden, num_outputs)), model.config.initializer_range)
