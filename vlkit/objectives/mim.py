"""Masked image modelling for patch models (METER Table 7; no official code ships it).

``in_batch`` (Eq. 1): the fused state at a masked patch must pick its original patch among all
patches of the batch (NCE-style cross-entropy over in-batch candidates). ``discrete``: predict the
code of each masked patch from a patch tokenizer: a k-means codebook vlkit fits on training images,
or a DALL-E dVAE encoder loaded from a state dict the user has.
"""
from __future__ import annotations

import abc
import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlkit.models.base import VLModel
from vlkit.models.encoders import load_state_dict_file
from vlkit.objectives.base import IncompatibleObjective, Objective, PassContext, PredictionHeadTransform, accuracy
from vlkit.registry import register_objective
from vlkit.types import LossOutput, VLBatch, VLOutput


def patchify(pixel_values: Tensor, patch_size: int) -> Tensor:
    """[B, C, H, W] -> [B, N, C * p * p] in row-major patch order (the ViT token order)."""
    b, c, h, w = pixel_values.shape
    p = patch_size
    x = pixel_values.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def _normalise_patches(patches: Tensor) -> Tensor:
    """Per-patch mean / std normalisation (MAE's normalised-pixel targets)."""
    mean, var = patches.mean(-1, keepdim=True), patches.var(-1, keepdim=True)
    return (patches - mean) / (var + 1e-6).sqrt()


class PatchTokenizer(nn.Module, metaclass=abc.ABCMeta):
    """Maps images to one discrete code per patch: ``encode(pixels [B,3,H,W]) -> codes [B, N]``."""

    num_codes: int

    @abc.abstractmethod
    def encode(self, pixel_values: Tensor, patch_size: int) -> Tensor:
        """One code per ``patch_size`` patch, row-major."""


def _kmeans_plusplus(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii, 2007) of ``k`` centres among the rows of ``x``, each centre's
    distances computed once. SciPy's ``kmeans2(minit="++")`` recomputes those of every centre chosen so far at
    each step (k^2 x n x d: about a minute of a METER-tiny pre-training unit at 256 codes)."""
    centres = [x[rng.integers(len(x))]]
    d2 = ((x - centres[0]) ** 2).sum(1)
    for _ in range(1, k):
        cumulative = np.cumsum(d2)
        centres.append(x[min(int(np.searchsorted(cumulative, rng.random() * cumulative[-1])), len(x) - 1)])
        d2 = np.minimum(d2, ((x - centres[-1]) ** 2).sum(1))
    return np.stack(centres)


class KMeansPatchTokenizer(PatchTokenizer):
    """A k-means codebook over normalised pixel patches; ``fit`` it on training images (SciPy ``kmeans2``)."""

    def __init__(self, num_codes: int = 256, patch_size: int = 16, channels: int = 3):
        super().__init__()
        self.num_codes, self.patch_size = num_codes, patch_size
        self.register_buffer("centroids", torch.zeros(num_codes, channels * patch_size * patch_size))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def fit(self, pixel_values: Tensor, seed: int = 0, iterations: int = 20) -> "KMeansPatchTokenizer":
        from scipy.cluster.vq import kmeans2

        patches = _normalise_patches(patchify(pixel_values.float(), self.patch_size)).flatten(0, 1)
        if patches.shape[0] < self.num_codes:
            raise ValueError(f"k-means needs at least {self.num_codes} patches, got {patches.shape[0]}")
        data = patches.double().numpy()
        init = _kmeans_plusplus(data, self.num_codes, np.random.default_rng(seed))
        centroids, _ = kmeans2(data, init, iter=iterations, minit="matrix")
        self.centroids.copy_(torch.from_numpy(centroids).float())
        self.fitted.fill_(True)
        return self

    @torch.no_grad()
    def encode(self, pixel_values: Tensor, patch_size: int) -> Tensor:
        if not bool(self.fitted):
            raise ValueError("KMeansPatchTokenizer: call fit(images) before encoding")
        if patch_size != self.patch_size:
            raise ValueError(f"the codebook was fitted on {self.patch_size}-px patches, the model uses {patch_size}")
        patches = _normalise_patches(patchify(pixel_values.float(), patch_size))
        return torch.cdist(patches, self.centroids[None].expand(patches.shape[0], -1, -1)).argmin(-1)


class _DalleConv(nn.Module):
    """DALL-E's conv with ``w`` / ``b`` parameters (names as in the released encoder)."""

    def __init__(self, n_in: int, n_out: int, kw: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n_out, n_in, kw, kw) / math.sqrt(n_in * kw * kw))
        self.b = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.w, self.b, padding=(self.w.shape[-1] - 1) // 2)


