"""Checkpoints: round trip, RNG states, atomic writes under a crash, corrupt files, pruning."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from vlkit.train import checkpoint as ckpt
from vlkit.train.optim import build_optimizer, build_scheduler


@pytest.fixture
def make_module(tiny):
    return tiny.make_module


def _train_objects(make_module, seed: int = 0):
    module = make_module(seed=seed)
    opt = build_optimizer(module, lr=1e-3)
    sched = build_scheduler(opt, 10, 2)
    for p in module.parameters():  # one real update so the optimizer has state
        p.grad = torch.ones_like(p)
    opt.step()
    sched.step()
    return module, opt, sched


def _save(root, step, module, opt, sched, keep=0):
    return ckpt.save_checkpoint(root, step, module, opt, sched, [ckpt.rng_state()],
                                {"epoch": 1, "batches_in_epoch": 3}, keep=keep)


def test_rng_state_round_trip():
    state = ckpt.rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(3)
    ckpt.set_rng_state(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert again[0] == expected[0] and again[1] == expected[1] and torch.equal(again[2], expected[2])


def test_round_trip_and_weights_only(tmp_path, make_module):
    module, opt, sched = _train_objects(make_module)
    saved_rng = ckpt.rng_state()
    path = _save(tmp_path, 5, module, opt, sched)
    assert path == tmp_path / "step_5" and (tmp_path / "latest").read_text().strip() == "step_5"
    for name in ("optimizer.pt", "scheduler.pt", "rng.pt"):
        torch.load(path / name, weights_only=True)  # no pickled classes anywhere
    fresh = make_module(seed=1)
    opt2 = build_optimizer(fresh, lr=1e-3)
    sched2 = build_scheduler(opt2, 10, 2)
    state = ckpt.load_checkpoint(path, fresh, opt2, sched2)
    assert (state["step"], state["epoch"], state["batches_in_epoch"]) == (5, 1, 3)
    assert len(state["rng"]) == 1 and torch.equal(state["rng"][0]["torch"], saved_rng["torch"])
    for (n, a), b in zip(module.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), n
    assert sched2.state_dict()["last_epoch"] == 1
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_crash_during_save_keeps_previous(tmp_path, monkeypatch, make_module):
    module, opt, sched = _train_objects(make_module)
    _save(tmp_path, 2, module, opt, sched)
    before = {p.name: p.read_bytes() for p in (tmp_path / "step_2").iterdir()}
    real_save = torch.save

    def crash(obj, f, *args, **kwargs):
        if str(getattr(f, "name", f)).endswith("scheduler.pt"):  # a path or a file object
            real_save(obj, f, *args, **kwargs)
            raise OSError("disk full (simulated)")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="simulated"):
        _save(tmp_path, 4, module, opt, sched)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_2"]
    assert (tmp_path / "latest").read_text().strip() == "step_2"
    assert {p.name: p.read_bytes() for p in (tmp_path / "step_2").iterdir()} == before
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_2"
    ckpt.load_checkpoint(tmp_path / "step_2", make_module(seed=3))


def test_leftover_temporary_is_ignored_and_removed(tmp_path, make_module):
    module, opt, sched = _train_objects(make_module)
    _save(tmp_path, 2, module, opt, sched)
    (tmp_path / ".tmp-step_4.abc").mkdir()  # as left by a process killed mid-save
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_2"
    ckpt.remove_stale_temporaries(tmp_path)
    assert not (tmp_path / ".tmp-step_4.abc").exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_state", "bad_json"])
def test_corrupt_checkpoint_names_the_file(tmp_path, damage, make_module):
    module, opt, sched = _train_objects(make_module)
    path = _save(tmp_path, 3, module, opt, sched)
    weights = path / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:100])
        match = "model.safetensors is truncated"
    elif damage == "flip":
        data = bytearray((path / "optimizer.pt").read_bytes())
        data[-20] ^= 0xFF
        (path / "optimizer.pt").write_bytes(bytes(data))
        match = "optimizer.pt is corrupt"
    elif damage == "delete_state":
        (path / "trainer_state.json").unlink()
        match = "trainer_state.json is missing"
    else:
        (path / "trainer_state.json").write_text("{\"step\": 3, ")
        match = "trainer_state.json is corrupt"
    with pytest.raises(ckpt.CheckpointError, match=match):
        ckpt.load_checkpoint(path, make_module(seed=1))


def test_keep_last_checkpoints(tmp_path, make_module):
    module, opt, sched = _train_objects(make_module)
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, module, opt, sched, keep=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [3, 4]
    _save(tmp_path, 4, module, opt, sched, keep=2)  # saving the same step again replaces it
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [3, 4]
    meta = json.loads((tmp_path / "step_4" / "trainer_state.json").read_text())
    assert set(meta["files"]) == {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt"}
