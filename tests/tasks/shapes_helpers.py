"""Helpers shared by the task tests: an oracle region store of the shapes world, each family's image
source, a plain training loop, and the per-family shapes data getter."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

import vlkit
from vlkit.data.images import PixelSource, RegionSource, build_transform
from vlkit.data.shapes import ShapesWorld, shapes_tokenizer
from vlkit.features.store import FeatureStoreWriter

# The built-ins, whose official heads, losses and image sources the task tests pin; what every registered family
# must do (each task head builds and backprops) is vlkit.testing's suite, run over vlkit.list_models().
FAMILIES = ("vilbert", "uniter", "meter")
FEATURE_DIM = 256  # the tiny presets' v_feature_size


def region_store(path: Path, scenes: Mapping[str, Any]) -> Path:
    """A feature store with one region per object of each scene: its ground-truth box and a feature
    of one-hot kind and attributes (an oracle detector)."""
    with FeatureStoreWriter(path, resume=False) as writer:
        for image_id, scene in scenes.items():
            feats = np.zeros((len(scene.objects), FEATURE_DIM), np.float32)
            for k, obj in enumerate(scene.objects):
                feats[k, obj.class_id] = 1.0
                feats[k, [16 + a for a in obj.attribute_ids]] = 1.0
            writer.add(image_id, features=feats, boxes=np.array([o.box for o in scene.objects], np.float32),
                       image_h=scene.height, image_w=scene.width)
    return path


def world_store(world: ShapesWorld, path: Path) -> Path:
    return region_store(path, {world.image_id(i): world.scene(i) for i in range(world.num_images)})


def image_source(family: str, world: ShapesWorld, store: Path):
    """Oracle regions for ViLBERT / UNITER, the rendered images (64 px, patch 8) for tiny METER."""
    if family == "meter":
        return PixelSource(world.load_image, build_transform(64), patch_size=8)
    return RegionSource(store, num_bb=100)


def tiny_model(family: str, **overrides):
    return vlkit.build_model(family, preset="tiny", vocab_size=len(shapes_tokenizer()), **overrides)


def train_steps(task: nn.Module, dataset, steps: int, lr: float = 1e-3, batch_size: int = 32, seed: int = 0):
    """A plain AdamW loop over ``dataset`` (held in memory, reshuffled every epoch); returns the last LossOutput."""
    torch.manual_seed(seed)
    examples = [dataset[i] for i in range(len(dataset))]
    collate = dataset.collator()
    optimizer = torch.optim.AdamW(task.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    task.train()
    step, out = 0, None
    while step < steps:
        order = torch.randperm(len(examples), generator=generator).tolist()
        for start in range(0, len(order) - batch_size + 1, batch_size):
            out = task(collate([examples[i] for i in order[start:start + batch_size]]))
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
            step += 1
            if step == steps:
                break
    return out


def first_batch(dataset, n: int = 4):
    return dataset.collator()([dataset[i] for i in range(n)])


def shapes_cfg(name: str, **extra: Any) -> dict:
    return {"name": name, "source": "shapes", "max_len": 40, **extra}




def shapes_data_getter(task_cls, name: str, world: ShapesWorld, store: Path, tok):
    """``get(family)``: ``task_cls``'s shapes data with that family's image source (built once per kind)."""
    cache = {}

    def get(family: str):
        kind = "pixels" if family == "meter" else "regions"
        if kind not in cache:
            cache[kind] = task_cls.build_data(shapes_cfg(name), tok, image_source(family, world, store), world)
        return cache[kind]

    return get
