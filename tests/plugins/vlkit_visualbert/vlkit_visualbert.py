"""VisualBERT-style region family for vlkit: one transformer over [text tokens; detector regions], its config
fields named as HF's VisualBertConfig names them, and a converter of checkpoints in VisualBERT's own layout."""
from dataclasses import dataclass

import torch
from torch import nn

import vlkit
from vlkit.convert import MODEL, ConversionError, OfficialConverter


@dataclass
class VisualBertConfig(vlkit.ModelConfig):
    family = "visualbert"
    presets = {
        "tiny": dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                     visual_embedding_dim=64, initializer_range=0.1),
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
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    visual_embedding_dim: int = 2048  # the region feature size (vlkit's own families: v_feature_size)


@vlkit.register_model("visualbert")
class VisualBert(vlkit.VLModel):
    family = "visualbert"
    config_class = VisualBertConfig
    image_input = "regions"
    # the config fields the data sizes: the tokenizer's vocabulary and the feature store's feature dimension;
    # VisualBERT reads no detector classes (no region classification)
    size_fields = {"vocab_size": "vocab_size", "region_feature_size": "visual_embedding_dim", "region_classes": None}
    default_mix = {"sampling": "sum", "masking": "conditional",
                   "objectives": {"mlm": {"weight": 1.0}, "itm": {"weight": 1.0}}}

    def __init__(self, config: VisualBertConfig):
        super().__init__(config)
        c = config
        self.embeddings = vlkit.BertTextEmbeddings.from_config(c)
        self.visual_projection = nn.Linear(c.visual_embedding_dim, c.hidden_size)
        self.visual_token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.layers = vlkit.bert_layers(c)
        self.pooler = vlkit.Pooler(c.hidden_size, c.hidden_size, "tanh")
        self.apply(lambda m: vlkit.init_bert_weights(m, c.initializer_range))

    def get_region_projection(self) -> nn.Linear:
        return self.visual_projection

    def encode_text(self, batch: vlkit.VLBatch, **_) -> vlkit.Encoded:
        return vlkit.Encoded(self.embeddings(batch.input_ids), batch.attention_mask)

    def encode_image(self, batch: vlkit.VLBatch, **_) -> vlkit.Encoded:
        states = self.visual_projection(batch.region_feats) + self.visual_token_type_embeddings.weight[1]
        return vlkit.Encoded(states, batch.region_mask)

    def fuse(self, text: vlkit.Encoded, image: vlkit.Encoded, pooled_only: bool = False) -> vlkit.VLOutput:
        txt, img = vlkit.run_single_stream(self.layers, text, image, ([0], []) if pooled_only else None)
        pooled = self.pooler(txt)
        return vlkit.VLOutput(text_states=txt, text_mask=text.mask[:, :txt.shape[1]], image_states=img,
                              image_mask=image.mask[:, :img.shape[1]], text_pooled=pooled, image_pooled=pooled,
                              joint=pooled)


@vlkit.register_converter("visualbert", signature=("visual_bert.embeddings.visual_projection.",),
                          description="a VisualBERT checkpoint")
class VisualBertConverter(OfficialConverter):
    """VisualBERT's own layout (``visual_bert.embeddings.*``, ``visual_bert.encoder.layer.N.*``,
    ``visual_bert.pooler.*``) -> the bare model; the pre-training heads (``cls.*``) are declared unused.
    The shapes give the sizes; ``config=`` gives what they do not (``num_attention_heads``)."""

    family = "visualbert"
    backbone = "visual_bert."
    renames = (("embeddings.", "visual_bert.embeddings."),
               ("visual_projection.", "visual_bert.embeddings.visual_projection."),
               ("visual_token_type_embeddings.", "visual_bert.embeddings.visual_token_type_embeddings."),
               ("layers.", "visual_bert.encoder.layer."), ("pooler.", "visual_bert.pooler."))

    def prefixes(self, kind: str) -> list[tuple[str, str]]:
        return list(self.renames)

    def choose_kind(self, state: dict[str, torch.Tensor], task: str | None, name: str) -> str:
        if task not in (None, MODEL):
            raise ConversionError(f"{name}: the visualbert converter builds the bare model (task=model)")
        return MODEL

    def unused_reason(self, key: str, kind: str) -> str | None:
        return "VisualBERT's pre-training heads (this converter builds the bare model)" if key.startswith("cls.") \
            else None

    def model_config(self, state: dict[str, torch.Tensor], config: dict, meta: dict, name: str) -> VisualBertConfig:
        word = state["visual_bert.embeddings.word_embeddings.weight"]
        layers = {int(k.split(".")[3]) for k in state if k.startswith("visual_bert.encoder.layer.")}
        shapes = dict(vocab_size=word.shape[0], hidden_size=word.shape[1], num_hidden_layers=len(layers),
                      visual_embedding_dim=state["visual_bert.embeddings.visual_projection.weight"].shape[1],
                      intermediate_size=state["visual_bert.encoder.layer.0.intermediate.dense.weight"].shape[0],
                      max_position_embeddings=state["visual_bert.embeddings.position_embeddings.weight"].shape[0],
                      type_vocab_size=state["visual_bert.embeddings.token_type_embeddings.weight"].shape[0])
        return VisualBertConfig(**{**shapes, **config})

    def build(self, model: vlkit.VLModel, kind: str, state: dict[str, torch.Tensor], options: dict) -> vlkit.VLModel:
        return model
