"""The ViT pixel pipeline (METER transforms)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vlkit.features.patches import NORMALIZATION, patch_grid, pixel_transform, pixel_values


@pytest.mark.parametrize("kind", ["clip", "imagenet", "vit"])
def test_constant_image_normalised_per_channel(kind):
    rgb = (200, 100, 50)
    out = pixel_transform(kind, 32)(Image.new("RGB", (50, 40), rgb))
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    mean, std = NORMALIZATION[kind]
    expected = (torch.tensor(rgb) / 255 - torch.tensor(mean)) / torch.tensor(std)
    torch.testing.assert_close(out.mean(dim=(1, 2)), expected, atol=1e-3, rtol=0)


def test_resize_shorter_side_bicubic_then_centre_crop():
    # a 64x32 (w x h) image: left half black, right half white; shorter side -> 16 gives 32x16, crop 16x16
    arr = np.zeros((32, 64, 3), np.uint8)
    arr[:, 32:] = 255
    img = Image.fromarray(arr)
    out = pixel_transform("vit", 16)(img)  # vit: (x - 0.5) / 0.5, so black -1 and white +1
    expected = np.asarray(img.resize((32, 16), Image.BICUBIC).crop((8, 0, 24, 16)), np.float32) / 255 * 2 - 1
    np.testing.assert_allclose(out.permute(1, 2, 0).numpy(), expected, atol=1e-5)
    assert out[:, :, 0].mean() < -0.9 and out[:, :, -1].mean() > 0.9


@pytest.mark.parametrize("size", [224, 288, 384])
def test_any_resolution_and_rgba(size):
    rgba = Image.new("RGBA", (300, 200), (10, 20, 30, 255))
    out = pixel_transform("clip", size)(rgba)
    assert out.shape == (3, size, size)
    expected = (torch.tensor([10, 20, 30]) / 255 - torch.tensor(NORMALIZATION["clip"][0])) / torch.tensor(NORMALIZATION["clip"][1])
    torch.testing.assert_close(out[:, 0, 0], expected, atol=1e-3, rtol=0)
    assert patch_grid(size, 16) == (size // 16, size // 16)


def test_randaugment_option_changes_pixels_not_shape():
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    plain = pixel_transform("clip", 32)(img)
    torch.manual_seed(0)
    aug = pixel_values([img] * 4, pixel_transform("clip", 32, randaug=True))
    assert aug.shape == (4, 3, 32, 32)
    assert any(not torch.allclose(a, plain) for a in aug)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown pixel transform"):
        pixel_transform("swin")
    with pytest.raises(ValueError, match="multiple of the patch size"):
        patch_grid((224, 230), 16)
