"""Pixel pipeline of the pixel families (the data path's ``data.image.transform``): resize, centre crop,
normalise, optional RandAugment.

Mirrors METER's ``meter/transforms/transform.py``: ``clip`` = bicubic resize of the shorter side, centre
crop, RGB, CLIP mean/std; ``imagenet`` (Swin towers) the same with ImageNet mean/std; ``vit`` with the
inception 0.5/0.5 normalisation; ``none`` keeps pixels in [0, 1]. ``randaug=True`` is METER's
``*_randaug`` (RandAugment(2, 9) first; torchvision's implementation). Any resolution works: the tower
interpolates its position embeddings to ``patch_grid(image_size, patch_size)``
(``vlkit.models.embeddings.interpolate_pos_embed``).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor

NORMALIZATION = {
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "vit": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}
TRANSFORMS = (*NORMALIZATION, "none")


def _to_rgb(image: Any) -> Any:
    return image.convert("RGB")


def _to_rgba(image: Any) -> Any:
    return image.convert("RGBA")


def pixel_transform(kind: str = "clip", image_size: int | None = 224, randaug: bool = False,
                    mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> Callable[[Any], Tensor]:
    """A PIL image -> FloatTensor [3, image_size, image_size] transform (METER ``<kind>[_randaug]``);
    ``image_size=None`` keeps the image's own size; ``mean`` / ``std`` replace the kind's normalisation.

    RGBA and other modes are converted to RGB (as PIL does: alpha dropped) after the crop, as METER does.
    """
    from torchvision import transforms as T

    if kind not in TRANSFORMS:
        raise ValueError(f"unknown pixel transform {kind!r}; choose from {sorted(TRANSFORMS)}")
    if image_size is not None and image_size <= 0:
        raise ValueError(f"image_size must be positive, got {image_size}")
    steps: list[Callable[[Any], Any]] = []
    if randaug:  # METER clip_randaug: RGB -> RandAugment(2, 9) -> RGBA, then the plain pipeline
        steps += [_to_rgb, T.RandAugment(num_ops=2, magnitude=9), _to_rgba]
    if image_size is not None:
        steps += [T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(image_size)]
    steps += [_to_rgb, T.ToTensor()]
    if mean is not None or kind in NORMALIZATION:
        steps.append(T.Normalize(*((mean, std) if mean is not None else NORMALIZATION[kind])))
    return T.Compose(steps)


def pixel_values(images: Iterable[Any], transform: Callable[[Any], Tensor]) -> Tensor:
    """Stack transformed images into ``pixel_values`` [B, 3, H, W] for a ``VLBatch``."""
    return torch.stack([transform(img) for img in images])


def patch_grid(image_size: int | tuple[int, int], patch_size: int) -> tuple[int, int]:
    """The (rows, cols) patch grid of an input size; the size must be a multiple of the patch size."""
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    if h % patch_size or w % patch_size:
        raise ValueError(f"image size {h}x{w} is not a multiple of the patch size {patch_size}")
    return h // patch_size, w // patch_size


__all__ = ["NORMALIZATION", "TRANSFORMS", "pixel_transform", "pixel_values", "patch_grid"]
