"""`VLProcessor`: what turns a user's images and texts into the `VLBatch` a model takes, and travels with it.

A processor holds a tokenizer, an image source and the `VLCollator`, resolved for one model family and preset
exactly as the commands resolve ``data.tokenizer`` and ``data.image`` (`vlkit.environment.prepare_environment`):
a folder of image files is read with the family's pixel transform, or, for a region family, through a
detector whose features are extracted once into a cached feature store; a feature store is read as is.

    processor = vlkit.build_processor("uniter/tiny", tokenizer="path/to/bert-vocab", images="my_images/")
    model = vlkit.build_model("uniter", preset="tiny", processor=processor)   # sized by the data
    batch = processor(images=["cat.png", "dog"], text=["a cat", "a dog"])
    model.save_pretrained("run/")            # the processor is written beside the weights
    model, processor = vlkit.load_model_and_processor("run/")
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from vlkit.data.collate import VLCollator
from vlkit.data.pairs import ImageTextPairs
from vlkit.data.tokenizers import TOKENIZER_DIR, run_tokenizer, save_tokenizer
from vlkit.environment import cache_dir as cache_root, prepare_environment
from vlkit.features.commands import image_files
from vlkit.models.base import MODELS, from_pretrained, model_name, split_model_config
from vlkit.runs import RUN_INFO, read_recorded_path, read_recorded_paths, record_path, record_paths, run_data, \
    write_record
from vlkit.types import VLBatch
from vlkit.validate import IMAGE_SUFFIXES, DataError, image_folder

PROCESSOR_NAME = "processor.json"


class VLProcessor:
    """Images (file names or ids) and texts -> `VLBatch`, for the model family and preset it was built for.

    ``environment``: the `vlkit.environment.Environment` it reads through (tokenizer, image source, the data
    config the commands take as ``data=``, the model config sized by the data); ``build``: the `build_processor`
    arguments it was built with (None for a run's processor), which rebuild it where its cached feature store is
    gone."""

    def __init__(self, family: str, environment: Any, build: Mapping[str, Any] | None = None):
        self.family, self.environment, self.build = family, environment, None if build is None else dict(build)
        self.collator = _collator(environment.tokenizer)

    @property
    def tokenizer(self) -> Any:
        return self.environment.tokenizer

    @property
    def image_source(self) -> Any:
        return self.environment.image_source

    @property
    def preset(self) -> str:
        return self.environment.model.preset

    @property
    def data_config(self) -> dict[str, Any]:
        """The ``data`` settings the commands take for this processor's tokenizer and images (``data.tokenizer``,
        ``data.max_len``, ``data.image``)."""
        data = self.environment.data
        return {"tokenizer": data["tokenizer"], "max_len": data["max_len"], "image": dict(data["image"])}

    def model_config(self, preset: str | None = None, **overrides: Any) -> Any:
        """The family's config of ``preset`` (default: the processor's) with ``overrides``, sized by the data as
        the commands size it (`vlkit.environment.data_sizes`: vocabulary, region feature and class sizes); a
        pixel model must read images at the processor's size."""
        model_cfg = {"name": self.family, "preset": preset or self.preset, **overrides}
        return prepare_environment(model_cfg, self.environment.data, (self.build or {}).get("cache_dir"),
                                   progress=False).model

    def image_id(self, image: str | os.PathLike) -> str:
        """The id of an image given by file name (``cat.png``, ``sub/cat.jpg``) or by id (``cat``)."""
        path = Path(image)
        return path.stem if path.suffix.lower() in IMAGE_SUFFIXES else str(image)

    def dataset(self, images: Sequence[Any], text: Sequence[str]) -> Any:
        """An `ImageTextPairs` of ``images[k]`` with ``text[k]`` (tokenised as the commands tokenise, up to
        ``data.max_len`` tokens), the examples a DataLoader with ``collate_fn=processor.collator`` batches."""
        if isinstance(text, str):
            text = [text]
        if isinstance(images, (str, os.PathLike)):
            images = [images]
        if len(images) != len(text):
            raise ValueError(f"processor: {len(images)} image(s) and {len(text)} text(s); give one text per image")
        records = [{"id": str(k), "image_id": self.image_id(image), "caption": caption}
                   for k, (image, caption) in enumerate(zip(images, text))]
        return ImageTextPairs(records, self.tokenizer, self.image_source, max_len=self.environment.data["max_len"])

    def __call__(self, images: Sequence[Any], text: Sequence[str]) -> VLBatch:
        """The `VLBatch` of ``images[k]`` with ``text[k]``; an unknown image or an empty text is an error naming it."""
        pairs = self.dataset(images, text)
        return self.collator([pairs[k] for k in range(len(pairs))])

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``processor.json`` (its data config, and the arguments it was built with, their paths as
        `vlkit.runs.record_paths` records them; the cache it used is the user's, not recorded) and the tokenizer
        (``tokenizer/``) into ``directory``, beside a model's weights."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_tokenizer(self.tokenizer, directory)
        data = record_paths({k: v for k, v in self.environment.data.items() if k != "tokenizer"}, directory)
        build = None
        if self.build is not None:
            build = {k: v for k, v in self.build.items() if k != "cache_dir"}
            build.update({k: record_path(build[k], directory) for k in ("images", "weights") if build.get(k)})
        write_record(directory / PROCESSOR_NAME, {"family": self.family, "preset": self.preset,
                                                  "tokenizer": TOKENIZER_DIR, "data": data, "build": build})
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, images: str | os.PathLike | None = None,
                        cache_dir: str | os.PathLike | None = None) -> "VLProcessor":
        """The processor `save_pretrained` wrote into ``directory`` (a model directory or a run's ``model/``), or
        that of a run of the commands (``run.json``: its tokenizer and images). Nothing is downloaded. The recorded
        paths are read by `vlkit.runs`' rule: inside the folder, in the user's cache, or recorded by this user's
        vlkit; ``images``: the image folder or feature store to read instead of the recorded one (a model from
        someone else's folder needs it); ``cache_dir``: the cache for features extracted again (default
        ``$VLKIT_CACHE`` or ~/.cache/vlkit; a recorded one is never used)."""
        directory = Path(directory)
        for folder in (directory, directory / "model"):
            if (folder / PROCESSOR_NAME).is_file():
                return _read(folder / PROCESSOR_NAME, images, cache_dir)
        if (directory / RUN_INFO).is_file() or (directory.parent / RUN_INFO).is_file():
            return _from_run(directory if (directory / RUN_INFO).is_file() else directory.parent, images, cache_dir)
        raise FileNotFoundError(f"{directory} holds no {PROCESSOR_NAME} and no run.json: save a model built with "
                                "processor= (model.save_pretrained) or give the output_dir of a run")

    def __repr__(self) -> str:
        image = self.environment.data["image"]
        return (f"VLProcessor({self.family}/{self.preset}, tokenizer={self.environment.data['tokenizer']!r}, "
                f"images={image.get('source')}:{image.get('path')})")


