"""Writing the shapes world to disk (`vlkit make-shapes`): PNG images and every annotation file in its
official format, resumable and checked by sha256."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from vlkit.config import COUNT, NATURAL
from vlkit.data.shapes.language import shapes_vocab
from vlkit.data.shapes.scenes import ATTRIBUTES, OBJECT_CLASSES, SPLITS
from vlkit.io import atomic_path, atomic_write_text, sha256_file

if TYPE_CHECKING:
    from vlkit.data.shapes import ShapesWorld

FILES = {
    "image": "images/{image_id}.png",
    "karpathy": "dataset_shapes.json",
    "captions": "captions.jsonl",
    "vqa_questions": "v2_OpenEnded_mscoco_{split}_questions.json",
    "vqa_annotations": "v2_mscoco_{split}_annotations.json",
    "nlvr2": "{split}.json",
    "refs": "refs(unc).json",
    "instances": "instances.json",
    "snli_ve": "snli_ve_{split}.jsonl",
    "boxes": "boxes.json",
    "vocab": "vocab.txt",
    "manifest": "manifest.json",
}
"""File names `write_shapes` uses, relative to its output folder (``{split}`` in train/val/test)."""

_MANIFEST_FORMAT = "vlkit-shapes/1"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _jsonl_bytes(records: Iterable[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _annotation_files(world: ShapesWorld) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Every annotation file of the world (relative path -> bytes) and the manifest counts."""
    n = world.num_images
    karpathy, captions, boxes, refs = [], [], [], []
    instances = {"images": [], "annotations": [],
                 "categories": [{"id": k, "name": name, "supercategory": "shape"}
                                for k, name in enumerate(OBJECT_CLASSES) if k > 0]}
    by_split: dict[str, dict[str, list]] = {s: {"questions": [], "annotations": [], "nlvr2": [], "snli_ve": []}
                                            for s in SPLITS}
    for i in range(n):
        scene, split, image_id = world.scene(i), world.split(i), world.image_id(i)
        file_name = Path(FILES["image"].format(image_id=image_id)).name
        caps = world.captions(i)
        karpathy.append({
            "filepath": "images", "filename": file_name, "imgid": i, "cocoid": i, "split": split,
            "sentids": [i * 5 + k for k in range(len(caps))],
            "sentences": [{"tokens": re.findall(r"[a-z0-9]+", c.lower()), "raw": c, "imgid": i, "sentid": i * 5 + k}
                          for k, c in enumerate(caps)],
        })
        captions += [{"image_id": image_id, "caption": c} for c in caps]
        instances["images"].append({"id": i, "file_name": file_name, "width": scene.width, "height": scene.height})
        for k, o in enumerate(scene.objects):
            x0, y0, x1, y1 = o.box
            instances["annotations"].append({
                "id": i * 10 + k, "image_id": i, "category_id": o.class_id, "bbox": [x0, y0, x1 - x0, y1 - y0],
                "area": (x1 - x0) * (y1 - y0), "iscrowd": 0, "attribute_ids": list(o.attribute_ids)})
        boxes.append({"image_id": image_id, "file_name": file_name, "width": scene.width, "height": scene.height,
                      "split": split, "boxes": [list(o.box) for o in scene.objects],
                      "class_ids": [o.class_id for o in scene.objects],
                      "attribute_ids": [list(o.attribute_ids) for o in scene.objects]})
        for q in world.vqa(i):
            by_split[split]["questions"].append({k: q[k] for k in ("image_id", "question", "question_id")})
            by_split[split]["annotations"].append({k: q[k] for k in (
                "question_type", "multiple_choice_answer", "answers", "image_id", "answer_type", "question_id")})
        refs += [{k: v for k, v in r.items() if k not in ("object_index", "bbox")} for r in world.refexps(i)]
        by_split[split]["nlvr2"] += world.nlvr2(i)
        by_split[split]["snli_ve"] += world.snli_ve(i)

    files = {
        FILES["karpathy"]: _json_bytes({"images": karpathy, "dataset": "shapes"}),
        FILES["captions"]: _jsonl_bytes(captions),
        FILES["refs"]: _json_bytes(refs),
        FILES["instances"]: _json_bytes(instances),
        FILES["boxes"]: _json_bytes({"classes": list(OBJECT_CLASSES), "attributes": list(ATTRIBUTES), "images": boxes}),
        FILES["vocab"]: ("\n".join(shapes_vocab()) + "\n").encode(),
    }
    for split, parts in by_split.items():
        info = {"description": f"vlkit shapes world, seed {world.seed}", "version": _MANIFEST_FORMAT}
        files[FILES["vqa_questions"].format(split=split)] = _json_bytes({
            "info": info, "task_type": "Open-Ended", "data_type": "shapes", "data_subtype": split, "license": {},
            "questions": parts["questions"]})
        files[FILES["vqa_annotations"].format(split=split)] = _json_bytes({
            "info": info, "data_type": "shapes", "data_subtype": split, "license": {},
            "annotations": parts["annotations"]})
        files[FILES["nlvr2"].format(split=split)] = _jsonl_bytes(parts["nlvr2"])
        files[FILES["snli_ve"].format(split=split)] = _jsonl_bytes(parts["snli_ve"])
    counts = {
        "images": {s: len(world.indices(s)) for s in SPLITS}, "captions": len(captions),
        "objects": len(instances["annotations"]), "refs": len(refs),
        "questions": {s: len(p["questions"]) for s, p in by_split.items()},
        "nlvr2": {s: len(p["nlvr2"]) for s, p in by_split.items()},
        "snli_ve": {s: len(p["snli_ve"]) for s, p in by_split.items()},
    }
    return files, counts


