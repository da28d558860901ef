"""Adapters to pre-trained unimodal towers: any `transformers` text encoder (RoBERTa, BERT, MiniLM ...)
and timm vision towers (CLIP-layout ViT, Swin). Heavy libraries are imported lazily.

`vlkit.ENCODERS` maps a name to a builder ``(config) -> nn.Module`` that reads a model config's
``text_*`` fields (``hf_text``: ``text_encoder``, ``text_pretrained``, ``text_config``) or ``vision_*``
fields (``clip``, ``swin``: ``vision_width``, ``vision_layers``, ``vision_heads``, ``vision_model``,
``vision_kwargs``, ``vision_pretrained``, ``patch_size``, ``image_size``); METER picks its vision
tower by ``vision_encoder``. Weights load from a local ``from_pretrained`` directory (text) or a local
checkpoint file (vision): nothing is downloaded at run time.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vlkit.models.embeddings import interpolate_pos_embed
from vlkit.registry import register_encoder
from vlkit.validate import check_no_custom_code


def load_state_dict_file(path: str | Path) -> dict[str, Tensor]:
    """A state dict from safetensors or a plain torch file (``weights_only=True``: no pickled code).

    Lightning-style ``{"state_dict": ...}`` and ``{"model": ...}`` wrappers are unwrapped.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a TorchScript archive or a pickle with code in it
        raise ValueError(f"{path}: cannot be read as a plain state dict with weights_only=True ({err}); "
                         "convert it to safetensors or a plain state dict first") from err
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a state dict, found {type(obj).__name__}")
    return obj


def build_text_encoder(model_type: str = "roberta", pretrained: str | None = None,
                       config: dict[str, Any] | None = None) -> nn.Module:
    """A `transformers` encoder without its pooler: ``from_pretrained(pretrained)`` when a local
    directory is given, else built from ``AutoConfig.for_model(model_type, **config)``."""
    from transformers import AutoConfig, AutoModel

    if pretrained:
        if not Path(pretrained).exists():
            raise FileNotFoundError(f"text encoder directory {pretrained} does not exist (no hub downloads)")
        check_no_custom_code(pretrained, "text encoder")
        return AutoModel.from_pretrained(pretrained, add_pooling_layer=False, attn_implementation="sdpa",
                                         trust_remote_code=False)
    hf_config = AutoConfig.for_model(model_type, **(config or {}))
    return AutoModel.from_config(hf_config, add_pooling_layer=False, attn_implementation="sdpa",
                                 trust_remote_code=False)


