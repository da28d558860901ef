"""What the downstream tasks share: the `Task` base (a training module the `Trainer` drives), the
families' official classifier layouts, and the evaluation loop."""
from __future__ import annotations

import abc
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Hashable, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlkit.models.base import VLModel
from vlkit.types import LossOutput, VLBatch, VLOutput


@dataclass
class TaskData:
    """A task's data: ``train`` examples (a Dataset for ``collate``), ``eval`` sets by split (what
    ``Task.evaluate`` takes), and ``options`` derived from the data for the task's constructor
    (answer vocabulary, number of labels ...)."""

    train: Any
    eval: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    collate: Callable[[list], VLBatch] | None = None


class Task(nn.Module, metaclass=abc.ABCMeta):
    """A downstream task: the model plus the family's official head.

    ``forward(batch, step=0, micro_step=None) -> LossOutput`` is the training loss (the `Trainer`
    calls it like a pre-training module); ``predict(batch)`` gives per-example predictions;
    ``evaluate(data)`` the task's exact metrics over one of ``TaskData.eval``'s sets;
    ``build_data(cfg, tokenizer, image_source, world=None)`` reads the task's files (official formats)
    or the shapes world into a `TaskData`.
    """

    name: ClassVar[str] = ""
    from_pretraining: ClassVar[bool] = False  # built from a `Pretraining` module to reuse its heads

    def __init__(self, model: VLModel):
        super().__init__()
        self.model = model

    @abc.abstractmethod
    def forward(self, batch: VLBatch, step: int = 0, micro_step: int | None = None) -> LossOutput:
        """The training loss of one batch."""

    @abc.abstractmethod
    def predict(self, batch: VLBatch) -> dict[str, Any]:
        """Per-example predictions of one batch (no gradient)."""

    @abc.abstractmethod
    def evaluate(self, data: Any, batch_size: int = 64) -> dict[str, float]:
        """The task's exact metrics over a whole evaluation set."""

    @classmethod
    @abc.abstractmethod
    def build_data(cls, cfg: Mapping[str, Any], tokenizer: Any, image_source: Any, world: Any = None) -> TaskData:
        """The task's `TaskData` from ``cfg`` (``conf/task/<name>.yaml``)."""


def classifier(model: VLModel, num_outputs: int, in_size: int | None = None, hidden: int | None = None) -> nn.Sequential:
    """The family's official answer classifier on the joint vector.

    ViLBERT ``SimpleClassifier`` / UNITER ``vqa_output``: Linear, GELU, LayerNorm(1e-12), Linear
    (hidden 2x the input); METER ``vqa_classifier``: Linear, LayerNorm(1e-5), GELU, Linear (hidden =
    input). Indices match the official state-dict keys (``.0``, ``.2``, ``.3`` / ``.0``, ``.1``, ``.3``).
    """
    in_size = in_size or model.joint_size
    if model.family == "meter":
        hidden = hidden or in_size
        layers = [nn.Linear(in_size, hidden), nn.LayerNorm(hidden, eps=1e-5), nn.GELU(), nn.Linear(hidden, num_outputs)]
    else:
        hidden = hidden or 2 * in_size
        layers = [nn.Linear(in_size, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=1e-12), nn.Linear(hidden, num_outputs)]
    head = nn.Sequential(*layers)
    std = getattr(model.config, "initializer_range", 0.02)
    for module in head:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            nn.init.zeros_(module.bias)
    return head


def joint_dropout(model: VLModel) -> float:
    """ViLBERT's heads read ``dropout(pooled_t * pooled_v)`` (0.1); UNITER and METER apply none."""
    return 0.1 if model.family == "vilbert" else 0.0


def eval_batches(task: Task, batches: Iterable[VLBatch], desc: str) -> Iterable[VLBatch]:
    """Iterate ``batches`` on the task's device in eval mode under ``no_grad``, with a progress bar;
    the previous train / eval mode is restored afterwards."""
    from tqdm.auto import tqdm

    was_training = task.training
    task.eval()
    device = next(task.parameters()).device
    try:
        with torch.no_grad():
            for batch in tqdm(batches, desc=desc, leave=False, disable=None):
                yield batch.to(device)
    finally:
        task.train(was_training)


def gather(values: list[Tensor]) -> Tensor:
    return torch.cat(values) if values else torch.empty(0)


# -- shared by the classification tasks (vqa, snli_ve, nlvr2) ---------------------------------------
SPLITS = ("train", "val", "test")
LOSSES = ("ce", "bce", "bce_instance")


def classification_loss(logits: Tensor, targets: Tensor, kind: str) -> Tensor:
    """The families' classification losses. ``targets`` are class ids [B] or scores [B, C].

    ``ce``: cross-entropy (soft targets allowed); ``bce``: BCE-with-logits on the scores (one-hot of
    class ids), averaged over B x C (ViLBERT's ``BCEWithLogitsLoss``); ``bce_instance``: the same times
    C (UNITER's "instance-level bce"; the VQA loss of all three families).
    """
    if kind not in LOSSES:
        raise ValueError(f"unknown loss {kind!r}; choose one of {', '.join(LOSSES)}")
    if kind == "ce":
        return F.cross_entropy(logits, targets)
    if targets.dim() == 1:
        targets = F.one_hot(targets, logits.shape[-1])
    loss = F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype))
    return loss * logits.shape[-1] if kind == "bce_instance" else loss