def _read_manifest(path: Path, params: dict) -> dict:
    """An existing manifest written with the same ``params`` ({} if none)."""
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text())
        old_params, files = manifest["params"], manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: unreadable shapes manifest ({e}); delete it to regenerate the folder") from e
    if old_params != params or not isinstance(files, dict):
        raise ValueError(f"{path}: this folder holds a shapes world with {old_params}, not {params}; "
                         "choose another out= or delete the folder")
    return manifest


def write_shapes(world: ShapesWorld, out: str | Path, flush_every: int = 256,
                 progress: Callable[[Iterable], Iterable] | None = None) -> dict:
    """Write images and every annotation file of ``world`` under ``out`` (names in `FILES`).

    Each file is written atomically and recorded with its sha256 in ``manifest.json`` (flushed
    every ``flush_every`` images); a re-run skips every file whose bytes match the manifest.
    Returns the manifest.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / FILES["manifest"]
    params = {"seed": world.seed, "num_images": world.num_images, "image_size": world.image_size,
              "split_sizes": list(world.split_sizes)}
    previous = _read_manifest(manifest_path, params)
    recorded: dict[str, str] = dict(previous.get("files", {}))
    files: dict[str, str] = {}

    def complete(rel: str, digest: str | None = None) -> bool:
        path = out / rel
        want = recorded.get(rel) if digest is None else digest
        return want is not None and recorded.get(rel) == want and path.is_file() and sha256_file(path) == want

    def save(rel: str, data: bytes) -> None:
        digest = _sha256(data)
        if not complete(rel, digest):
            with atomic_path(out / rel) as tmp:
                tmp.write_bytes(data)
        files[rel] = digest

    def flush(counts: dict | None = None) -> dict:
        manifest = {"format": _MANIFEST_FORMAT, "params": params, "complete": counts is not None,
                    "counts": counts or {}, "files": {**recorded, **files}}
        atomic_write_text(manifest_path, json.dumps(manifest, indent=1, sort_keys=True))
        return manifest

    if previous.get("complete") and all(complete(rel) for rel in recorded):
        return previous
    indices = range(world.num_images)
    for done, i in enumerate(progress(indices) if progress else indices, start=1):
        rel = FILES["image"].format(image_id=world.image_id(i))
        if complete(rel):
            files[rel] = recorded[rel]
        else:
            save(rel, world.png_bytes(i))
        if done % flush_every == 0:
            flush()
    annotations, counts = _annotation_files(world)
    for rel, data in annotations.items():
        save(rel, data)
    recorded = {}  # everything is now in `files`; drop entries of files this world no longer has
    return flush(counts)


# The rules of the command's own keys (`vlkit.config.Rule`), checked by the console before the command runs.
KEY_RULES = {"make-shapes": {"num_images": COUNT, "image_size": COUNT, "val_images": NATURAL, "test_images": NATURAL,
                             "eval_rounds": COUNT, "train_rounds": COUNT}}

def make_shapes_main(cfg) -> None:
    """``vlkit make-shapes out=DIR num_images=N seed=S [image_size=128] [val_images=V test_images=T]
    [eval_rounds=R] [train_rounds=R]``."""
    from tqdm import tqdm

    from vlkit.data.shapes import ShapesWorld  # the package's __init__ defines it, and imports this module first

    out = Path(cfg.out)
    blocker = next((p for p in (out, *out.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise NotADirectoryError(f"out={out}: {blocker} is a file, not a folder; name the folder to write")
    world = ShapesWorld.from_cfg(cfg)
    manifest = write_shapes(world, cfg.out, progress=lambda it: tqdm(it, desc="shapes images", unit="img"))
    c = manifest["counts"]
    print(f"wrote {world!r} to {cfg.out}: {sum(c['images'].values())} images, {c['captions']} captions, "
          f"{sum(c['questions'].values())} questions, {c['refs']} refs, {sum(c['nlvr2'].values())} NLVR2 "
          f"statements, {sum(c['snli_ve'].values())} SNLI-VE hypotheses")
