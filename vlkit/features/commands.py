"""Entry points of ``vlkit extract-features`` and ``vlkit import-features`` (config: ``conf/``)."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")


def image_files(directory: str | Path) -> list[tuple[str, Path]]:
    """``(image_id, path)`` for the images of ``directory`` (sorted; the id is the file stem)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory}: images must be a directory")
    files = sorted(p for p in directory.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"{directory}: no images ({', '.join(IMAGE_SUFFIXES)})")
    seen: dict[str, Path] = {}
    for p in files:
        if p.stem in seen:
            raise ValueError(f"{directory}: {seen[p.stem].name} and {p.name} give the same image id {p.stem!r}")
        seen[p.stem] = p
    return list(seen.items())


def extract_features(cfg: DictConfig) -> int:
    from vlkit.features.detector import extract_features as run
    from vlkit.train.pipeline import set_threads

    set_threads(cfg.get("threads"))
    out = run(
        image_files(cfg.images), cfg.out, detector=cfg.detector, weights=cfg.weights, batch_size=cfg.batch_size,
        device=cfg.device, min_boxes=cfg.min_boxes, max_boxes=cfg.max_boxes, conf_th=cfg.conf_th,
        resume=cfg.resume, dtype=cfg.dtype, progress=cfg.progress, on_error=cfg.get("on_error", "raise"),
    )
    _summary(out)
    return 0


def import_features(cfg: DictConfig) -> int:
    from vlkit.features.importers import import_features as run
    from vlkit.train.pipeline import set_threads

    set_threads(cfg.get("threads"))
    out = run(cfg.src, cfg.format, cfg.out, resume=cfg.resume, dtype=cfg.dtype, image_sizes=cfg.image_sizes,
              progress=cfg.progress, on_error=cfg.get("on_error", "raise"))
    _summary(out)
    return 0


def _summary(path: str | Path) -> None:
    from vlkit.features.store import FeatureStore, skipped_path

    with FeatureStore(path) as store:
        print(
            f"{path}: {len(store)} images, feature_dim {store.feature_dim}, "
            f"soft labels {'yes (%d classes)' % store.num_classes if store.has_soft_labels else 'no'}"
        )
    skipped = skipped_path(path)
    if skipped.is_file():
        count = sum(1 for line in skipped.read_text(encoding="utf-8").splitlines() if line.strip())
        print(f"{skipped}: {count} images skipped (on_error=skip), each with its reason")
