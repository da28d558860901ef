"""Pre-training from a stream of pair shards: the stream's position goes into the checkpoint, and a run
interrupted mid-epoch and resumed gives the losses of an uninterrupted one, across the epoch boundary."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from vlkit.data.images import RegionSource
from vlkit.data.shapes import ShapesWorld, shapes_tokenizer
from vlkit.data.shards import shapes_records, write_shards
from vlkit.data.stream import StreamedPairs
from vlkit.features.store import FeatureStoreWriter

STEPS = 16  # 12 batches of 4 per epoch: the run crosses into epoch 1


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    world = ShapesWorld(seed=3, num_images=10, image_size=64, val_images=0, test_images=0)
    write_shards(shapes_records(world), root / "pairs", shard_size=10, row_group_size=5)
    rng = np.random.default_rng(0)
    with FeatureStoreWriter(root / "f.h5", provenance={"detector": "random"}, dtype="float32") as w:
        for i in range(len(world)):
            xy = rng.uniform(0, 30, (6, 2))
            w.add(world.image_id(i), features=rng.normal(size=(6, 16)), boxes=np.concatenate([xy, xy + 20], 1),
                  conf=rng.uniform(size=6), image_h=64, image_w=64)
    return root, shapes_tokenizer()


class Crashing(nn.Module):
    """The pre-training module, stopped by an exception at step ``at`` (a kill between two checkpoints)."""

    def __init__(self, inner: nn.Module, at: int | None):
        super().__init__()
        self.inner, self.at = inner, at

    def forward(self, batch, step, micro_step):
        if step == self.at:
            raise RuntimeError(f"killed at step {step}")
        return self.inner(batch, step, micro_step)


def _run(data, out, tiny, crash_at=None, resume=False):
    import vlkit
    from vlkit.objectives import build_pretraining
    from vlkit.train import Trainer

    root, tok = data
    torch.manual_seed(0)
    model = vlkit.build_model("uniter", preset="tiny", num_hidden_layers=1, vocab_size=len(tok), v_feature_size=16)
    module = Crashing(build_pretraining(model, {"objectives": {"mlm": {}}}, tokenizer=tok, seed=0), crash_at)
    trainer = Trainer(module, tiny.base_config(out, max_steps=STEPS, batch_size=4, save_every=4, keep_checkpoints=4,
                                               resume=resume, warmup=0))
    stream = StreamedPairs(root / "pairs", tok, image_source=RegionSource(root / "f.h5", num_bb=6), buffer_size=8)
    return trainer.fit(trainer.loader(stream))


def test_interrupted_and_resumed_stream_equals_uninterrupted(data, tmp_path, tiny):
    full = _run(data, tmp_path / "full", tiny)
    assert [r["epoch"] for r in full.history][10:14] == [0, 0, 1, 1]
    with pytest.raises(RuntimeError, match="killed at step 9"):
        _run(data, tmp_path / "cut", tiny, crash_at=9)
    state = json.loads((tmp_path / "cut" / "checkpoints" / "step_8" / "trainer_state.json").read_text())
    assert state["stream"]["epoch"] == 0 and state["stream"]["batches"] == 8  # mid-epoch position
    resumed = _run(data, tmp_path / "cut", tiny, resume=True)
    assert [r["step"] for r in resumed.history] == list(range(9, STEPS + 1))
    assert tiny.losses(resumed) == tiny.losses(full)[8:]  # bit-equal on the CPU


def _cli_args(out, steps=2):
    return [f"trainer.output_dir={out}", f"trainer.max_steps={steps}", "trainer.batch_size=4", "trainer.warmup=0",
            "trainer.progress=false", "trainer.trackers=[]", "model.preset=tiny", "data.buffer_size=8"]


@pytest.mark.parametrize("family", ["uniter", "meter"])
def test_vlkit_pretrain_data_shards(data, tmp_path, family, tmp_path_factory):
    """``vlkit pretrain data=shards``: regions from a feature store (UNITER), pixels from the shards (METER)."""
    from vlkit.cli import main
    from vlkit.train import read_metrics

    root, _ = data
    if family == "uniter":
        image = ["data.image.source=features", f"data.image.path={root / 'f.h5'}", "data.image.num_bb=6",
                 "objectives=uniter_mlm_itm"]
        shards = root / "pairs"
    else:
        world = ShapesWorld(seed=3, num_images=10, image_size=64, val_images=0, test_images=0)
        shards = write_shards(shapes_records(world), tmp_path / "pixels", shard_size=10, row_group_size=5,
                              image_bytes=lambda i: world.png_bytes(world.index_of(i)))
        image = []
    out = tmp_path / "run"
    assert main(["pretrain", f"model={family}", "data=shards", f"data.path={shards}", *image, *_cli_args(out)]) == 0
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    state = json.loads(next((out / "checkpoints").glob("step_2")).joinpath("trainer_state.json").read_text())
    assert state["stream"]["batches"] == 2 and state["stream"]["rows"] == 50
