"""Catalogue, class "system errors": a full disk, a missing permission, a read-only file system or a file where
a folder is expected name the path and the cause, and leave nothing half-written (simulated by monkeypatching)."""
from __future__ import annotations

import errno
import os
from collections import namedtuple

import numpy as np
import pytest
import torch
from reliability_helpers import jsonl_data, regions, run_args


def _temporaries(folder):
    return [p for p in folder.rglob("*") if ".tmp-" in p.name]


@pytest.mark.parametrize("failure", ["enospc", "torch_enforce_fail"])
def test_full_disk_during_a_checkpoint_save_names_the_file_and_the_cause(tmp_path, data, vlkit_console, monkeypatch,
                                                                          failure):
    import vlkit.io

    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        if failure == "enospc":  # what a file object reports when the disk fills
            f.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        # what torch's own file writer reports for the same (a path given to torch.save)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", full_disk)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(vlkit.io.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 0))
    store, caps, _ = data()
    out = tmp_path / "run"
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(out))
    monkeypatch.setattr(torch, "save", real_save)
    assert code == 1 and "bug in vlkit" not in err and "Traceback" not in err, err
    assert f"cannot write {out / 'checkpoints' / 'step_1' / 'optimizer.pt'}: No space left on device" in err
    assert _temporaries(out) == [] and not (out / "checkpoints" / "step_1").exists()


def test_writer_exit_after_a_failed_flush_reports_the_disk_not_image_h(tmp_path, monkeypatch):
    import h5py

    from vlkit.features.store import FeatureStore, FeatureStoreWriter

    out = tmp_path / "feats.h5"
    real = h5py.Group.create_dataset
    calls = {"n": 0}

    def fails_once(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # half-way through writing a buffer of images
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(h5py.Group, "create_dataset", fails_once)
    with pytest.raises(OSError, match=r"cannot write .*feats\.h5\.parts.*: No space left on device") as info:
        with FeatureStoreWriter(out, provenance={"detector": "t"}, dtype="float32", flush_every=2) as writer:
            for k in range(6):
                writer.add(f"img{k}", **regions(k))
    assert info.value.errno == errno.ENOSPC and not isinstance(info.value, KeyError)
    assert not out.exists() and _temporaries(tmp_path) == []  # no half-written shard, no partial store
    monkeypatch.setattr(h5py.Group, "create_dataset", real)
    with FeatureStoreWriter(out, provenance={"detector": "t"}, dtype="float32", flush_every=2) as writer:
        for k in range(6):
            if f"img{k}" not in writer.done_ids:
                writer.add(f"img{k}", **regions(k))
    store = FeatureStore(out)
    assert sorted(store.ids()) == [f"img{k}" for k in range(6)]
    np.testing.assert_array_equal(store.load("img3").features, regions(3)["features"])


@pytest.mark.parametrize("cause, errno_, message", [
    ("read-only", errno.EROFS, "Read-only file system"),
    ("permission", errno.EACCES, "Permission denied"),
])
def test_read_only_or_permission_denied_save_names_path_and_cause(tmp_path, monkeypatch, cause, errno_, message):
    from vlkit.io import atomic_write_text

    def refused(*args, **kwargs):
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr("vlkit.io.os.replace", refused)
    target = tmp_path / "run.json"
    target.write_text("old")
    with pytest.raises(OSError, match=rf"cannot write {target}: {message}"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old" and _temporaries(tmp_path) == []


def test_a_file_where_the_run_writes_a_folder_is_refused_before_step_1(tmp_path, data, vlkit_console):
    store, caps, _ = data()
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").write_text("not a folder")
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(out))
    assert code == 1 and f"{out / 'checkpoints'} is a file where the run writes a folder" in err
    afile = tmp_path / "o_afile"
    afile.write_text("x")
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(afile / "run"))
    assert code == 1 and f"{afile} is a file, not a folder" in err and "not writable" not in err
