"""Image-text retrieval: each family's fine-tuning recipe, zero-shot scoring with the pre-training ITM
head, and IR / TR recall over N images x M captions in three modes.

Recipes (named by the family's retrieval head, `vlkit.models.heads.RankHead`; negatives are drawn
from the training batch: rows showing another image; each row's caption and image are encoded once
per step and every pair is fused from those encodings):

- ``multiple_choice`` (ViLBERT ``retreival_dataset.py``, ``task_utils.py`` VL-logit): 4-way multiple
  choice (positive, random caption, random image, hard caption: the caption of the most similar other
  image by a cheap similarity: cosine of the mean region features, or of 8x8-pooled pixels),
  cross-entropy over the 4.
- ``hard_negatives`` (UNITER ``model/itm.py`` ``UniterForImageTextRetrievalHardNeg``): for every
  caption ``negative_size`` images and for every image ``negative_size`` captions are sampled and
  scored without gradient in eval mode; the ``hard_size`` hardest of each are trained with the
  triplet hinge ``max(0, margin + sigmoid(s_neg) - sigmoid(s_pos))``.
- ``softmax`` (ViLT / METER ``objectives.compute_irtr``): every image with its caption at index 0 and
  ``num_negatives`` other captions, softmax cross-entropy; METER's head adds the ITM loss with the
  frozen pre-training head when one is given (``frozen_itm_weight``; ``loss_names`` itm + irtr).

Evaluation modes: ``full`` runs the whole model on every pair (paper parity); ``cached`` encodes each
caption once (``encode_text``) and each image once (``encode_image``) and only ``fuse``s pairs;
``rerank`` pre-ranks with a cheap learned score over the cached encodings and fuses only each
image's and each caption's top ``k`` candidates (see `Retrieval.fit_prerank`, the ridge pre-ranker in
`vlkit.tasks.prerank`). The evaluation data is a `vlkit.tasks.retrieval_data.RetrievalSet`; the recall
metrics are `vlkit.tasks.metrics.recall`.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlkit.data import formats
from vlkit.data.datasets import split_list
from vlkit.data.pairs import ImageTextPairs
from vlkit.models.base import VLModel
from vlkit.models.layers import masked_mean
from vlkit.objectives.base import PassContext
from vlkit.objectives.mix import Pretraining
from vlkit.registry import HEADS, MODELS, OBJECTIVES, register_task
from vlkit.tasks.base import Task, TaskData, eval_batches, task_source, world_needed
from vlkit.tasks.metrics import RETRIEVAL_TIES, recall
from vlkit.tasks.prerank import fit_ridge, ridge_scores, summary
from vlkit.tasks.retrieval_data import RetrievalSet, record_caption_ids
from vlkit.types import Encoded, LossOutput, VLBatch, VLOutput

RECIPES = ("multiple_choice", "hard_negatives", "softmax")
MODES = ("full", "cached", "rerank")
RANK = "rank"  # the scorer of a fine-tuned retrieval head; any other scorer names an objective that offers one

__all__ = ["MODES", "RECIPES", "Retrieval", "RetrievalSet", "image_similarity", "recall"]


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------
def image_similarity(batch: VLBatch) -> Tensor:
    """Cheap image-image cosine similarity [B, B] for hard negatives: mean region feature, or the
    8x8 average-pooled pixels."""
    if batch.has_regions:
        v = masked_mean(batch.region_feats, batch.region_mask)
    elif batch.has_pixels:
        v = F.adaptive_avg_pool2d(batch.pixel_values, 8).flatten(1)
    else:
        raise ValueError("image_similarity: the batch has neither regions nor pixels")
    v = F.normalize(v.float(), dim=-1)
    return v @ v.T


def _other_image(batch: VLBatch) -> Tensor:
    """[B, B] True where row j shows another image than row i (ids, else every other row)."""
    b = batch.batch_size
    if batch.image_ids is None:
        allowed = ~torch.eye(b, dtype=torch.bool)
    else:
        index = {k: n for n, k in enumerate(dict.fromkeys(batch.image_ids))}
        image = torch.tensor([index[k] for k in batch.image_ids])
        allowed = image.view(-1, 1) != image.view(1, -1)
    if not allowed.any(1).all():
        raise ValueError("retrieval: a training batch needs at least two different images for negatives; got "
                         f"{b} rows of one image ({(batch.image_ids or ['?'])[0]!r})")
    return allowed


def _sample(allowed: Tensor, n: int, generator: torch.Generator) -> Tensor:
    """[B, n] rows drawn uniformly among ``allowed`` (without replacement while every row has n)."""
    replace = bool((allowed.sum(1) < n).any())
    return torch.multinomial(allowed.float(), n, replacement=replace, generator=generator)


def _pad_cat(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenate along dim 0, zero-padding every other dimension to the largest."""
    shape = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].dim())]
    out = tensors[0].new_zeros((sum(len(t) for t in tensors), *shape))
    start = 0
    for t in tensors:
        out[(slice(start, start + len(t)), *(slice(0, n) for n in t.shape[1:]))] = t
        start += len(t)
    return out