def most_common(values: Iterable[Hashable]) -> Any:
    """The most frequent value (ties: the smallest by ``str``); None for no values."""
    counts = Counter(values)
    return min(counts, key=lambda v: (-counts[v], str(v))) if counts else None


def label_target(row: Mapping[str, Any]) -> dict[str, Any]:
    """``targets(record)`` of a single-label task: ``{"label": record["label"]}``."""
    return {"label": row["label"]}


def _as_list(spec: Any) -> list:
    return list(spec) if isinstance(spec, Sequence) and not isinstance(spec, str) else [spec]


def split_records(cfg: Mapping[str, Any], world: Any, from_world: Callable[[Any, int], Iterable[dict]],
                  from_files: Callable[[Any], list[dict]]) -> dict[str, list[dict]]:
    """Records per split of a task config.

    ``source: shapes``: ``from_world(world, i)`` for the images of each split of the shapes world;
    ``source: files``: ``from_files(spec)`` for each non-null ``files.<split>`` entry (a list of
    entries is concatenated). ``train`` must have records; a named file without records is an
    error, a shapes split without images is dropped.
    """
    name, source = cfg.get("name", "task"), cfg.get("source", "shapes")
    if source == "shapes":
        if world is None:
            raise ValueError(f"task {name}: source=shapes needs the shapes world (data=shapes)")
        splits = {s: [r for i in world.indices(s) for r in from_world(world, i)] for s in SPLITS}
    elif source == "files":
        files = cfg.get("files") or {}
        splits = {s: [r for entry in _as_list(spec) for r in from_files(entry)] for s, spec in files.items() if spec}
        empty = [s for s, recs in splits.items() if not recs]
        if empty:
            raise ValueError(f"task {name}: files.{empty[0]} ({files[empty[0]]}) holds no records")
    else:
        raise ValueError(f"task {name}: unknown source {source!r}; use shapes or files")
    if not splits.get("train"):
        where = "the shapes world has no train images" if source == "shapes" else "set files.train"
        raise ValueError(f"task {name}: no training records ({where})")
    return {s: recs for s, recs in splits.items() if recs}


class HeadTask(Task):
    """A task with one family-specific head over the model's outputs.

    The head is registered under its official name (``head_names[family]``, so state-dict keys match
    the official ones) and read through ``head``. ``loss`` defaults to the family's official choice
    (``official_losses``). A ViLBERT built with ``task_specific_tokens`` gets ``task_ids`` filled with
    ``task_id`` (default: the official ``vilbert_tasks.yml`` number).
    """

    head_names: ClassVar[Mapping[str, str]] = {}
    official_losses: ClassVar[Mapping[str, str]] = {}
    vilbert_task_id: ClassVar[int] = 0

    def __init__(self, model: nn.Module, loss: str | None = None, task_id: int | None = None):
        super().__init__(model)
        if model.family not in self.head_names:
            raise ValueError(f"task {self.name}: no head for the {model.family!r} family "
                             f"(has {', '.join(self.head_names)})")
        self.loss_kind = loss or self.official_losses[model.family]
        if self.loss_kind not in LOSSES:
            raise ValueError(f"task {self.name}: unknown loss {self.loss_kind!r}; choose one of {', '.join(LOSSES)}")
        self.task_id = self.vilbert_task_id if task_id is None else int(task_id)
        self.joint_dropout = nn.Dropout(joint_dropout(model))
        self.head_name = self.head_names[model.family]

    def set_head(self, head: nn.Module) -> None:
        self.add_module(self.head_name, head)

    @property
    def head(self) -> nn.Module:
        return getattr(self, self.head_name)

    def encode(self, batch: VLBatch, **kwargs: Any) -> VLOutput:
        """The model's outputs for ``batch`` (with ViLBERT's task tokens when it has them)."""
        if getattr(self.model.config, "task_specific_tokens", False):
            kwargs["task_ids"] = torch.full((batch.batch_size,), self.task_id, dtype=torch.long, device=batch.device)
        return self.model(batch, **kwargs)

    def joint(self, out: VLOutput) -> Tensor:
        """The joint vector the heads read (ViLBERT applies dropout 0.1)."""
        return self.joint_dropout(out.joint)

    def logits(self, batch: VLBatch) -> Tensor:
        """The head over the joint vector (the model's last layers run only where its poolers read)."""
        return self.head(self.joint(self.encode(batch, pooled_only=True)))

    def batches(self, data: Any, batch_size: int, desc: str) -> Iterable[VLBatch]:
        """``data`` in order, ``batch_size`` examples a batch, in eval mode without gradients."""
        loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False, collate_fn=data.collator())
        return eval_batches(self, loader, desc)

    def target(self, batch: VLBatch, key: str = "label") -> Any:
        """``batch.targets[key]``, with an error naming the task when it is missing."""
        if key not in batch.targets:
            raise KeyError(f"task {self.name}: the batch has no {key!r} target (have {sorted(batch.targets)})")
        return batch.targets[key]


def mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values))