def build_clip_vision(width: int = 768, layers: int = 11, heads: int = 12, patch_size: int = 16,
                      image_size: int = 224, pretrained: str | None = None) -> nn.Module:
    """CLIP's visual transformer in timm: pre-LN (``norm_pre`` = ``ln_pre``), QuickGELU, no patch
    bias, [CLS] token, final LayerNorm on all tokens (``ln_post``), no projection. METER builds
    ``layers - 1`` blocks (11 for ViT-B) and drops CLIP's last one; pass that count as ``layers``."""
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(img_size=image_size, patch_size=patch_size, embed_dim=width, depth=layers,
                              num_heads=heads, mlp_ratio=4.0, qkv_bias=True, pre_norm=True, class_token=True,
                              global_pool="", num_classes=0, act_layer="quick_gelu",
                              norm_layer=partial(nn.LayerNorm, eps=1e-5), dynamic_img_size=True)
    if pretrained:
        state = load_state_dict_file(pretrained)
        if any(k.endswith("conv1.weight") for k in state):
            state = openai_clip_visual_to_timm(state, layers)
        state["pos_embed"] = interpolate_pos_embed(state["pos_embed"], image_size // patch_size)
        model.load_state_dict(state, strict=True)
    return model


def build_swin(name: str = "swin_base_patch4_window12_384", image_size: int = 384, pretrained: str | None = None,
               **kwargs: Any) -> nn.Module:
    """A timm Swin transformer without head; ``forward_features`` gives the final-norm tokens."""
    import timm
    from timm.models.swin_transformer import checkpoint_filter_fn

    model = timm.create_model(name, pretrained=False, num_classes=0, img_size=image_size, **kwargs)
    if pretrained:
        model.load_state_dict(checkpoint_filter_fn(load_state_dict_file(pretrained), model), strict=True)
    return model


@register_encoder("hf_text")
def text_tower(c: Any) -> nn.Module:
    return build_text_encoder(c.text_encoder, c.text_pretrained, c.text_config)


@register_encoder("clip")
def clip_tower(c: Any) -> nn.Module:
    return build_clip_vision(c.vision_width, c.vision_layers, c.vision_heads, c.patch_size, c.image_size,
                             c.vision_pretrained)


@register_encoder("swin")
def swin_tower(c: Any) -> nn.Module:
    return build_swin(c.vision_model, c.image_size, c.vision_pretrained, **c.vision_kwargs)


TEXT_ENCODERS = ("hf_text",)


def vision_tokens(model: nn.Module, pixel_values: Tensor) -> Tensor:
    """[B, L, C] tokens of a vision tower ([CLS] first for a ViT; a flattened grid for Swin)."""
    tokens = model.forward_features(pixel_values)
    return tokens.flatten(1, 2) if tokens.dim() == 4 else tokens


def vision_has_cls(model: nn.Module) -> bool:
    return getattr(model, "cls_token", None) is not None


# OpenAI CLIP visual names -> timm ViT names (outside the blocks, and inside ``transformer.resblocks.N``)
CLIP_VISUAL_TO_TIMM = {"conv1.weight": "patch_embed.proj.weight", "class_embedding": "cls_token",
                       "positional_embedding": "pos_embed", "ln_pre.weight": "norm_pre.weight",
                       "ln_pre.bias": "norm_pre.bias", "ln_post.weight": "norm.weight", "ln_post.bias": "norm.bias"}
CLIP_BLOCK_TO_TIMM = {"attn.in_proj_weight": "attn.qkv.weight", "attn.in_proj_bias": "attn.qkv.bias",
                      "attn.out_proj.weight": "attn.proj.weight", "attn.out_proj.bias": "attn.proj.bias",
                      "ln_1.weight": "norm1.weight", "ln_1.bias": "norm1.bias", "ln_2.weight": "norm2.weight",
                      "ln_2.bias": "norm2.bias", "mlp.c_fc.weight": "mlp.fc1.weight", "mlp.c_fc.bias": "mlp.fc1.bias",
                      "mlp.c_proj.weight": "mlp.fc2.weight", "mlp.c_proj.bias": "mlp.fc2.bias"}


def clip_visual_key_to_timm(key: str, layers: int) -> str | None:
    """The timm ViT key of an OpenAI CLIP visual key (``[vit_model.]visual.conv1.weight``, ...), or None for
    what METER does not use (the text tower, ``proj``, blocks at index >= ``layers``)."""
    if "visual." not in key:
        return None
    key = key.split("visual.", 1)[1]
    if key.startswith("transformer.resblocks."):
        index, rest = key[len("transformer.resblocks."):].split(".", 1)
        return f"blocks.{index}.{CLIP_BLOCK_TO_TIMM[rest]}" if int(index) < layers else None
    return None if key == "proj" else CLIP_VISUAL_TO_TIMM[key]


def openai_clip_visual_to_timm(state: dict[str, Tensor], layers: int) -> dict[str, Tensor]:
    """OpenAI CLIP visual keys (``[vit_model.]visual.conv1.weight``, ``...resblocks.N.attn.in_proj_weight``)
    -> timm ViT keys. Blocks at index >= ``layers`` and the text tower are dropped, as in METER."""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        new = clip_visual_key_to_timm(key, layers)
        if new is not None:
            out[new] = value
    out["cls_token"] = out["cls_token"].reshape(1, 1, -1)
    out["pos_embed"] = out["pos_embed"].unsqueeze(0)
    return out