def _collator(tokenizer: Any) -> Any:
    return VLCollator(pad_token_id=tokenizer.pad_token_id or 0)


def build_processor(family: str, tokenizer: str | os.PathLike | None = None, images: str | os.PathLike | None = None,
                    *, preset: str | None = None, max_len: int = 62, detector: str = "shapes",
                    weights: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
                    image: Mapping[str, Any] | None = None) -> VLProcessor:
    """A `VLProcessor` for ``family`` (``uniter``, or a preset name as `vlkit.list_models` gives it: ``uniter/tiny``).

    ``tokenizer``: a tokenizer folder or name as ``data.tokenizer`` takes it (None: the family's official one).
    ``images``: a folder of image files (ids are the file stems) or a feature store (``.h5``). A pixel family reads
    the folder with its transform; a region family reads the regions ``detector`` (``shapes``: the shipped shapes
    detector; ``butd`` with ``weights``) finds in it, extracted on the first build into ``cache_dir`` (default
    ``$VLKIT_CACHE`` or ~/.cache/vlkit) and reused while the folder is unchanged. ``image``: further
    ``data.image`` settings (``num_bb``, ``transform`` ...)."""
    name, named_preset = model_name(family)
    if preset is not None and named_preset is not None and preset != named_preset:
        raise ValueError(f"build_processor: {family!r} names preset {named_preset!r}, not preset={preset!r}")
    cls = MODELS.get(name)
    for key, value in (("images", images), ("tokenizer", tokenizer), ("weights", weights), ("cache_dir", cache_dir)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"build_processor({key}={value!r}): give a path (str or os.PathLike)")
    if images is None:
        raise ValueError("build_processor: images= names a folder of image files or a feature store (.h5)")
    build = {"images": _absolute(images), "max_len": max_len, "detector": detector, "weights": _absolute(weights),
             "image": dict(image or {}), "cache_dir": _absolute(cache_dir)}
    block = {**_image_block(cls.image_input, Path(build["images"]), detector, weights, cache_dir), **dict(image or {})}
    data = {"name": None, "tokenizer": None if tokenizer is None else str(tokenizer), "max_len": max_len,
            "on_error": "raise", "image": block}
    env = prepare_environment({"name": name, "preset": preset or named_preset}, data, build["cache_dir"],
                              progress=False)
    return VLProcessor(name, env, build)


def _absolute(path: str | os.PathLike | None) -> str | None:
    return None if path is None else str(Path(path).expanduser().resolve())


def _image_block(image_input: str, images: Path, detector: str, weights: Any, cache_dir: Any) -> dict[str, Any]:
    """The ``data.image`` block of ``images`` for a family taking ``image_input``."""
    if not images.exists():
        raise FileNotFoundError(f"images={images}: no such folder or feature store")
    if images.is_file() or (images / "index.json").is_file() or any(images.glob("*.h5")):
        return {"source": "features", "path": str(images)}  # a feature store, one file or sharded
    if not image_folder(images).images:
        raise DataError(f"images={images} is a folder that holds no image files ({', '.join(IMAGE_SUFFIXES)}) and is no "
                        "feature store (no .h5 file, no index.json): name a folder of images or a feature store")
    if image_input == "pixels":
        return {"source": "folder", "path": str(images), "transform": "clip"}
    return {"source": "features", "path": str(folder_features(images, detector, weights, cache_dir))}


