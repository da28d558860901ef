"""What the downstream tasks share: the `Task` base (a training module the `Trainer` drives), the
installation of a family's head from the ``(task, family)`` head registry, and the evaluation loop."""
from __future__ import annotations

import abc
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Hashable, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlkit.models.base import VLModel
from vlkit.models.heads import Head
from vlkit.registry import HEADS
from vlkit.types import LossOutput, VLBatch, VLOutput
from vlkit.validate import DataError, describe_inputs, nonfinite_inputs


class IncompatibleTask(ValueError):
    """A task that cannot work with a model (e.g. RefExp on a patch model), raised at build time."""


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
    """A downstream task: the model plus the family's head for the task.

    ``forward(batch, step=0, micro_step=None) -> LossOutput`` is the training loss (the `Trainer`
    calls it like a pre-training module); ``predict(batch)`` gives per-example predictions;
    ``evaluate(data)`` the task's exact metrics over one of ``TaskData.eval``'s sets;
    ``build_data(cfg, tokenizer, image_source, world=None)`` reads the task's files (official formats)
    or the shapes world into a `TaskData`.

    The head comes from `vlkit.registry.HEADS` (the family's own for this task, else the generic
    one): `install_head` puts its layers on the task under their own names (``task.head`` is its
    output layer, ``task.task_head`` the head itself).
    """

    name: ClassVar[str] = ""
    from_pretraining: ClassVar[bool] = False  # built from a `Pretraining` module to reuse its heads

    def __init__(self, model: VLModel):
        super().__init__()
        self.model = model
        self.__dict__["task_head"] = None

    @classmethod
    def check(cls, model: VLModel | type[VLModel]) -> None:
        """Raise `IncompatibleTask` if models of this kind cannot serve the task (a class is enough)."""

    def head_class(self, kind: str | None = None) -> type[Head]:
        """The registered head ``kind`` (default: the family's default) of this task for the model's family."""
        return HEADS.get(self.name, self.model.family, kind)

    def install_head(self, head: Head) -> Head:
        """Register ``head``'s layers on the task under their own names (the state-dict keys)."""
        own = [n for n, _ in head.named_parameters(recurse=False)] + [n for n, _ in head.named_buffers(recurse=False)]
        if own:
            raise TypeError(f"{type(head).__name__}: a head keeps its weights in child modules, not as {own}")
        for name, module in head.named_children():
            self.add_module(name, module)
        self.__dict__["task_head"] = head  # not a submodule: its layers already are
        return head

    @property
    def head_name(self) -> str:
        return self.task_head.output

    @property
    def head(self) -> nn.Module:
        """The head's output layer (the official classifier / scorer)."""
        return getattr(self, self.head_name)

    def train(self, mode: bool = True) -> "Task":
        super().train(mode)
        if self.task_head is not None:
            self.task_head.training = mode
        return self

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

    @classmethod
    def plan_options(cls, cfg: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor options `build_data` derives from the data, as a FLOP plan (`vlkit.flops.count`)
        assumes them without reading any: none by default."""
        return {}

    def example_batch(self, batch_size: int, text_len: int, num_regions: int, values: bool = True) -> VLBatch:
        """A training batch of this task's form, random inputs of these shapes without padding (a FLOP count's
        input; ``values``: `VLModel.example_batch`)."""
        return self.model.example_batch(batch_size, text_len=text_len, num_regions=num_regions, padded=False,
                                        values=values)


def eval_batches(task: Task, batches: Iterable[VLBatch], desc: str) -> Iterable[VLBatch]:
    """Iterate ``batches`` on the task's device in eval mode under ``no_grad``, with a progress bar;
    the previous train / eval mode is restored afterwards. A batch whose inputs hold NaN or inf is an
    error naming its examples and images (evaluation never scores NaN)."""
    from tqdm.auto import tqdm

    was_training = task.training
    task.eval()
    device = next(task.parameters()).device
    try:
        with torch.no_grad():
            for batch in tqdm(batches, desc=desc, leave=False, disable=None):
                found = nonfinite_inputs(batch)
                if found:
                    raise DataError(f"task {task.name}: NaN or inf in the evaluation inputs: {describe_inputs(found)}")
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


def task_source(cfg: Mapping[str, Any]) -> str:
    """Where a task config reads its records: ``shapes`` (the default: the shapes world) or ``files``."""
    return cfg.get("source", "shapes")


def world_needed(name: str, keys: str) -> ValueError:
    """The error of a ``task.source=shapes`` task without the shapes world: it says how to read the real files."""
    return ValueError(f"task {name}: source=shapes (the default) reads the shapes world, which only data=shapes gives; "
                      f"for the dataset's own files set task.source=files and {keys} (see docs/datasets.md)")


def split_records(cfg: Mapping[str, Any], world: Any, from_world: Callable[[Any, int], Iterable[dict]],
                  from_files: Callable[[Any], list[dict]]) -> dict[str, list[dict]]:
    """Records per split of a task config.

    ``source: shapes``: ``from_world(world, i)`` for the images of each split of the shapes world;
    ``source: files``: ``from_files(spec)`` for each non-null ``files.<split>`` entry (a list of
    entries is concatenated). ``train`` must have records; a named file without records is an
    error, a shapes split without images is dropped. ``train_images: N`` keeps the training records of
    the first N images only.
    """
    name, source = cfg.get("name", "task"), task_source(cfg)
    if source == "shapes":
        if world is None:
            raise world_needed(name, "task.files.train / task.files.val / task.files.test")
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
    if cfg.get("train_images"):
        splits["train"] = first_images(splits["train"], int(cfg["train_images"]))
    return {s: recs for s, recs in splits.items() if recs}


def first_images(records: list[dict], n: int, key: str = "image_id") -> list[dict]:
    """The records of the first ``n`` distinct images (in record order): fine-tuning with little data."""
    if n < 1:
        raise ValueError(f"train_images={n}: keep at least one image")
    keep = set(list(dict.fromkeys(str(r[key]) for r in records))[:n])
    return [r for r in records if str(r[key]) in keep]


class HeadTask(Task):
    """A classification task with the family's head: ``loss`` defaults to the head's official one,
    ``head`` names one of the family's heads for the task (default: its default), and ``task_id`` is
    passed to the model's `task_inputs` (ViLBERT's task tokens)."""

    def __init__(self, model: nn.Module, loss: str | None = None, task_id: int | None = None, head: str | None = None):
        super().__init__(model)
        cls = self.head_class(head)
        self.head_kind = head or HEADS.names(self.name, model.family)[0]
        self.loss_kind = loss or cls.loss
        if self.loss_kind not in LOSSES:
            raise ValueError(f"task {self.name}: unknown loss {self.loss_kind!r}; choose one of {', '.join(LOSSES)}")
        self.task_id = None if task_id is None else int(task_id)

    def encode(self, batch: VLBatch, **kwargs: Any) -> VLOutput:
        """The model's outputs for ``batch`` with the model's task inputs (ViLBERT's task tokens)."""
        return self.model(batch, **self.model.task_inputs(self.name, batch, self.task_id), **kwargs)

    def logits(self, batch: VLBatch) -> Tensor:
        """The head over one pass of the model (its last layers at the pooled positions when the head allows)."""
        return self.task_head(self.encode(batch, pooled_only=self.task_head.pooled_only))

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