def _cat_encoded(parts: Sequence[Encoded]) -> Encoded:
    extra = {k: _pad_cat([p.extra[k] for p in parts]) for k in parts[0].extra}
    return Encoded(_pad_cat([p.states for p in parts]), _pad_cat([p.mask for p in parts]), extra)


def _trim(enc: Encoded) -> Encoded:
    """Drop trailing positions that no row attends to (padding left by batching elsewhere)."""
    full = enc.states.shape[1]
    used = enc.mask.bool().any(0).nonzero()
    length = int(used.max()) + 1 if len(used) else 1
    if length == full:
        return enc
    extra = {k: v[:, :length] if v.dim() > 1 and v.shape[1] == full else v for k, v in enc.extra.items()}
    return Encoded(enc.states[:, :length], enc.mask[:, :length], extra)


@contextlib.contextmanager
def _inference(module: nn.Module) -> Iterator[None]:
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was_training)


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def _progress(total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False, disable=None)


# --------------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------------
@register_task("retrieval")
class Retrieval(Task):
    """Image-text retrieval with the family's retrieval head and recipe: ``recipe`` (default: the one the
    family's head names) is a recipe name (``multiple_choice`` | ``hard_negatives`` | ``softmax``) or a
    registered family, whose recipe (and frozen-ITM weight) is then used. The head's ``output`` layer
    is initialised from the ITM head's "matched" row when ``itm`` is given and the head says so (UNITER
    ``init_output``, METER ``itm_score.fc.weight[1:]``; ``init_from_itm`` overrides).

    ``model`` may be a `vlkit.objectives.Pretraining`: its model and the objective of its mix that offers a
    matching score (`Objective.offers_scorer`: ITM), if any, are used. ``scorer="rank"`` scores pairs with
    the fine-tuned head; the name of that objective (``"itm"``: the ITM head's P(matched)) scores them with
    it (zero-shot). ``prerank_data`` (a training `RetrievalSet`) is what `fit_prerank` learns from when
    a ``rerank`` evaluation needs it. ``task_id``: the model's task input (ViLBERT's task token; default
    its Flickr30k id, 7 for COCO). ``ties``: how `evaluate` ranks equal scores; ``uniter_ir_rows``: count IR
    hits as UNITER's ``itm_eval`` does (`vlkit.tasks.metrics.recall_at_k`).
    """

    name = "retrieval"
    from_pretraining = True

    def __init__(self, model: Any, recipe: str | None = None, scorer: str = RANK, itm: Any = None,
                 init_from_itm: bool | None = None, margin: float = 0.2, negative_size: int = 399,
                 hard_size: int = 31, num_negatives: int = 15, itm_weight: float | None = None,
                 eval_mode: str = "cached", rerank_k: int = 64, prerank_ridge: float = 1.0,
                 prerank_data: RetrievalSet | None = None, seed: int = 0, head: str | None = None,
                 task_id: int | None = None, ties: str = "worst", uniter_ir_rows: bool = False):
        if isinstance(model, Pretraining):
            # a mix without ITM (e.g. MLM alone): the rank head starts fresh, as the official code does
            # when the checkpoint holds no ITM weights to copy
            if itm is None:
                itm = model.scorer()
            model = model.model
        if not isinstance(model, VLModel):
            raise TypeError(f"retrieval: expected a VLModel or a Pretraining module, got {type(model).__name__}")
        super().__init__(model)
        head_cls = self.head_class(head)
        source = head_cls if recipe is None else HEADS.get("retrieval", recipe) if recipe in MODELS else None
        recipe = source.recipe if source is not None else recipe
        scorers = (RANK, *[n for n in OBJECTIVES.names() if OBJECTIVES.get(n).offers_scorer])
        if recipe not in RECIPES or scorer not in scorers or eval_mode not in MODES:
            raise ValueError(f"retrieval: recipe must be one of {RECIPES} (or a family), scorer one of {scorers}, "
                             f"eval_mode one of {MODES}; got {recipe!r}, {scorer!r}, {eval_mode!r}")
        if scorer != RANK and (itm is None or itm.name != scorer):
            raise ValueError(f"retrieval: scorer={scorer!r} (zero-shot) needs the pre-training {scorer} head: build "
                             f"the task from a Pretraining module or pass itm=build_objective({scorer!r}, model)")
        frozen_itm = source.frozen_itm_weight if source is not None and itm is not None else 0.0
        self.itm_weight = frozen_itm if itm_weight is None else itm_weight
        if self.itm_weight > 0 and itm is None:
            raise ValueError("retrieval: itm_weight > 0 needs an ITM objective (itm=...)")
        self.recipe, self.scorer, self.itm = recipe, scorer, itm
        self.margin, self.negative_size, self.hard_size = margin, negative_size, hard_size
        self.num_negatives, self.seed = num_negatives, seed
        self.eval_mode, self.rerank_k, self.prerank_ridge = eval_mode, rerank_k, prerank_ridge
        self.prerank_data = prerank_data
        self.task_id = None if task_id is None else int(task_id)
        if ties not in RETRIEVAL_TIES:
            raise ValueError(f"retrieval: ties must be one of {', '.join(RETRIEVAL_TIES)}, got {ties!r}")
        self.ties, self.uniter_ir_rows = ties, bool(uniter_ir_rows)
        self.install_head(head_cls(model))
        if itm is not None and (head_cls.init_from_itm if init_from_itm is None else init_from_itm):
            self.init_from_itm()
        if frozen_itm > 0:  # METER freezes itm_score while fine-tuning IRTR
            itm.requires_grad_(False)
        for name in ("prerank_w", "prerank_image_mean", "prerank_text_mean"):
            self.register_buffer(name, None, persistent=False)

    @classmethod
    def zero_shot(cls, pre: Any, **options: Any) -> "Retrieval":
        """Zero-shot retrieval of a `Pretraining`: pairs scored by the objective of its mix that offers a
        matching score (`Objective.offers_scorer`: ITM)."""
        scorer = pre.scorer()
        if scorer is None:
            raise ValueError("retrieval: zero-shot needs an objective that offers a matching score (ITM) in the "
                             f"pre-training mix; it has {', '.join(pre.objectives)}")
        return cls(pre, scorer=scorer.name, **options)

    def init_from_itm(self) -> None:
        """Copy the ITM head's "matched" row into the rank head (UNITER ``init_output``)."""
        fc, k = self.itm.itm_head.fc, self.itm.match_index
        with torch.no_grad():
            self.head.weight.copy_(fc.weight[k:k + 1])
            self.head.bias.copy_(fc.bias[k:k + 1])

    # -- scoring ---------------------------------------------------------------------------------
    def score(self, out: VLOutput) -> Tensor:
        """Matching score [B] of each fused pair (higher = better match)."""
        if self.scorer != RANK:
            return self.itm.match_score(out)
        return self.task_head(out)

    def _fuse_pairs(self, text: Encoded, image: Encoded, txt_idx: Tensor, img_idx: Tensor) -> VLOutput:
        """The model's pooled outputs for the pairs (``txt_idx[p]``, ``img_idx[p]``) of cached encodings."""
        return self.model.fuse(_trim(text.index(txt_idx)), _trim(image.index(img_idx)), pooled_only=True)

    def _rank_scores(self, text: Encoded, image: Encoded, txt_idx: Tensor, img_idx: Tensor) -> Tensor:
        """Rank-head scores [B, n] of the pairs (``txt_idx[b, j]``, ``img_idx[b, j]``) of cached encodings."""
        out = self._fuse_pairs(text, image, txt_idx.reshape(-1), img_idx.reshape(-1))
        return self.task_head(out).view(txt_idx.shape)

    # -- training --------------------------------------------------------------------------------
    def forward(self, batch: VLBatch, step: int = 0, micro_step: int | None = None) -> LossOutput:
        micro_step = step if micro_step is None else micro_step
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + micro_step)
        self.prerank_w = None  # the weights change: a later rerank evaluation refits the pre-ranking
        loss, metrics = getattr(self, f"_{self.recipe}_loss")(batch, generator)
        if self.itm_weight > 0:
            itm_loss, itm_acc = self._itm_loss(batch, generator)
            loss = loss + self.itm_weight * itm_loss
            metrics.update({"itm/loss": itm_loss.detach(), "itm/acc": itm_acc})
        return LossOutput(loss, metrics)

    def _encode(self, batch: VLBatch) -> tuple[Encoded, Encoded]:
        inputs = self.inputs(batch)
        return self.model.encode_text(batch, **inputs), self.model.encode_image(batch, **inputs)

    def inputs(self, batch: VLBatch) -> dict[str, Any]:
        """The model's task inputs for ``batch`` (ViLBERT's task tokens: ``task_id``, default its Flickr30k id)."""
        return self.model.task_inputs(self.name, batch, self.task_id)

    def _multiple_choice_loss(self, batch: VLBatch, generator: torch.Generator) -> tuple[Tensor, dict[str, Any]]:
        allowed = _other_image(batch)
        rows = torch.arange(batch.batch_size)
        random_caption, random_image = _sample(allowed, 2, generator).unbind(1)
        hard = image_similarity(batch).cpu().masked_fill(~allowed, float("-inf")).argmax(1)
        txt_idx = torch.stack([rows, random_caption, rows, hard], 1)  # positive, random caption, random image, hard
        img_idx = torch.stack([rows, rows, random_image, rows], 1)
        dev = batch.device
        scores = self._rank_scores(*self._encode(batch), txt_idx.to(dev), img_idx.to(dev))
        return self._choice_loss(scores)

    def _softmax_loss(self, batch: VLBatch, generator: torch.Generator) -> tuple[Tensor, dict[str, Any]]:
        allowed = _other_image(batch)
        rows = torch.arange(batch.batch_size)[:, None]
        negatives = _sample(allowed, self.num_negatives, generator)
        txt_idx = torch.cat([rows, negatives], 1)
        dev = batch.device
        scores = self._rank_scores(*self._encode(batch), txt_idx.to(dev), rows.expand_as(txt_idx).to(dev))
        return self._choice_loss(scores)

    @staticmethod
    def _choice_loss(scores: Tensor) -> tuple[Tensor, dict[str, Any]]:
        target = scores.new_zeros(len(scores), dtype=torch.long)  # the positive is option 0
        return F.cross_entropy(scores, target), {"acc": (scores.argmax(1) == 0).float().mean().detach(),
                                                 "options": float(scores.shape[1])}

    def _hard_negatives_loss(self, batch: VLBatch, generator: torch.Generator) -> tuple[Tensor, dict[str, Any]]:
        allowed = _other_image(batch)
        dev = batch.device
        n = min(self.negative_size, int(allowed.sum(1).min()))
        h = min(self.hard_size, n)
        rows = torch.arange(batch.batch_size, device=dev)[:, None]
        images = torch.multinomial(allowed.float(), n, generator=generator).to(dev)  # for each caption
        captions = torch.multinomial(allowed.float(), n, generator=generator).to(dev)  # for each image
        with _inference(self):  # the official model scores the sampled negatives in eval mode
            text, image = self._encode(batch)
            image_scores = self._rank_scores(text, image, rows.expand_as(images), images)
            caption_scores = self._rank_scores(text, image, captions, rows.expand_as(captions))
            hard_images = images.gather(1, image_scores.topk(h).indices)
            hard_captions = captions.gather(1, caption_scores.topk(h).indices)
        text, image = self._encode(batch)
        pos = torch.sigmoid(self._rank_scores(text, image, rows, rows))
        neg_images = torch.sigmoid(self._rank_scores(text, image, rows.expand_as(hard_images), hard_images))
        neg_captions = torch.sigmoid(self._rank_scores(text, image, hard_captions, rows.expand_as(hard_captions)))
        loss_t = torch.clamp(self.margin + neg_images - pos, min=0).mean()  # hard images for each caption
        loss_i = torch.clamp(self.margin + neg_captions - pos, min=0).mean()  # hard captions for each image
        return loss_t + loss_i, {"loss_t": loss_t.detach(), "loss_i": loss_i.detach(), "hard": float(h),
                                 "acc": ((pos > neg_images.amax(1, keepdim=True)) &
                                         (pos > neg_captions.amax(1, keepdim=True))).float().mean().detach()}

    def _itm_loss(self, batch: VLBatch, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        mixed, matched = self.itm.make_pairs(batch, generator)
        result = self.itm(self.model(mixed, **self.inputs(mixed)), mixed, PassContext(original=mixed, itm_match=matched))
        return result.loss, result.metrics["acc"]

    def predict(self, batch: VLBatch) -> dict[str, Any]:
        """``score`` [B]: the matching score of each row's caption with its image."""
        with _inference(self):
            batch = batch.to(self.model.device)
            return {"score": self.score(self.model(batch, **self.inputs(batch)))}

    # -- evaluation ------------------------------------------------------------------------------
    def encode_texts(self, data: RetrievalSet, batch_size: int = 64) -> Encoded:
        """Every caption's `encode_text`, padded to one length."""
        batches = (data.text_batch(range(s.start, s.stop)) for s in _chunks(data.num_texts, batch_size))
        return _cat_encoded([self.model.encode_text(b, **self.inputs(b))
                             for b in eval_batches(self, batches, "encode captions")])

    def encode_images(self, data: RetrievalSet, batch_size: int = 64) -> Encoded:
        """Every image's `encode_image`, padded to one length."""
        batches = (data.image_batch(range(s.start, s.stop)) for s in _chunks(data.num_images, batch_size))
        return _cat_encoded([self.model.encode_image(b, **self.inputs(b))
                             for b in eval_batches(self, batches, "encode images")])

    def score_pairs(self, data: RetrievalSet, img_idx: Tensor, txt_idx: Tensor, mode: str = "cached",
                    batch_size: int = 64, text: Encoded | None = None, image: Encoded | None = None) -> Tensor:
        """Scores [P] of the pairs (``img_idx[p]``, ``txt_idx[p]``): ``full`` runs the model on each pair
        (images loaded once, then kept), ``cached`` fuses cached encodings (given, or computed here).
        Both modes batch the pairs by caption length (little padding) and return them in the given order."""
        img_idx, txt_idx = torch.as_tensor(img_idx, dtype=torch.long), torch.as_tensor(txt_idx, dtype=torch.long)
        if img_idx.shape != txt_idx.shape or img_idx.dim() != 1:
            raise ValueError(f"score_pairs: img_idx {tuple(img_idx.shape)} and txt_idx {tuple(txt_idx.shape)} must be "
                             "two index vectors of one length")
        if mode not in ("full", "cached"):
            raise ValueError(f"score_pairs: mode must be 'full' or 'cached', not {mode!r}")
        order = torch.sort(data.text_lengths[txt_idx], stable=True).indices
        img_idx, txt_idx = img_idx[order], txt_idx[order]
        scores = torch.empty(len(img_idx))
        if mode == "full":
            batches = (data.pair_batch(img_idx[s].tolist(), txt_idx[s].tolist())
                       for s in _chunks(len(img_idx), batch_size))
            sorted_scores = [self.score(self.model(b, **self.inputs(b))).float().cpu()
                             for b in eval_batches(self, batches, "score pairs (full)")]
            scores[order] = torch.cat(sorted_scores) if sorted_scores else scores
            return scores
        text = self.encode_texts(data, batch_size) if text is None else text
        image = self.encode_images(data, batch_size) if image is None else image
        device = text.states.device
        with _inference(self):
            bar = _progress(len(img_idx), "score pairs (cached)")
            for s in _chunks(len(img_idx), batch_size):
                t, i = txt_idx[s].to(device), img_idx[s].to(device)
                scores[order[s]] = self.score(self._fuse_pairs(text, image, t, i)).float().cpu()
                bar.update(s.stop - s.start)
            bar.close()
        return scores

    def score_matrices(self, data: RetrievalSet, mode: str | None = None, k: int | None = None,
                       batch_size: int = 64) -> tuple[Tensor, Tensor]:
        """Score matrices [N_img, N_txt] for text retrieval (rows) and image retrieval (columns).

        ``full`` / ``cached`` score every pair (one matrix, returned twice). ``rerank`` scores only each
        caption's top-``k`` images and each image's top ``k x captions-per-image`` captions (the same share
        of the candidates both ways) under the pre-ranking; the other entries are ``-inf`` (never
        retrieved). ``k`` defaults to ``rerank_k``.
        """
        mode = mode or self.eval_mode
        if mode not in MODES:
            raise ValueError(f"retrieval: mode must be one of {MODES}, not {mode!r}")
        n_img, n_txt = data.num_images, data.num_texts
        if mode in ("full", "cached"):
            img_idx, txt_idx = torch.meshgrid(torch.arange(n_img), torch.arange(n_txt), indexing="ij")
            scores = self.score_pairs(data, img_idx.reshape(-1), txt_idx.reshape(-1), mode, batch_size)
            matrix = scores.view(n_img, n_txt)
            return matrix, matrix
        k = self.rerank_k if k is None else k
        if k < 1:
            raise ValueError(f"retrieval: rerank k must be >= 1, got {k}")
        text, image = self.encode_texts(data, batch_size), self.encode_images(data, batch_size)
        pre = self.prerank_scores(text, image).cpu()
        per_image = max(1, round(n_txt / n_img))
        tr_cand = pre.topk(min(k * per_image, n_txt), dim=1).indices  # [N_img, k x per_image] captions per image
        ir_cand = pre.topk(min(k, n_img), dim=0).indices  # [k, N_txt] images of each caption
        tr_flat = (torch.arange(n_img)[:, None] * n_txt + tr_cand).reshape(-1)
        ir_flat = (ir_cand * n_txt + torch.arange(n_txt)[None, :]).reshape(-1)
        pairs = torch.unique(torch.cat([tr_flat, ir_flat]))  # sorted: image-major
        scores = self.score_pairs(data, pairs // n_txt, pairs % n_txt, "cached", batch_size, text, image)
        full = torch.full((n_img * n_txt,), float("-inf"))
        full[pairs] = scores
        i2t, t2i = torch.full_like(full, float("-inf")), torch.full_like(full, float("-inf"))
        i2t[tr_flat], t2i[ir_flat] = full[tr_flat], full[ir_flat]
        return i2t.view(n_img, n_txt), t2i.view(n_img, n_txt)

    def ranking_scores(self, data: RetrievalSet, mode: str | None = None, k: int | None = None,
                       batch_size: int = 64) -> tuple[Tensor, Tensor]:
        """`score_matrices` in ``mode`` (default ``eval_mode``), fitting the pre-ranking first when a
        ``rerank`` needs it (from ``prerank_data``)."""
        if (mode or self.eval_mode) == "rerank" and self.prerank_w is None:
            if self.prerank_data is None:
                raise ValueError("retrieval: rerank needs a fitted pre-ranking: call fit_prerank(train_set) or build "
                                 "the task with prerank_data= (TaskData.options from build_data)")
            self.fit_prerank(self.prerank_data, batch_size)
        return self.score_matrices(data, mode, k, batch_size)

    def evaluate(self, data: RetrievalSet, batch_size: int = 64, mode: str | None = None,
                 k: int | None = None) -> dict[str, float]:
        """IR / TR recall at 1, 5, 10 and their mean (fractions), in ``mode`` (default ``eval_mode``), and the
        chance level of each R@1 (``ir_r1_chance``: 1 / images; ``tr_r1_chance``: the mean share of an image's
        captions among all captions)."""
        if not isinstance(data, RetrievalSet):
            raise TypeError(f"retrieval: evaluate takes a RetrievalSet (TaskData.eval[split]), got "
                            f"{type(data).__name__}")
        out = recall(*self.ranking_scores(data, mode, k, batch_size), data.txt2img, self.ties, self.uniter_ir_rows)
        captions_per_image = torch.bincount(data.txt2img, minlength=data.num_images).float()
        out.update(ir_r1_chance=1.0 / data.num_images, tr_r1_chance=float((captions_per_image / data.num_texts).mean()))
        return out

    # -- the cheap pre-ranking -------------------------------------------------------------------
    def fit_prerank(self, data: RetrievalSet, batch_size: int = 64) -> None:
        """Fit the pre-ranking on a training `RetrievalSet` (its ground-truth pairs; nothing else trains).

        Each caption and image is summarised by the masked mean and max of its cached unimodal encoding; a
        ridge regression (closed form, penalty ``prerank_ridge`` x the mean feature variance) maps the
        centred image summary onto the centred summary of its captions, and a pair's pre-score is the
        cosine between the caption's summary and the mapped image summary.
        """
        text, image = summary(self.encode_texts(data, batch_size)), summary(self.encode_images(data, batch_size))
        self.prerank_w, self.prerank_image_mean, self.prerank_text_mean = fit_ridge(
            image[data.txt2img.to(image.device)], text, self.prerank_ridge)

    def prerank_scores(self, text: Encoded, image: Encoded) -> Tensor:
        """Pre-ranking scores [N_img, N_txt] from cached encodings (`fit_prerank` first)."""
        if self.prerank_w is None:
            raise ValueError("retrieval: the pre-ranking is not fitted for the current weights; call fit_prerank")
        return ridge_scores(summary(text), summary(image), self.prerank_w, self.prerank_image_mean,
                            self.prerank_text_mean)

    # -- data ------------------------------------------------------------------------------------
    def example_batch(self, batch_size: int, text_len: int, num_regions: int, values: bool = True) -> VLBatch:
        """Positive pairs of ``batch_size`` different images (the negatives are drawn from the batch)."""
        batch = super().example_batch(batch_size, text_len, num_regions, values)
        return batch.replace(image_ids=[str(k) for k in range(batch_size)])

    @classmethod
    def build_data(cls, cfg: Mapping[str, Any], tokenizer: Any, image_source: Any, world: Any = None) -> TaskData:
        """Training captions (`ImageTextPairs`), `RetrievalSet` per evaluation split, and the training
        images as ``options["prerank_data"]``. ``cfg.source``: ``shapes`` (``world``) or ``files``
        (``cfg.path``: a Karpathy json such as ``dataset_flickr30k.json``)."""
        max_len = int(cfg.get("max_len", 40))
        train_splits = split_list(cfg.get("train_split", "train"))
        eval_splits = split_list(cfg.get("eval_splits", ["val", "test"]))
        source = task_source(cfg)
        if source == "shapes":
            if world is None:
                raise world_needed("retrieval", "task.path (a Karpathy json such as dataset_flickr30k.json)")

            def images(splits: list[str]) -> list[dict[str, Any]]:
                return [{"image_id": world.image_id(i), "captions": world.captions(i)}
                        for s in splits for i in world.indices(s)]  # caption ids "<image>#<k>"
        elif source == "files":
            if not cfg.get("path"):
                raise ValueError("retrieval: source=files needs path= (a Karpathy json, e.g. dataset_flickr30k.json)")

            def images(splits: list[str]) -> list[dict[str, Any]]:
                recs = formats.read_karpathy_retrieval(cfg["path"], splits, cfg.get("image_id", "stem"))
                if not recs:
                    raise ValueError(f"retrieval: {cfg['path']} has no images in split(s) {', '.join(splits)}")
                return recs
        else:
            raise ValueError(f"retrieval: unknown source {source!r}; use shapes or files")
        train_images = images(train_splits)
        records = [{"id": cid, "image_id": rec["image_id"], "caption": cap} for rec in train_images
                   for cid, cap in zip(record_caption_ids(rec), rec["captions"])]
        train = ImageTextPairs(records, tokenizer, image_source, max_len=max_len,
                               filter_long=bool(cfg.get("filter_long", False)))
        evaluated = {s: images([s]) for s in eval_splits}
        sets = {s: RetrievalSet.from_records(recs, tokenizer, image_source, max_len=max_len)
                for s, recs in evaluated.items() if recs or source != "shapes"}  # a shapes split may be empty
        prerank = RetrievalSet.from_records(train_images, tokenizer, image_source, max_len=max_len, cache_images=False)
        return TaskData(train=train, eval=sets, options={"prerank_data": prerank}, collate=train.collator())
