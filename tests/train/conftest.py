"""Trainer fixtures: a tiny region dataset, a tiny UNITER training module, and a fresh Accelerate
state per test. Plain functions here are also imported by the two-process worker script."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vlkit.types import LossOutput, VLBatch

VOCAB, FEAT, CLASSES, LABELS = 1000, 256, 8, 3


class TinyPairs(torch.utils.data.Dataset):
    """``n`` deterministic examples: 3-12 tokens, 2-8 regions and a label in [0, 3)."""

    def __init__(self, n: int = 48, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(n):
            t = int(torch.randint(3, 13, (), generator=g))
            k = int(torch.randint(2, 9, (), generator=g))
            xy = torch.rand(k, 2, generator=g) * 0.5
            self.items.append({
                "id": f"ex{i}", "input_ids": torch.randint(1, VOCAB, (t,), generator=g),
                "region_feats": torch.rand(k, FEAT, generator=g),
                "region_boxes": torch.cat([xy, xy + 0.3], -1),
                "label": int(torch.randint(0, LABELS, (), generator=g)),
            })

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]

    def lengths(self) -> list[tuple[int, int]]:
        return [(len(e["input_ids"]), len(e["region_feats"])) for e in self.items]

    def collator(self):
        return collate


def _pad(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(t) for t in tensors)
    out = torch.zeros(len(tensors), n, *tensors[0].shape[1:], dtype=tensors[0].dtype)
    mask = torch.zeros(len(tensors), n, dtype=torch.long)
    for i, t in enumerate(tensors):
        out[i, :len(t)] = t
        mask[i, :len(t)] = 1
    return out, mask


def collate(examples: list[dict]) -> VLBatch:
    ids, mask = _pad([e["input_ids"] for e in examples])
    feats, region_mask = _pad([e["region_feats"] for e in examples])
    boxes, _ = _pad([e["region_boxes"] for e in examples])
    return VLBatch(input_ids=ids, attention_mask=mask, region_feats=feats, region_boxes=boxes,
                   region_mask=region_mask, targets={"label": torch.tensor([e["label"] for e in examples])},
                   ids=[e["id"] for e in examples])


class TinyTask(nn.Module):
    """A classification head on the model's joint vector; the cross-entropy is a per-example mean."""

    def __init__(self, model: nn.Module, dropout: float = 0.1):
        super().__init__()
        self.model = model
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(model.joint_size, LABELS))
        self.faults: dict[int, str] = {}  # step -> "nan" (a NaN loss) | "crash" (an exception)

    def forward(self, batch: VLBatch, step: int, micro_step: int) -> LossOutput:
        logits = self.head(self.model(batch).joint)
        labels = batch.targets["label"]
        loss = F.cross_entropy(logits, labels)
        if self.faults.get(step) == "nan":
            loss = loss * float("nan")
        elif self.faults.get(step) == "crash":
            raise RuntimeError(f"simulated crash at step {step}")
        return LossOutput(loss, {"acc": (logits.argmax(-1) == labels).float().mean()})


def make_module(dropout: float = 0.1, seed: int = 0) -> TinyTask:
    import vlkit

    torch.manual_seed(seed)
    model = vlkit.build_model("uniter", preset="tiny", num_hidden_layers=2, v_feature_size=FEAT,
                              v_target_size=CLASSES, hidden_dropout_prob=dropout,
                              attention_probs_dropout_prob=dropout)
    return TinyTask(model, dropout)


def base_config(output_dir, **overrides) -> dict:
    cfg = dict(output_dir=str(output_dir), max_steps=6, seed=7, lr=1e-3, warmup=2, batch_size=8, cpu=True,
               trackers=[], progress=False, save_every=0, keep_checkpoints=0)
    cfg.update(overrides)
    return cfg


def losses(result_or_records) -> list[float]:
    records = getattr(result_or_records, "history", result_or_records)
    return [r["loss"] for r in records]


def reset_accelerate() -> None:
    """Forget the process-wide Accelerate state (tests build Accelerators with different settings)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    reset_accelerate()
    yield
    reset_accelerate()


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run much faster on one thread, above all on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def pairs() -> TinyPairs:
    return TinyPairs()


@pytest.fixture
def tiny():
    """The helpers above, for test modules (``tiny.make_module()``, ``tiny.base_config(tmp_path)``)."""
    import types

    return types.SimpleNamespace(TinyPairs=TinyPairs, collate=collate, make_module=make_module,
                                 base_config=base_config, losses=losses,
                                 reset_accelerate=reset_accelerate)
