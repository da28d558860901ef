"""Retrieval's pre-ranking (``eval_mode=rerank``): a cheap learned score over the cached unimodal encodings.
Each caption and image is summarised by the masked mean and max of its encoding (`summary`); a ridge
regression maps the centred image summary onto the centred summary of its captions (`fit_ridge`), and a
pair's pre-score is the cosine between the caption's summary and the mapped image summary (`ridge_scores`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vlkit.models.layers import masked_mean
from vlkit.types import Encoded


def summary(enc: Encoded) -> Tensor:
    """[B, 2H] masked mean and max of each row's states (what the pre-ranking reads)."""
    states = enc.states.to(torch.float64)
    top = states.masked_fill(enc.mask[..., None] == 0, float("-inf")).amax(1).clamp(min=-1e4)
    return torch.cat([masked_mean(states, enc.mask), top], dim=-1)


def fit_ridge(x: Tensor, y: Tensor, ridge: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(w, x_mean, y_mean)`` of the closed-form ridge regression of centred ``y`` on centred ``x`` (one row per
    pair), penalty ``ridge`` x the mean feature variance."""
    x_mean, y_mean = x.mean(0), y.mean(0)
    x, y = x - x_mean, y - y_mean
    gram = x.T @ x
    penalty = ridge * gram.diagonal().mean().clamp(min=1e-12)
    w = torch.linalg.solve(gram + penalty * torch.eye(len(gram), dtype=gram.dtype, device=gram.device), x.T @ y)
    return w, x_mean, y_mean


def ridge_scores(text: Tensor, image: Tensor, w: Tensor, image_mean: Tensor, text_mean: Tensor) -> Tensor:
    """[N_img, N_txt] cosines between the caption summaries ``text`` and the mapped image summaries ``image``."""
    t = F.normalize(text - text_mean, dim=-1)
    i = F.normalize((image - image_mean) @ w, dim=-1)
    return (i @ t.T).float()
