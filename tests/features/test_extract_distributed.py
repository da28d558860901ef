"""Extraction spread over processes: each rank extracts the images whose id hashes to it into its own shard;
the sharded store equals a one-process run id by id; a killed rank resumes on its own; ``processes=2``
and ``accelerate launch`` start two gloo processes on the CPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vlkit.cli import main as cli
from vlkit.data.shapes import ShapesWorld
from vlkit.features.detector import extract_features
from vlkit.features.distributed import extract_rank
from vlkit.features.shards import build_index, shard_files, shard_of
from vlkit.features.store import FeatureStore
from vlkit.runtime import free_port

REPO = Path(__file__).resolve().parents[2]
FIELDS = ("features", "boxes", "conf", "cls_prob", "attr_prob", "objects_id", "attrs_id")


def _images(n: int = 8) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    sizes = [(48, 64), (64, 48)]
    return [(f"im{i}", rng.integers(0, 256, (*sizes[i % 2], 3), dtype=np.uint8)) for i in range(n)]


def assert_same_store(a: FeatureStore, b: FeatureStore) -> None:
    assert sorted(a.ids()) == sorted(b.ids())
    for image_id in a.ids():
        ra, rb = a.load(image_id, num_bb=1000), b.load(image_id, num_bb=1000)
        for field in FIELDS:
            x, y = getattr(ra, field), getattr(rb, field)
            assert (x is None) == (y is None), field
            if x is not None:
                np.testing.assert_array_equal(x, y, err_msg=f"{image_id} {field}")


def test_two_ranks_equal_one_process(tmp_path, tiny_detector):
    images = _images()
    kw = dict(detector=tiny_detector, batch_size=1, dtype="float32")
    one = extract_features(images, tmp_path / "one.h5", progress=False, **kw)
    for rank in range(2):
        shard = extract_rank(images, tmp_path / "two", rank, 2, progress=False, **kw)
        ids = FeatureStore(shard).ids()
        assert ids and all(shard_of(i, 2) == rank for i in ids)  # each rank wrote only its own images
    build_index(tmp_path / "two")
    assert [p.name for p in shard_files(tmp_path / "two")] == ["shard-00000-of-00002.h5", "shard-00001-of-00002.h5"]
    assert_same_store(FeatureStore(one), FeatureStore(tmp_path / "two"))


def test_a_killed_rank_resumes_on_its_own(tmp_path, tiny_detector):
    images = _images()
    kw = dict(detector=tiny_detector, batch_size=1, dtype="float32", progress=False)
    mine = [p for p in images if shard_of(p[0], 2) == 1]
    assert len(mine) >= 3

    def killed():
        yield from images[: images.index(mine[1]) + 1]  # rank 1 commits mine[0] and mine[1], then dies
        raise KeyboardInterrupt

    extract_rank(images, tmp_path / "two", 0, 2, **kw)
    with pytest.raises(KeyboardInterrupt):
        extract_rank(killed(), tmp_path / "two", 1, 2, **kw)
    calls = []
    real = tiny_detector.extract
    tiny_detector.extract = lambda imgs, **k: calls.append(len(imgs)) or real(imgs, **k)
    try:
        extract_rank(images, tmp_path / "two", 1, 2, **kw)  # the same command again: rank 1 alone
    finally:
        del tiny_detector.extract
    assert sum(calls) == len(mine) - 2  # only what the killed rank had not committed
    build_index(tmp_path / "two")
    one = extract_features(images, tmp_path / "one.h5", detector=tiny_detector, batch_size=1, dtype="float32",
                           progress=False)
    assert_same_store(FeatureStore(one), FeatureStore(tmp_path / "two"))


def _shapes_folder(tmp_path: Path, n: int = 6) -> Path:
    world = ShapesWorld(seed=7, num_images=n, image_size=64)
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(n):
        world.image(i).save(folder / f"{world.image_id(i)}.png")
    return folder


@pytest.mark.slow
def test_processes_2_spawns_two_gloo_processes(tmp_path, capfd):
    folder = _shapes_folder(tmp_path)
    common = [f"images={folder}", "device=cpu", "batch_size=1", "dtype=float32", "threads=1"]
    assert cli(["extract-features", *common, f"out={tmp_path / 'one.h5'}", "progress=false"]) == 0
    assert cli(["extract-features", *common, f"out={tmp_path / 'two'}", "processes=2"]) == 0
    out = capfd.readouterr()
    assert "6 images over 2 processes" in out.out and "images/s" in out.out
    assert "6 images, feature_dim 256" in out.out
    assert len(shard_files(tmp_path / "two")) == 2 and not (tmp_path / "two" / ".progress").exists()
    assert_same_store(FeatureStore(tmp_path / "one.h5"), FeatureStore(tmp_path / "two"))


@pytest.mark.slow
def test_accelerate_launch_two_cpu_processes(tmp_path):
    folder = _shapes_folder(tmp_path)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), "-m", "vlkit.cli", "extract-features", f"images={folder}",
           f"out={tmp_path / 'two'}", "device=cpu", "batch_size=1", "dtype=float32", "threads=1"]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "6 images over 2 processes" in proc.stdout
    assert len(shard_files(tmp_path / "two")) == 2
    one = extract_features([(p.stem, p) for p in sorted(folder.iterdir())], tmp_path / "one.h5", detector="shapes",
                           batch_size=1, dtype="float32", progress=False)
    assert_same_store(FeatureStore(one), FeatureStore(tmp_path / "two"))
