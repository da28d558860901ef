"""Image-text pair shards: Parquet files (pyarrow) that `vlkit.data.stream.StreamedPairs` reads as a stream.

A shard directory holds ``pairs-<k>.parquet`` files of ``shard_size`` rows each (the last one shorter),
row groups of ``row_group_size`` rows, columns ``id``, ``image_id``, ``caption`` and, for pixel families,
``image`` (the encoded image file's bytes, PNG for the shapes world), plus ``shards.json``: the format,
the source, the columns and every shard's file name and row count, written last, so a directory without
it is not a pair-shard directory. The whole directory is written beside ``out`` and renamed into place
when complete (atomic); an existing ``out`` is replaced only with ``overwrite=true``.

``vlkit make-shards source=jsonl|cc|sbu|shapes out=DIR ...`` writes them from the readers of
`vlkit.data.formats` (``images=DIR`` adds the image bytes of an image folder) or from the shapes world.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from vlkit.config import COUNT, SWITCH
from vlkit.data import formats
from vlkit.data.images import FolderImages
from vlkit.data.shapes import ShapesWorld
from vlkit.io import atomic_directory, refuse_overwrite

MANIFEST = "shards.json"
FORMAT = "vlkit-pair-shards"
FORMAT_VERSION = 1


class ShardError(ValueError):
    """A pair-shard directory that cannot be read as asked (the message names the file)."""


def _schema(with_image: bool):
    import pyarrow as pa

    fields = [("id", pa.string()), ("image_id", pa.string()), ("caption", pa.string())]
    return pa.schema(fields + ([("image", pa.binary())] if with_image else []))


def write_shards(records: Iterable[dict[str, Any]], out: str | os.PathLike, shard_size: int = 10000,
                 row_group_size: int = 1000, image_bytes: Callable[[str], bytes] | None = None,
                 source: str = "", overwrite: bool = False) -> Path:
    """Write ``records`` (dicts with ``id``, ``image_id``, ``caption``) as Parquet shards in ``out``;
    ``image_bytes(image_id)`` adds each image's encoded bytes. Records are consumed one shard at a time
    (memory: one shard). The shards are written into a new folder beside ``out`` that replaces it only
    when complete: an existing ``out`` is refused unless ``overwrite``, and kept whole if writing fails.
    Returns ``out``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if shard_size < 1 or row_group_size < 1:
        raise ValueError(f"shard_size={shard_size} and row_group_size={row_group_size} must be positive")
    out = Path(out)
    refuse_overwrite(out, overwrite)
    schema = _schema(image_bytes is not None)
    shards: list[dict[str, Any]] = []
    with atomic_directory(out) as tmp:

        def flush(rows: list[dict[str, Any]]) -> None:
            name = f"pairs-{len(shards):05d}.parquet"
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp / name, row_group_size=row_group_size)
            shards.append({"file": name, "rows": len(rows)})

        rows: list[dict[str, Any]] = []
        for n, rec in enumerate(records):
            try:
                row = {"id": str(rec["id"]), "image_id": str(rec["image_id"]), "caption": str(rec["caption"])}
            except KeyError as e:
                raise ShardError(f"record {n} ({rec.get('id', '?')!r}) lacks {e.args[0]!r}; pair records need id, "
                                 "image_id and caption") from None
            if image_bytes is not None:
                row["image"] = image_bytes(row["image_id"])
            rows.append(row)
            if len(rows) == shard_size:
                flush(rows)
                rows = []
        if rows:
            flush(rows)
        if not shards:
            raise ShardError(f"{out}: no records to write" + (" (the existing shards are kept)" if out.exists() else ""))
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "source": source, "columns": schema.names,
                    "rows": sum(s["rows"] for s in shards), "shards": shards}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return out


