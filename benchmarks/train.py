"""Trainer overhead: seconds per optimizer step of `vlkit.train.Trainer` against a bare PyTorch loop
on the same module and batches, checkpoint save / resume-load time and size, and the padding
fraction of fixed-size against dynamic (token-bucket) batches.

    python benchmarks/train.py                              # UNITER tiny, CPU
    python benchmarks/train.py --preset base --steps 10 --batch-size 16

Prints a table, writes benchmarks/results/train.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vlkit.types import LossOutput, VLBatch

RESULTS = Path(__file__).resolve().parent / "results"


class Pairs(torch.utils.data.Dataset):
    """Synthetic examples with UNITER-like lengths: 8-40 tokens, 10-36 regions."""

    def __init__(self, n: int, vocab: int, feat: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(n):
            t, k = int(torch.randint(8, 41, (), generator=g)), int(torch.randint(10, 37, (), generator=g))
            xy = torch.rand(k, 2, generator=g) * 0.5
            self.items.append({"id": f"ex{i}", "ids": torch.randint(1, vocab, (t,), generator=g),
                               "feats": torch.rand(k, feat, generator=g), "boxes": torch.cat([xy, xy + 0.4], -1),
                               "label": int(torch.randint(0, 2, (), generator=g))})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]

    def lengths(self) -> list[tuple[int, int]]:
        return [(len(e["ids"]), len(e["feats"])) for e in self.items]

    def collator(self):
        return collate


def collate(examples: list[dict]) -> VLBatch:
    from torch.nn.utils.rnn import pad_sequence

    def pad(key):
        seqs = [e[key] for e in examples]
        mask = pad_sequence([torch.ones(len(s), dtype=torch.long) for s in seqs], batch_first=True)
        return pad_sequence(seqs, batch_first=True), mask

    ids, mask = pad("ids")
    feats, region_mask = pad("feats")
    boxes, _ = pad("boxes")
    return VLBatch(input_ids=ids, attention_mask=mask, region_feats=feats, region_boxes=boxes,
                   region_mask=region_mask, targets={"label": torch.tensor([e["label"] for e in examples])},
                   ids=[e["id"] for e in examples])


class Classify(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.head = model, nn.Linear(model.joint_size, 2)

    def forward(self, batch: VLBatch, step: int = 0, micro_step: int = 0) -> LossOutput:
        loss = F.cross_entropy(self.head(self.model(batch).joint), batch.targets["label"])
        return LossOutput(loss)


def build(preset: str) -> Classify:
    import vlkit

    torch.manual_seed(0)
    return Classify(vlkit.build_model("uniter", preset=preset))


def bare_loop(preset: str, loader, steps: int) -> float:
    """Seconds per step of a plain forward / backward / clip / AdamW loop (after one warm-up step)."""
    module = build(preset).train()
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
    batches = iter(loader)
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        module(next(batches)).loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return sum(times[1:]) / steps


def trainer_run(preset: str, data: Pairs, out: Path, steps: int, **cfg) -> tuple[float, list[dict], object]:
    """Wall time of ``Trainer.fit`` for ``steps`` steps (one checkpoint at the end), its records."""
    from accelerate.state import AcceleratorState

    from vlkit.train import Trainer

    AcceleratorState._reset_state(reset_partial_state=True)
    config = dict(output_dir=str(out), max_steps=steps, warmup=0, lr=1e-4, grad_clip=1.0, trackers=[],
                  progress=False, save_every=0, cpu=True, **cfg)
    trainer = Trainer(build(preset), config)
    t0 = time.perf_counter()
    result = trainer.fit(trainer.loader(data))
    return time.perf_counter() - t0, result.history, trainer


def checkpoint_times(preset: str, batch: VLBatch, root: Path) -> tuple[float, float, float]:
    """(save s, load s, MB) of a checkpoint whose optimizer holds state."""
    from vlkit.train import build_optimizer, build_scheduler, load_checkpoint
    from vlkit.train.checkpoint import rng_state, save_checkpoint

    module = build(preset)
    opt = build_optimizer(module, lr=1e-4)
    sched = build_scheduler(opt, 10, 0)
    module(batch).loss.backward()
    opt.step()
    t0 = time.perf_counter()
    path = save_checkpoint(root, 1, module, opt, sched, [rng_state()], {"epoch": 0, "batches_in_epoch": 1})
    save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_checkpoint(path, build(preset), opt, sched)
    load_s = time.perf_counter() - t0
    return save_s, load_s, sum(p.stat().st_size for p in path.iterdir()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    probe = build(args.preset).model.config
    data = Pairs(args.batch_size * (2 * args.steps + 1), probe.vocab_size, probe.v_feature_size)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trainer_run(args.preset, data, tmp / "warm-up", 1, batch_size=args.batch_size)  # imports, allocator
        short_s, _, trainer = trainer_run(args.preset, data, tmp / "short", args.steps, batch_size=args.batch_size)
        long_s, fixed_hist, _ = trainer_run(args.preset, data, tmp / "long", 2 * args.steps, batch_size=args.batch_size)
        per_step = (long_s - short_s) / args.steps  # fixed costs (setup, final checkpoint) cancel out
        loader = trainer.loader(data)
        bare = bare_loop(args.preset, loader, args.steps)
        save_s, load_s, size_mb = checkpoint_times(args.preset, next(iter(loader)), tmp / "ckpt")
        units = args.batch_size * (40 + 36) // 2  # about as many examples per batch as the fixed runs
        _, units_hist, _ = trainer_run(args.preset, data, tmp / "units", args.steps, batching="units",
                                       max_units=units, size_multiple=8, bucket_size=len(data))
    mean = lambda hist, key: sum(r[key] for r in hist) / len(hist)  # noqa: E731
    row = {"preset": args.preset, "batch_size": args.batch_size, "steps": args.steps,
           "threads": torch.get_num_threads(), "bare_s_per_step": bare, "trainer_s_per_step": per_step,
           "overhead_pct": 100 * (per_step / bare - 1), "setup_s": short_s - args.steps * per_step,
           "checkpoint_mb": size_mb, "save_s": save_s, "load_s": load_s,
           "padding_fixed": mean(fixed_hist, "padding"), "padding_units": mean(units_hist, "padding"),
           "examples_per_batch_units": mean(units_hist, "examples"), "platform": platform.platform()}
    cols = ["preset", "batch_size", "bare_s_per_step", "trainer_s_per_step", "overhead_pct", "setup_s",
            "checkpoint_mb", "save_s", "load_s", "padding_fixed", "padding_units", "examples_per_batch_units"]
    print(" | ".join(cols))
    print(" | ".join(f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in cols))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "train.json").write_text(json.dumps([row], indent=2))


if __name__ == "__main__":
    main()
