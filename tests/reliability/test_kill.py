"""Catalogue: ``kill -9`` during training, during a checkpoint save and during extraction (mid-batch,
in a compaction, in the final merge). Each resumed run must equal the uninterrupted one bit for bit,
with no image lost, duplicated or half-written and no temporary file left behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from reliability_helpers import jsonl_data, run_args

from vlkit.train import read_metrics

pytestmark = pytest.mark.slow


def _killed(code: str, cwd) -> None:
    """Run ``code`` in a fresh interpreter, which must die by SIGKILL."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def _weights(run) -> dict[str, torch.Tensor]:
    return load_file(str(run / "pretraining.safetensors"))


def _same_run(a, b) -> None:
    assert [(r["step"], r["loss"]) for r in read_metrics(a)] == [(r["step"], r["loss"]) for r in read_metrics(b)]
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _leftovers(root) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if ".tmp" in p.name)


@pytest.mark.parametrize("when", ["training", "checkpoint_save"])
def test_kill_during_training_or_a_checkpoint_save_resumes_bit_exactly(tmp_path, data, vlkit_console, when):
    store, caps, _ = data()
    args = ["pretrain", "model=uniter", *jsonl_data(caps, store), "trainer.keep_checkpoints=0"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert vlkit_console(*args, *run_args(straight, steps=4))[0] == 0
    if when == "training":  # dies inside step 3, after the step-2 checkpoint
        patch = """
            from vlkit.train.trainer import Trainer
            step = Trainer._train_step
            def dying(self, model, optimizer, scheduler, stream, i):
                if i == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                return step(self, model, optimizer, scheduler, stream, i)
            Trainer._train_step = dying
        """
    else:  # dies while writing the step-3 checkpoint, its weights already written
        patch = """
            from vlkit.train import checkpoint
            save = checkpoint.torch.save
            def dying(obj, path, *a, **k):
                if "step_3" in str(path) or ".tmp-step_3" in str(path):
                    os.kill(os.getpid(), signal.SIGKILL)
                return save(obj, path, *a, **k)
            checkpoint.torch.save = dying
        """
    _killed(f"""
        import os, signal
        {textwrap.dedent(patch).strip().replace(chr(10), chr(10) + ' ' * 8)}
        from vlkit.cli import main
        main({[*args, *run_args(killed, steps=4)]!r})
    """, tmp_path)
    assert (killed / "checkpoints" / "step_2" / "trainer_state.json").is_file()  # written before the kill: intact
    assert not (killed / "checkpoints" / "step_3").exists()
    assert vlkit_console(*args, *run_args(killed, steps=4), "resume=true")[0] == 0
    _same_run(straight, killed)
    assert _leftovers(killed) == []


def _images(folder, n: int) -> None:
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(0)
    for k in range(n):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / f"im{k:02d}.png")


EXTRACT = """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from reliability_helpers import tiny_detector
    from vlkit.features.commands import image_files
    from vlkit.features.detector import extract_features
    {patch}
    extract_features(image_files({folder!r}), {out!r}, detector=tiny_detector(), batch_size=2, dtype="float32",
                     progress=False)
"""


def _extract_killed(tmp_path, folder, out, patch: str) -> None:
    tests = os.path.dirname(__file__)
    _killed(EXTRACT.format(tests=tests, folder=str(folder), out=str(out),
                           patch=textwrap.dedent(patch).strip().replace("\n", "\n    ")), tmp_path)


def _store(path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {k: f[k]["features"][()] for k in f}


@pytest.mark.parametrize("when", ["mid_batch", "compaction", "final_merge"])
def test_kill_during_extraction_resumes_without_loss_or_duplicates(tmp_path, when):
    from reliability_helpers import tiny_detector

    from vlkit.features.commands import image_files
    from vlkit.features.detector import extract_features

    folder = tmp_path / "images"
    _images(folder, 12)
    straight = extract_features(image_files(folder), tmp_path / "straight.h5", detector=tiny_detector(), batch_size=2,
                                dtype="float32", progress=False)
    out = tmp_path / "killed.h5"
    if when == "mid_batch":  # dies writing the 4th batch's shard: 3 batches (6 images) committed
        patch = """
            import h5py
            create = h5py.Group.create_group
            calls = [0]
            def dying(self, name, *a, **k):
                calls[0] += 1
                if calls[0] == 7:
                    os.kill(os.getpid(), signal.SIGKILL)
                return create(self, name, *a, **k)
            h5py.Group.create_group = dying
        """
    elif when == "compaction":  # dies after a compacted shard replaced the small ones, before their deletion
        patch = """
            from pathlib import Path
            from vlkit.features import store
            store.COMPACT_EVERY = 3
            init = store.FeatureStoreWriter.__init__
            store.FeatureStoreWriter.__init__ = lambda self, *a, **k: init(self, *a, **{**k, "compact_every": 3})
            unlink = Path.unlink
            def dying(self, *a, **k):
                if self.name.startswith("shard-"):
                    os.kill(os.getpid(), signal.SIGKILL)
                return unlink(self, *a, **k)
            Path.unlink = dying
        """
    else:  # dies copying the 5th image into the final store
        patch = """
            import h5py
            copy = h5py.Group.copy
            calls = [0]
            def dying(self, *a, **k):
                calls[0] += 1  # copies from the shards into the final store (no compaction with 6 shards)
                if calls[0] == 5:
                    os.kill(os.getpid(), signal.SIGKILL)
                return copy(self, *a, **k)
            h5py.Group.copy = dying
        """
    _extract_killed(tmp_path, folder, out, patch)
    assert not out.exists()  # never a half-written store
    shards = sorted((tmp_path / "killed.h5.parts").glob("shard-*.h5"))
    committed = [k for s in shards for k in h5py.File(s, "r")]
    if when == "mid_batch":
        assert sorted(committed) == [f"im{k:02d}" for k in range(6)]
        assert len(_leftovers(tmp_path / "killed.h5.parts")) == 1  # the shard in flight
    if when == "compaction":
        assert len(committed) == 12  # the same 6 images twice: in the compacted shard and the small ones
    if when == "final_merge":
        assert len(committed) == 12 and _leftovers(tmp_path) != []  # all committed, the merge's temp file left
    extract_features(image_files(folder), out, detector=tiny_detector(), batch_size=2, dtype="float32", progress=False)
    got, expected = _store(out), _store(straight)
    assert sorted(got) == sorted(expected)  # nothing lost, nothing twice
    assert all(np.array_equal(got[k], expected[k]) for k in expected)  # bit-exact
    assert _leftovers(tmp_path) == [] and not (tmp_path / "killed.h5.parts").exists()


def test_temporary_files_of_a_killed_run_are_removed_on_start(tmp_path, data, vlkit_console):
    import socket

    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    out = tmp_path / "run"
    (out / "model").mkdir(parents=True)
    orphans = [out / f".run.json.tmp-{host}-{dead}-a1b2c3", out / "model" / f".model.safetensors.tmp-{host}-{dead}-x9"]
    alive = out / f".pretraining.safetensors.tmp-{host}-{os.getpid()}-keep"  # a live process's: kept
    for path in [*orphans, alive]:
        path.write_bytes(b"half written")
    store, caps, _ = data()
    assert vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(out, steps=1))[0] == 0
    assert not any(p.exists() for p in orphans) and alive.exists()