def open_parquet(file: str | os.PathLike):
    """``pyarrow.parquet.ParquetFile(file)``; a truncated or foreign file is a `ShardError` naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(file)
    except (pa.ArrowException, OSError) as e:
        raise ShardError(f"{file}: not a readable Parquet shard, truncated or corrupt ({type(e).__name__}: {e})") from e


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """``shards.json`` of a shard directory, checked against its files (present, of the recorded row count)."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        found = len(list(directory.glob("pairs-*.parquet"))) if directory.is_dir() else 0
        raise ShardError(f"{path} is missing: {directory} is not a finished pair-shard directory "
                         f"({found} shard files there); write it with `vlkit make-shards out={directory}`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}, expected {FORMAT!r}")
        shards = manifest["shards"]
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ShardError(f"{path}: not a vlkit pair-shard manifest ({type(e).__name__}: {e})") from e
    for shard in shards:
        file = directory / shard["file"]
        if not file.is_file():
            raise ShardError(f"{file}: listed in {path} but missing")
        rows = open_parquet(file).metadata.num_rows
        if rows != shard["rows"]:
            raise ShardError(f"{file}: {rows} rows, {path} says {shard['rows']}")
    return manifest


# --------------------------------------------------------------------------------------------- sources


def shapes_records(world: Any, splits: Iterable[str] = ("train",)) -> Iterator[dict[str, Any]]:
    """The shapes world's captions (5 per image) as pair records, image by image (nothing held in memory)."""
    for split in splits:
        for i in world.indices(split):
            for k, caption in enumerate(world.captions(i)):
                yield {"id": f"{i}#{k}", "image_id": world.image_id(i), "caption": caption}


def shapes_png(world: Any) -> Callable[[str], bytes]:
    """``image_id`` -> the PNG bytes of the shapes world's image (the last few encoded once: an image's
    captions come one after the other)."""
    from functools import lru_cache

    return lru_cache(maxsize=8)(lambda image_id: world.png_bytes(world.index_of(image_id)))


def _folder_bytes(folder: str | os.PathLike) -> Callable[[str], bytes]:
    images = FolderImages(folder)
    images.ids()

    def read(image_id: str) -> bytes:
        if image_id not in images._index:  # noqa: SLF001 - the folder's own index
            raise KeyError(f"image {image_id!r} is not in {folder}")
        return images._index[image_id].read_bytes()  # noqa: SLF001

    return read


# The rules of the command's own keys (`vlkit.config.Rule`), checked by the console before the command runs.
KEY_RULES = {"make-shards": {"shard_size": COUNT, "row_group_size": COUNT, "overwrite": SWITCH, "num_images": COUNT,
                             "image_size": COUNT}}

def make_shards_main(cfg: Any) -> int:
    """``vlkit make-shards``: see ``conf/make-shards.yaml``."""
    source = cfg.source
    image_bytes = _folder_bytes(cfg.images) if cfg.get("images") else None
    if source == "shapes":
        world = ShapesWorld(seed=cfg.seed, num_images=cfg.num_images, image_size=cfg.image_size)
        split = cfg.get("split") or "train"
        records = shapes_records(world, [split] if isinstance(split, str) else list(split))
        if cfg.get("pixels", True) and image_bytes is None:
            image_bytes = shapes_png(world)
    elif source == "jsonl":
        records = formats.read_caption_jsonl(cfg.path)
    elif source == "cc":
        records = formats.read_cc_tsv(cfg.path, cfg.get("image_id") or "index",
                                      tuple(cfg.get("columns") or ("caption", "url")))
    elif source == "sbu":
        records = formats.read_sbu(cfg.captions, cfg.urls, cfg.get("image_id") or "index")
    else:
        raise ValueError(f"unknown make-shards source={source!r}; use jsonl, cc, sbu or shapes")
    out = write_shards(records, cfg.out, cfg.shard_size, cfg.row_group_size, image_bytes, source=source,
                       overwrite=bool(cfg.get("overwrite")))
    manifest = read_manifest(out)
    print(f"{out}: {manifest['rows']} pairs in {len(manifest['shards'])} shards"
          f"{' with image bytes' if 'image' in manifest['columns'] else ''}")
    return 0


__all__ = ["MANIFEST", "ShardError", "make_shards_main", "open_parquet", "read_manifest", "shapes_png", "shapes_records",
           "write_shards"]
