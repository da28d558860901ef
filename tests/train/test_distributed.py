"""Two CPU processes (gloo, started by ``accelerate launch``) with half the per-rank batch give the
losses of one process. Run as a script, this file is the worker that ``accelerate launch`` starts.

The worker ends its process group (`vlkit.runtime.shutdown`: barrier, then
``destroy_process_group``) before exiting, its trainer freed first: a process that exits with a live
gloo group aborts now and then ("terminate called without an active exception", exit code -6, after
its last Python frame), 4 runs in 100 beside two CPU burners while the trainer was a module global."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vlkit.runtime import free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STEPS = dict(max_steps=4, batch_size=8, grad_accum=2, warmup=0)


def _helpers():
    """tests/train/conftest.py, loaded by path (the worker is not under pytest)."""
    spec = importlib.util.spec_from_file_location("vlkit_train_test_helpers", HERE / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(helpers, output_dir: Path):
    from vlkit.train import Trainer

    trainer = Trainer(helpers.make_module(dropout=0.0), helpers.base_config(output_dir, **STEPS))
    return trainer, trainer.fit(trainer.loader(helpers.TinyPairs()))


def test_shard_batch_contiguous_equal_parts(tiny):
    from vlkit.train import shard_batch

    batch = tiny.collate([tiny.TinyPairs(n=6)[i] for i in range(6)])
    parts = [shard_batch(batch, r, 3) for r in range(3)]
    assert [p.ids for p in parts] == [["ex0", "ex1"], ["ex2", "ex3"], ["ex4", "ex5"]]
    assert torch.equal(torch.cat([p.targets["label"] for p in parts]), batch.targets["label"])
    assert shard_batch(batch, 0, 1) is batch
    with pytest.raises(ValueError, match="batch of 6 examples \\(first example 'ex0'\\) cannot be split equally"):
        shard_batch(batch, 0, 4)


@pytest.mark.slow
def test_two_gloo_processes_match_one(tmp_path, tiny):
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), __file__, str(tmp_path / "two")]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    two = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    ranks = json.loads((tmp_path / "two" / "ranks.json").read_text())
    assert ranks == [0, 1]  # both processes ran and each saw half of every global batch

    _, one = _run(_helpers(), tmp_path / "one")
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    assert tiny.losses(two) == pytest.approx(tiny.losses(one), abs=1e-5)
    assert [r["examples"] for r in two] == [r["examples"] for r in one.history] == [16] * 4
    assert [r["grad_norm"] for r in two] == pytest.approx([r["grad_norm"] for r in one.history], abs=1e-4)
    rng = torch.load(tmp_path / "two" / "checkpoints" / "step_4" / "rng.pt", weights_only=True)
    assert len(rng["ranks"]) == 2


def _worker(out: Path) -> None:
    """One rank: train, then record the ranks that saw data. Its trainer (the DDP model, which holds the process
    group) is freed when this returns, before `vlkit.runtime.shutdown` ends the group."""
    trainer, _ = _run(_helpers(), out)
    seen = trainer.accelerator.gather_for_metrics([trainer.rank], use_gather_object=True)
    if trainer.accelerator.is_main_process:
        (out / "ranks.json").write_text(json.dumps(sorted(seen)))


if __name__ == "__main__":  # the worker: one rank of `accelerate launch`
    torch.set_num_threads(1)
    _worker(Path(sys.argv[1]))
    from vlkit.runtime import shutdown

    shutdown()