class _DalleBlock(nn.Module):
    def __init__(self, n_in: int, n_out: int, n_layers: int):
        super().__init__()
        hid = n_out // 4
        self.post_gain = 1 / n_layers ** 2
        self.id_path = _DalleConv(n_in, n_out, 1) if n_in != n_out else nn.Identity()
        self.res_path = nn.Sequential(OrderedDict([
            ("relu_1", nn.ReLU()), ("conv_1", _DalleConv(n_in, hid, 3)), ("relu_2", nn.ReLU()),
            ("conv_2", _DalleConv(hid, hid, 3)), ("relu_3", nn.ReLU()), ("conv_3", _DalleConv(hid, hid, 3)),
            ("relu_4", nn.ReLU()), ("conv_4", _DalleConv(hid, n_out, 1))]))

    def forward(self, x: Tensor) -> Tensor:
        return self.id_path(x) + self.post_gain * self.res_path(x)


class DalleTokenizer(PatchTokenizer):
    """The DALL-E dVAE encoder (8x downsampling, 8192 codes), loaded from a state dict with the
    released key names (``blocks.input.w``, ``blocks.group_1.block_1.res_path.conv_1.w`` ...).
    Images are resized so that the code grid matches the model's patch grid."""

    def __init__(self, n_hid: int = 256, groups: int = 4, blocks_per_group: int = 2, vocab_size: int = 8192):
        super().__init__()
        self.num_codes = vocab_size
        n_layers = groups * blocks_per_group
        widths = [n_hid * 2 ** i for i in range(groups)]
        layers: list[tuple[str, nn.Module]] = [("input", _DalleConv(3, n_hid, 7))]
        for g, width in enumerate(widths):
            n_in = widths[g - 1] if g else n_hid
            group = [(f"block_{i + 1}", _DalleBlock(n_in if i == 0 else width, width, n_layers))
                     for i in range(blocks_per_group)]
            if g < groups - 1:
                group.append(("pool", nn.MaxPool2d(kernel_size=2)))
            layers.append((f"group_{g + 1}", nn.Sequential(OrderedDict(group))))
        layers.append(("output", nn.Sequential(OrderedDict([("relu", nn.ReLU()), ("conv", _DalleConv(widths[-1], vocab_size, 1))]))))
        self.blocks = nn.Sequential(OrderedDict(layers))
        self.downsample = 2 ** (groups - 1)

    @classmethod
    def from_state_dict(cls, path: str | Path, **kwargs) -> "DalleTokenizer":
        tokenizer = cls(**kwargs)
        tokenizer.load_state_dict(load_state_dict_file(path), strict=True)
        return tokenizer.eval()

    @torch.no_grad()
    def encode(self, pixel_values: Tensor, patch_size: int) -> Tensor:
        b, _, h, w = pixel_values.shape
        grid = (h // patch_size, w // patch_size)
        # the dVAE expects pixels in [0, 1] mapped to [eps, 1 - eps]; rescale per image from any normalisation
        lo = pixel_values.amin((1, 2, 3), keepdim=True)
        hi = pixel_values.amax((1, 2, 3), keepdim=True)
        x = (pixel_values - lo) / (hi - lo).clamp(min=1e-6)
        x = F.interpolate(x, size=(grid[0] * self.downsample, grid[1] * self.downsample), mode="bilinear",
                          align_corners=False)
        x = 0.8 * x + 0.1
        return self.blocks(x).argmax(1).flatten(1)


@register_objective("mim")
class MaskedImageModeling(Objective):
    """MIM. ``kind="in_batch"``: NCE over all patches of the batch (``temperature``);
    ``kind="discrete"``: CE over the codes of ``tokenizer`` (a `PatchTokenizer`, or ``"kmeans"`` to
    build a codebook of ``num_codes`` that must be fitted before training)."""

    name = "mim"
    view = "patches"

    def __init__(self, model: VLModel, kind: str = "in_batch", temperature: float = 0.07,
                 tokenizer: PatchTokenizer | str | None = None, num_codes: int = 256, dalle_path: str | None = None):
        super().__init__(model)
        if kind not in ("in_batch", "discrete"):
            raise ValueError(f"mim: kind must be 'in_batch' or 'discrete', not {kind!r}")
        self.kind, self.temperature, self.patch_size = kind, temperature, model.patch_size
        hidden = model.image_hidden_size
        self.transform = PredictionHeadTransform(hidden, hidden)
        if kind == "in_batch":
            self.target_proj = nn.Linear(3 * self.patch_size ** 2, hidden)
            return
        if dalle_path:
            tokenizer = DalleTokenizer.from_state_dict(dalle_path)
        elif tokenizer is None or tokenizer == "kmeans":
            tokenizer = KMeansPatchTokenizer(num_codes, self.patch_size)
        self.tokenizer = tokenizer.requires_grad_(False)
        self.decoder = nn.Linear(hidden, tokenizer.num_codes)

    @property
    def needs_fit(self) -> bool:
        return isinstance(getattr(self, "tokenizer", None), KMeansPatchTokenizer) and not bool(self.tokenizer.fitted)

    def fit(self, pixel_values: Tensor, seed: int = 0) -> None:
        """Fit the k-means codebook on training images [M, 3, H, W] (before pre-training)."""
        if not isinstance(getattr(self, "tokenizer", None), KMeansPatchTokenizer):
            raise ValueError("mim: only a k-means codebook is fitted; this objective has none")
        self.tokenizer.fit(pixel_values, seed=seed)

    def fitted_from_checkpoint(self) -> None:
        if isinstance(getattr(self, "tokenizer", None), KMeansPatchTokenizer):
            self.tokenizer.fitted.fill_(True)

    @classmethod
    def check(cls, model: VLModel) -> None:
        if model.image_input != "pixels":
            raise IncompatibleObjective(f"mim masks image patches; {model.family} takes {model.image_input}")

    def forward(self, out: VLOutput, batch: VLBatch, ctx: PassContext) -> LossOutput:
        if ctx.patch_masked is None:
            raise ValueError("mim: the pass has no masked patches (its view must include 'patches')")
        masked = ctx.patch_masked
        states = out.region_states
        if states.shape[1] != masked.shape[1]:
            raise ValueError(f"mim: {states.shape[1]} image tokens but {masked.shape[1]} patches were masked")
        predicted = self.transform(states[masked])
        original = ctx.original.pixel_values
        if self.kind == "in_batch":
            candidates = self.target_proj(_normalise_patches(patchify(original, self.patch_size)))  # [B, N, H]
            flat = F.normalize(candidates.flatten(0, 1), dim=-1)
            logits = F.normalize(predicted, dim=-1) @ flat.t() / self.temperature
            target = masked.flatten().nonzero().squeeze(1)
        else:
            logits = self.decoder(predicted)
            target = self.tokenizer.encode(original, self.patch_size)[masked]
        return LossOutput(F.cross_entropy(logits, target), {"acc": accuracy(logits, target, empty=0.0),
                                                            "n_masked": float(target.numel())})
