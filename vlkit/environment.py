"""The data side of a run, resolved for one model: the tokenizer, the image source (a shapes world, a feature
store, an image folder) and the model's configuration with the sizes the data decides.

Every command (`vlkit.train.commands`, `vlkit compare`), the processor (`vlkit.processor`) and the FLOP counter
read the data through `prepare_environment`, so each sees the data exactly as a run does. It stands on a floor
of its own above the models (it resolves a family's configuration) and below the objectives and training.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from vlkit.config import plain
from vlkit.data.images import build_image_source
from vlkit.data.shapes import shared_world
from vlkit.data.tokenizers import build_tokenizer, family_tokenizer
from vlkit.models.base import ModelConfig, VLModel, split_model_config
from vlkit.registry import MODELS
from vlkit.runs import user_cache
from vlkit.validate import SkipLog


def cache_dir(cfg_value: str | None = None) -> Path:
    """Where derived data (shapes feature stores) is cached: ``cache_dir=``, ``$VLKIT_CACHE`` or ~/.cache/vlkit."""
    return Path(cfg_value) if cfg_value else user_cache()


def shapes_feature_store(world: Any, directory: Path, progress: bool = True) -> Path:
    """Region features of every image of the shapes ``world`` from the shipped shapes detector,
    extracted once into ``directory`` (resumable) and reused by every later run."""
    path = directory / f"shapes_s{world.seed}_n{world.num_images}_px{world.image_size}.h5"
    if not path.exists():
        from vlkit.features.detector import extract_features  # torchvision: only when the store is extracted

        images = ((world.image_id(i), world.image(i)) for i in range(world.num_images))
        extract_features(images, path, detector="shapes", progress=progress, total=world.num_images)
    return path


@dataclass
class Environment:
    """The data side of a run, resolved for one model: the data config (with the image source the family
    needs), the shapes world when ``data=shapes``, the tokenizer and image source, and the model's
    configuration (``model``: the family's `ModelConfig`, resolved once with the sizes the data decides)."""

    data: dict[str, Any]
    world: Any
    tokenizer: Any
    image_source: Any
    model: ModelConfig
    pairs: Any = None  # the pre-training pairs, once built (`pretraining_dataset`)

    @property
    def skips(self) -> SkipLog:
        """What ``data.on_error=skip`` left out of the task data (the pre-training pairs keep their own)."""
        return self.image_source.skips


def data_sizes(cls: type[VLModel], overrides: Mapping[str, Any], tokenizer: Any, image_source: Any) -> dict[str, Any]:
    """Sizes the data decides, under the config fields the family declares for them
    (`VLModel.data_fields`): the tokenizer's vocabulary and the feature store's feature / class
    dimensions. A model key set explicitly (``overrides``) keeps its value when the data allows it (a
    vocabulary at least the tokenizer's); a conflict is an error."""
    fields = cls.data_fields(overrides)
    sizes: dict[str, int] = {"vocab_size": len(tokenizer)}
    store = getattr(image_source, "store", None)
    if store is not None:
        sizes["region_feature_size"] = store.feature_dim
        if store.num_classes:
            sizes["region_classes"] = store.num_classes
    out: dict[str, Any] = {}
    for size, value in sizes.items():
        key = fields.get(size)
        if key is None:
            continue
        given = overrides.get(key)
        if given is not None and (given < value if size == "vocab_size" else given != value):
            source = "the tokenizer has" if size == "vocab_size" else "the feature store gives"
            raise ValueError(f"model.{key}={given} conflicts with the data: {source} {value}")
        out[key] = value
    return {k: v for k, v in out.items() if k not in overrides}


def prepare_environment(model_cfg: Mapping[str, Any], data_cfg: Mapping[str, Any], cache: str | None = None,
                        progress: bool = True, init: str | os.PathLike | None = None) -> Environment:
    """Resolve ``model_cfg`` and ``data_cfg`` together, once: the tokenizer first (``data.tokenizer``, null: the
    family's official one, `vlkit.data.tokenizers.family_tokenizer`; the resolved name is written back into
    the data config), so that a missing one fails before any other work; region families on the shapes world
    get the shipped detector's features (extracted once, cached); pixel families get images resized to the
    model's input size; the model's configuration then takes the sizes the data decides (`data_sizes`), unless
    the model comes from a saved run (``init``: the preflight checks the data against that model instead)."""
    data = plain(data_cfg)
    name, preset, overrides = split_model_config(plain(model_cfg))
    cls = MODELS.get(name)
    config = cls.config_class.from_preset(preset, **overrides)
    data["tokenizer"] = str(data.get("tokenizer") or family_tokenizer(cls, config))
    tokenizer = build_tokenizer(data["tokenizer"])
    image = data.setdefault("image", {})
    world = None
    if data.get("name") == "shapes":
        world = shared_world(data)
        if cls.image_input == "regions" and image.get("source", "shapes") == "shapes":
            image.update(source="features", path=str(shapes_feature_store(world, cache_dir(cache), progress)))
    if cls.image_input == "pixels":
        if image.get("source") == "features":
            raise ValueError(f"data.image.source=features gives region features; {name} takes pixels")
        for key, field in (("size", "image_size"), ("patch_size", "patch_size")):
            value = getattr(config, field)
            if image.get(key) is not None and image[key] != value:
                raise ValueError(f"data.image.{key}={image[key]} conflicts with model.{field}={value}: set one of them "
                                 f"(or both to the same value)")
            image[key] = value
    elif image.get("source") != "features":
        pixels = ", ".join(f"model={n}" for n in MODELS.names() if MODELS.get(n).image_input == "pixels")
        raise ValueError(f"{name} is a region family: it takes region features, and data.image.source="
                         f"{image.get('source')} gives images; train a pixel family on them ({pixels}; init= a pre-training "
                         "run of it, if any), or extract region features (vlkit extract-features images=DIR "
                         "out=features.h5) and set data.image.source=features data.image.path=features.h5")
    source = build_image_source(image, world, data.get("on_error") or "raise")
    if init is None:
        config = dataclasses.replace(config, **data_sizes(cls, overrides, tokenizer, source))
    return Environment(data, world, tokenizer, source, config)