def folder_features(folder: Path, detector: str = "shapes", weights: Any = None, cache_dir: Any = None) -> Path:
    """The feature store of ``detector``'s regions of every image of ``folder``: extracted once into the cache
    (`vlkit.features.detector.extract_features`, as ``vlkit extract-features`` does), under a name that changes
    when a file of the folder does (name, size or modification time)."""
    from vlkit.features.detector import extract_features

    files = image_files(folder)
    digest = hashlib.sha256(json.dumps([str(folder.resolve()), detector, str(weights), *[
        (image_id, path.stat().st_size, path.stat().st_mtime_ns) for image_id, path in files]]).encode()).hexdigest()
    store = cache_root(cache_dir) / "folders" / f"{folder.name}-{detector}-{digest[:16]}.h5"
    if not store.exists():
        from vlkit.features.detector.domain import check_detector

        check_detector(files, detector)  # the shapes detector on other images: say so
        store.parent.mkdir(parents=True, exist_ok=True)
        partial = store.with_name(f".{store.name}.partial")
        extract_features(files, partial, detector=detector, weights=weights, progress=False)
        os.replace(partial, store)
    return store


def _read(path: Path, images: Any = None, cache_dir: Any = None) -> VLProcessor:
    """The processor of a ``processor.json``: built again from its arguments (a folder's features come from the
    user's cache, extracted again when gone), else from its data config; its paths read by `vlkit.runs`' rule, the
    recorded ``build.cache_dir`` (older files) ignored."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        family, preset, data, build = record["family"], record["preset"], record["data"], record["build"]
        tokenizer = read_recorded_path(str(record["tokenizer"]), path, "tokenizer", "a model folder holding its "
                                       "tokenizer/ (save it again with model.save_pretrained)")
        if not (build is None or isinstance(build, dict)) or not isinstance(data, dict):
            raise TypeError("data must be an object, build an object or null")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a vlkit processor ({type(err).__name__}: {err})") from err
    if build is not None:
        build = {**build, "cache_dir": cache_dir}
        build["images"] = images if images is not None else read_recorded_path(
            str(build.get("images")), path, "build.images", "images= (load_model_and_processor(folder, images=...))",
            cache_dir)
        if build.get("weights"):
            build["weights"] = read_recorded_path(str(build["weights"]), path, "build.weights", "weights= to "
                                                  "build_processor", cache_dir)
        return build_processor(family, tokenizer=tokenizer, preset=preset, **build)
    data = read_recorded_paths(data, path, {"data.image.path": images}, cache_dir, _PASSED)
    return _from_data({"name": family, "preset": preset}, {**data, "tokenizer": tokenizer}, cache_dir=cache_dir)


def _from_data(model_cfg: Mapping[str, Any], data: Mapping[str, Any], init: Any = None,
               cache_dir: Any = None) -> VLProcessor:
    env = prepare_environment(model_cfg, data, cache_dir, progress=False, init=init)
    return VLProcessor(split_model_config(model_cfg)[0], env)


def _from_run(directory: Path, images: Any = None, cache_dir: Any = None) -> VLProcessor:
    """The processor of a run's recorded data (its tokenizer folder, ``data.max_len`` and ``data.image``, its paths
    read by `vlkit.runs`' rule)."""
    from vlkit.train.preflight import read_init  # start-up cost: only a run's folder loads vlkit.train (accelerate)

    data = run_data(directory, {"data.image.path": images}, cache_dir, _PASSED)
    _, model_cfg = read_init(directory)
    return _from_data(model_cfg, {**data, "tokenizer": run_tokenizer(directory) or data.get("tokenizer")}, directory,
                      cache_dir)


# how a caller of `load_model_and_processor` passes a recorded path again
_PASSED = {"data.image.path": "images= (load_model_and_processor(folder, images=...))"}


def load_model_and_processor(directory: str | os.PathLike, images: str | os.PathLike | None = None,
                             cache_dir: str | os.PathLike | None = None) -> tuple[Any, VLProcessor]:
    """(model, processor) of a directory `save_pretrained` wrote for a model built with ``processor=``, or of a
    run's output_dir; the model keeps its processor (``model.processor``), so saving it again writes both.
    ``images`` and ``cache_dir``: as `VLProcessor.from_pretrained` takes them (a model folder from someone else
    never chooses what vlkit reads outside it or where it writes)."""
    model = from_pretrained(directory)
    model.processor = VLProcessor.from_pretrained(directory, images, cache_dir)
    return model, model.processor


__all__ = ["PROCESSOR_NAME", "VLProcessor", "build_processor", "folder_features", "load_model_and_processor"]
