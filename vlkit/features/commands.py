"""Entry points of ``vlkit extract-features`` and ``vlkit import-features`` (config: ``conf/``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from vlkit.config import COUNT, FRACTION, SWITCH, plain as to_plain
from vlkit.features import importers
from vlkit.features.distributed import distributed_extraction, launch
from vlkit.features.store import FeatureStore, skipped_path
from vlkit.runtime import set_threads, shutdown
from vlkit.validate import IMAGE_SUFFIXES, image_folder


def image_files(directory: str | Path) -> list[tuple[str, Path]]:
    """``(image_id, path)`` for the images of ``directory`` and its subfolders (sorted; the id is the file stem),
    as the pixel families' image folders read them; files that are not read are counted and logged per reason."""
    folder = image_folder(directory)
    if not folder.images:
        raise FileNotFoundError(f"{directory}: no images ({', '.join(IMAGE_SUFFIXES)})"
                                + (f"; {folder.report()}" if folder.not_read else ""))
    return sorted(folder.images.items())


def _extraction_options(cfg: Any) -> dict[str, Any]:
    return dict(detector=cfg["detector"], weights=cfg["weights"], batch_size=cfg["batch_size"],
                min_boxes=cfg["min_boxes"], max_boxes=cfg["max_boxes"], conf_th=cfg["conf_th"], resume=cfg["resume"],
                dtype=cfg["dtype"], on_error=cfg.get("on_error", "raise"))


# The rules of the commands' own keys (`vlkit.config.Rule`), checked by the console before the command runs.
KEY_RULES = {
    "extract-features": {"processes": COUNT, "batch_size": COUNT, "min_boxes": COUNT, "max_boxes": COUNT,
                         "conf_th": FRACTION, "resume": SWITCH, "progress": SWITCH, "threads": COUNT},
    "import-features": {"resume": SWITCH, "progress": SWITCH, "threads": COUNT},
}

def extract_features(cfg: Any) -> int:
    """One process writes ``out`` (a file); ``processes=N`` (or a run under ``accelerate launch``) spreads the
    images over the processes, each writing its shard of the sharded store ``out`` (a directory)."""
    import os

    from vlkit.features.detector.domain import check_detector

    processes = int(cfg.get("processes") or 1)
    if processes < 1:
        raise ValueError(f"processes={processes}: use a positive number of processes")
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if int(os.environ.get("RANK", "0")) == 0:
        check_detector(image_files(cfg.images), cfg.detector)  # the shapes detector on other images: say so
    if processes > 1 and launched:
        raise ValueError(f"processes={processes} under a launcher that already started {os.environ['WORLD_SIZE']} "
                         "processes: leave processes=1 (the launcher decides the number)")
    if processes > 1 or launched:
        plain = to_plain(cfg)
        if launched:
            _extract_spread(plain)
        else:
            import torch

            cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
            launch(_extract_spread, (plain,), processes, cpu)
        if int(os.environ.get("RANK", "0")) == 0:
            _summary(cfg.out)
        return 0
    from vlkit.features.detector import extract_features as run

    set_threads(cfg.get("threads"))
    out = run(image_files(cfg.images), cfg.out, device=cfg.device, progress=cfg.progress, **_extraction_options(cfg))
    _summary(out)
    return 0


def _extract_spread(cfg: dict[str, Any]) -> None:
    """One process of a spread extraction (started by `vlkit.features.distributed.launch` or ``accelerate launch``)."""
    set_threads(cfg.get("threads"))
    try:
        distributed_extraction(image_files(cfg["images"]), cfg["out"], device=cfg["device"], progress=cfg["progress"],
                               **_extraction_options(cfg))
    except BaseException:
        shutdown(barrier=False)
        raise
    shutdown()


def import_features(cfg: Any) -> int:
    set_threads(cfg.get("threads"))
    out = importers.import_features(cfg.src, cfg.format, cfg.out, resume=cfg.resume, dtype=cfg.dtype, image_sizes=cfg.image_sizes,
              progress=cfg.progress, on_error=cfg.get("on_error", "raise"))
    _summary(out)
    return 0


def _summary(path: str | Path) -> None:
    with FeatureStore(path) as store:
        print(
            f"{path}: {len(store)} images, feature_dim {store.feature_dim}, "
            f"soft labels {'yes (%d classes)' % store.num_classes if store.has_soft_labels else 'no'}"
        )
    skipped = skipped_path(path)
    if skipped.is_file():
        count = sum(1 for line in skipped.read_text(encoding="utf-8").splitlines() if line.strip())
        print(f"{skipped}: {count} images skipped (on_error=skip), each with its reason")
