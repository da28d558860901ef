"""Catalogue: checkpoints and model files that do not fit, are not what they claim, or carry a malicious
pickle; file modes on a shared machine; a NaN loss that says where it came from."""
from __future__ import annotations

import json
import os
import pickle
import stat

import numpy as np
import pytest
import torch

import vlkit
from vlkit.io import UnreadableFileError, WeightsMismatchError, sha256_file
from vlkit.train import checkpoint as ckpt


def _checkpoint(root, module=None):
    module = module or vlkit.build_model("uniter", preset="tiny")
    opt = torch.optim.AdamW(module.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return ckpt.save_checkpoint(root, 1, module, opt, sched, [ckpt.rng_state()], {}), module, opt, sched


def test_weights_with_one_extra_and_one_missing_key(tmp_path):
    from safetensors.torch import save_file

    model = vlkit.build_model("uniter", preset="tiny")
    model.save_pretrained(tmp_path / "m")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state.pop("pooler.dense.weight")
    state["extra.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(WeightsMismatchError, match=r"m/model\.safetensors: weights do not match the uniter config of "
                       r".*1 missing key\(s\) \['pooler\.dense\.weight'\], 1 unexpected key\(s\) \['extra\.weight'\]"):
        vlkit.from_pretrained(tmp_path / "m")
    path, *_ = _checkpoint(tmp_path / "c")
    smaller = vlkit.build_model("uniter", preset="tiny", num_hidden_layers=1)
    with pytest.raises(ckpt.CheckpointError, match=r"step_1/model\.safetensors does not match Uniter: 0 missing key\(s\) "
                       r"\[\], \d+ unexpected key\(s\) \['encoder\.layer\.1\."):
        ckpt.load_checkpoint(path, smaller)


def test_files_that_are_not_checkpoints_name_their_path(tmp_path):
    from vlkit.train.pipeline import load_pretraining

    model = vlkit.build_model("uniter", preset="tiny")
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not safetensors at all" * 10)
    with pytest.raises(UnreadableFileError, match=r"m/model\.safetensors: not a readable safetensors file"):
        vlkit.from_pretrained(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{ truncated")
    with pytest.raises(ValueError, match=r"m/config\.json: not a vlkit model config"):
        vlkit.from_pretrained(tmp_path / "m")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_bytes(b"\x00\x01")
    with pytest.raises(vlkit.validate.DataError, match=r"run/run\.json is not a vlkit run record"):
        load_pretraining(tmp_path / "run")
    path, module, opt, sched = _checkpoint(tmp_path / "c")
    (path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes()[:64])
    with pytest.raises(ckpt.CheckpointError, match=r"step_1/model\.safetensors is truncated or corrupt"):
        ckpt.load_checkpoint(path, module, opt, sched)


class _Payload:
    marker = None

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil(marker) -> bytes:
    _Payload.marker = marker
    return pickle.dumps({"weights": np.zeros(2), "payload": _Payload()})


def test_malicious_pickle_is_refused_by_every_loader(tmp_path):
    from vlkit.features.detector.convert import read_checkpoint
    from vlkit.data.formats import read_refs
    from vlkit.features.importers import import_features
    from vlkit.io import UnsafePickleError
    from vlkit.models.encoders import load_state_dict_file

    marker = tmp_path / "PWNED"
    payload = _evil(marker)
    path, module, opt, sched = _checkpoint(tmp_path / "c")
    good = {name: (path / name).read_bytes() for name in ("optimizer.pt", "rng.pt", "trainer_state.json")}
    for name in ("optimizer.pt", "rng.pt"):  # a checkpoint whose hashes were forged to match
        for other, content in good.items():
            (path / other).write_bytes(content)
        (path / name).write_bytes(payload)
        state = json.loads((path / "trainer_state.json").read_text())
        state["files"][name] = {"bytes": (path / name).stat().st_size, "sha256": sha256_file(path / name)}
        (path / "trainer_state.json").write_text(json.dumps(state))
        with pytest.raises(ckpt.CheckpointError, match=rf"step_1/{name}: cannot be loaded with weights_only=True "
                           r"\(UnpicklingError: Unsupported"):
            ckpt.load_checkpoint(path, module, opt, sched)
    (tmp_path / "w.pkl").write_bytes(payload)
    with pytest.raises(UnsafePickleError, match=r"w\.pkl: refusing to unpickle posix\.system"):
        read_checkpoint(tmp_path / "w.pkl")
    (tmp_path / "w.pth").write_bytes(payload)
    with pytest.raises(UnreadableFileError, match=r"w\.pth: cannot be loaded with weights_only=True"):
        read_checkpoint(tmp_path / "w.pth")
    (tmp_path / "enc.bin").write_bytes(payload)
    with pytest.raises(ValueError, match=r"enc\.bin: cannot be read as a plain state dict"):
        load_state_dict_file(tmp_path / "enc.bin")
    (tmp_path / "refs(unc).p").write_bytes(payload)
    (tmp_path / "instances.json").write_text("{}")
    with pytest.raises(UnsafePickleError, match=r"refs\(unc\)\.p: refusing to unpickle posix\.system"):
        read_refs(tmp_path / "refs(unc).p", tmp_path / "instances.json")
    npz = tmp_path / "bua"
    npz.mkdir()
    info = np.empty((), dtype=object)
    info[()] = {"objects_conf": np.ones(2, np.float32), "payload": _Payload()}
    np.savez(npz / "x.npz", x=np.ones((2, 4), np.float32), bbox=np.zeros((2, 4), np.float32), info=info)
    with pytest.raises(UnsafePickleError, match=r"x\.npz \(info\.npy\): refusing to unpickle posix\.system"):
        import_features(npz, "bua_npz", tmp_path / "o.h5", progress=False)
    assert not marker.exists()  # no payload ever ran


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_written_files_honour_the_umask(tmp_path, umask, data):
    from reliability_helpers import regions

    from vlkit.features.store import FeatureStoreWriter

    old = os.umask(umask)
    try:
        _checkpoint(tmp_path / "run" / "checkpoints")
        vlkit.build_model("uniter", preset="tiny").save_pretrained(tmp_path / "run" / "model")
        with FeatureStoreWriter(tmp_path / "f.h5", provenance={}) as w:
            w.add("a", **regions(0))
    finally:
        os.umask(old)
    for path in [tmp_path / "f.h5", *(tmp_path / "run").rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o777 if path.is_dir() else 0o666) & ~umask, (path, oct(mode))


def test_nan_loss_names_objective_examples_images_and_what_to_do(tmp_path, data, vlkit_console):
    from reliability_helpers import jsonl_data, run_args

    store, caps, _ = data()
    out = tmp_path / "run"
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(out, steps=3),
                                 "trainer.lr=1e30", "trainer.grad_clip=0")
    assert code == 1 and "error (NonFiniteLossError): step" in err
    assert "(objective " in err and "examples ['img" in err and "images ['img" in err
    assert "The inputs are finite, so training diverged" in err and "lower trainer.lr" in err
    assert "the last checkpoint, " in err and str(store) in err  # the run's checkpoints and data
    assert "resume=true continues only with the checkpoint's learning rate" in err


def test_nan_inputs_are_blamed_on_the_data(tiny_pairs_with_nan):
    from vlkit.train.trainer import NonFiniteLossError, _nonfinite_message, _nonfinite_record
    from vlkit.types import LossOutput

    batch = tiny_pairs_with_nan
    record = _nonfinite_record(0, float("nan"), batch, LossOutput(torch.tensor(float("nan")),
                                                                   {"objective/mrfr": 1.0, "mrfr/loss": float("nan")}))
    message = _nonfinite_message(record, 0, 7, None)
    assert "step 7: the loss is nan (objective mrfr)" in message
    assert "region_feats of example 'e1' (image 'i1')" in message and "the optimisation is not at fault" in message
    assert issubclass(NonFiniteLossError, FloatingPointError)


@pytest.fixture
def tiny_pairs_with_nan():
    model = vlkit.build_model("uniter", preset="tiny")
    batch = model.example_batch(2)
    batch.region_feats[1, 0, 0] = float("nan")
    batch.ids, batch.image_ids = ["e0", "e1"], ["i0", "i1"]
    return batch
