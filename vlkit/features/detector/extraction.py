"""Region feature extraction: images -> the BUTD regions of a detector -> an h5 feature store."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from vlkit.features.detector.network import BottomUpDetector
from vlkit.features.detector.weights import load_detector
from vlkit.features.store import FeatureStoreWriter, skipped_path
from vlkit.validate import DataError, SkipLog, check_image_size, check_on_error, rgb_array


def extract_features(
    images: Iterable[tuple[str, Any]], out: str | os.PathLike, detector: str | BottomUpDetector = "shapes",
    weights: str | os.PathLike | None = None, batch_size: int = 8, device: str = "cpu",
    min_boxes: int | None = None, max_boxes: int | None = None, conf_th: float | None = None,
    resume: bool = True, dtype: str = "float16", progress: bool = True, total: int | None = None,
    on_error: str = "raise", bar: Any = None,
) -> Path:
    """Extract region features of ``(image_id, image)`` pairs into the h5 store ``out``.

    ``image`` is a PIL image, an RGB uint8 array or a path (opened only when needed, with
    `vlkit.validate.decode_image`: EXIF orientation applied, 16-bit / palette / alpha / CMYK images
    converted). Images already in the store (or in an interrupted run's completed shards) are skipped
    when ``resume`` is true. Batches group images of the same resized size, so batching never pads
    (features equal batch 1). Every batch is committed to the store's shards as soon as it is
    extracted, so a killed run loses at most the batch in flight.

    A bad image (unreadable, smaller than `vlkit.validate.MIN_IMAGE_SIDE` px, elongated beyond
    `vlkit.validate.MAX_ASPECT_RATIO`, or giving fewer than ``min_boxes`` regions) raises `DataError`
    naming it with ``on_error="raise"``; with ``"skip"`` it is left out, counted, logged and recorded
    with its reason in ``<out>.skipped.jsonl`` (`skipped_path`).

    ``bar``: an object with ``update(n)`` / ``close()`` counting the images done instead of a tqdm bar
    (`vlkit.features.distributed.SharedProgress` counts over the processes of a spread extraction).
    """
    from tqdm.auto import tqdm

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = detector if isinstance(detector, BottomUpDetector) else load_detector(detector, weights, device=device)
    model = model.to(device).eval()
    cfg = model.cfg
    sel = {
        "conf_th": cfg.conf_thresh if conf_th is None else conf_th,
        "min_boxes": cfg.min_boxes if min_boxes is None else min_boxes,
        "max_boxes": cfg.max_boxes if max_boxes is None else max_boxes,
    }
    provenance = {
        **model.provenance, **sel, "nms": cfg.test_nms, "min_size": cfg.min_size, "max_size": cfg.max_size,
        "input_format": cfg.input_format, "pixel_mean": list(cfg.pixel_mean), "pixel_std": list(cfg.pixel_std),
        "box_source": "RPN proposals kept by the BUTD rule",
    }
    if total is None and hasattr(images, "__len__"):
        total = len(images)  # type: ignore[arg-type]
    check_on_error(on_error, "on_error")
    skips = SkipLog(skipped_path(out)) if on_error == "skip" else None

    def refuse(image_id: str, err: DataError) -> None:
        if skips is None:
            raise err
        skips.add("image", image_id, str(err))

    with FeatureStoreWriter(out, provenance=provenance, resume=resume, dtype=dtype) as writer:
        if bar is None:
            bar = tqdm(total=total, desc=f"extract {Path(out).name}", unit="img", disable=not progress)
        pending: dict[tuple[int, int], list[tuple[str, np.ndarray]]] = {}

        def run(key: tuple[int, int]) -> None:
            batch = pending.pop(key)
            outs = model.extract([a for _, a in batch], conf_thresh=sel["conf_th"], min_boxes=sel["min_boxes"], max_boxes=sel["max_boxes"])
            for (image_id, arr), o in zip(batch, outs):
                try:
                    if len(o["boxes"]) < max(1, sel["min_boxes"]):
                        raise DataError(f"image {image_id!r} ({arr.shape[1]}x{arr.shape[0]} px, w x h): the detector "
                                        f"found {len(o['boxes'])} regions, fewer than min_boxes={sel['min_boxes']}")
                    writer.add(image_id, **o)
                except DataError as err:
                    refuse(image_id, err)
            writer.flush()  # commit the batch: a kill loses at most the next one
            bar.update(len(batch))

        for image_id, image in images:
            image_id = str(image_id)
            if image_id in writer.done_ids:
                bar.update(1)
                continue
            try:
                arr = rgb_array(image, image_id)
                check_image_size(image_id, *arr.shape[:2])
            except DataError as err:
                refuse(image_id, err)
                bar.update(1)
                continue
            h, w = arr.shape[:2]
            s = model.resize_scale(h, w)
            key = (round(h * s), round(w * s))
            pending.setdefault(key, []).append((image_id, arr))
            if len(pending[key]) >= batch_size:
                run(key)
            elif sum(map(len, pending.values())) >= 4 * batch_size:  # bound memory with many sizes
                run(max(pending, key=lambda k: len(pending[k])))
        for key in list(pending):
            run(key)
        bar.close()
    return Path(out)
