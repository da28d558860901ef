"""Readers of the dataset formats users really have, to plain records (lists of dicts).

Every record has a string ``id`` and a string ``image_id`` (the key of the image in a feature
store or the file stem in an image folder). Integer-id formats (COCO, VQA, RefCOCO) turn their
ids into strings with ``image_id_format`` (``"{}"`` by default; e.g. ``"COCO_train2014_{:012d}"``).
Errors name the file and the line, record or key at fault (`FormatError`).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from vlkit.io import safe_pickle_load

PathLike = str | os.PathLike
VE_LABELS = ("entailment", "neutral", "contradiction")


class FormatError(ValueError):
    """A file that does not follow its format; the message names the file and the record at fault."""


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------
def _decode(data: bytes, path: PathLike, first_line: int = 1) -> str:
    """``data`` as UTF-8 (a leading BOM dropped); bytes that are not UTF-8 raise `FormatError` naming the
    file, line and column."""
    try:
        return data.decode("utf-8-sig" if first_line == 1 else "utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise FormatError(f"{path}:{line}: not UTF-8 text (byte {data[e.start:e.start + 1]!r} at column {column}); "
                          "re-encode the file as UTF-8") from e


def _read_text(path: PathLike) -> str:
    with open(path, "rb") as f:
        return _decode(f.read(), path)


def _load_json(path: PathLike) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise FormatError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from e


def _iter_jsonl(path: PathLike) -> Iterator[tuple[str, dict]]:
    """(``"file:line"``, record) for every non-blank line of a JSON-lines file."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = _decode(raw, path, lineno)
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise FormatError(f"{where}: not valid JSON ({e.msg})") from e
            if not isinstance(rec, dict):
                raise FormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            yield where, rec


def _get(rec: Any, key: str, where: str) -> Any:
    try:
        return rec[key]
    except (KeyError, TypeError, IndexError):
        raise FormatError(f"{where}: missing key {key!r}") from None


def _get_list(obj: Any, key: str, where: str) -> list:
    value = _get(obj, key, where)
    if not isinstance(value, list):
        raise FormatError(f"{where}: {key!r} must be a list, got {type(value).__name__}")
    return value


def _text(rec: Any, key: str, where: str) -> str:
    value = _get(rec, key, where)
    if not isinstance(value, str) or not value.strip():
        raise FormatError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value.strip()


def _format_id(value: Any, image_id_format: str, where: str) -> str:
    try:
        return image_id_format.format(int(value)) if image_id_format != "{}" else str(value)
    except (ValueError, TypeError) as e:
        raise FormatError(f"{where}: cannot format image id {value!r} with {image_id_format!r} ({e})") from e


def _splits(splits: str | Iterable[str] | None) -> set[str] | None:
    return None if splits is None else {splits} if isinstance(splits, str) else set(splits)


def url_image_id(index: int, url: str, mode: str) -> str:
    """Image id of a web-crawled pair: its row ``index`` (``mode="index"``) or the first 16 hex
    digits of the sha1 of its URL (``mode="hash"``, stable when rows are filtered or reordered)."""
    if mode == "index":
        return str(index)
    if mode == "hash":
        return hashlib.sha1(url.encode()).hexdigest()[:16]
    raise ValueError(f"unknown image id mode {mode!r}; use 'index' or 'hash'")


# --------------------------------------------------------------------------------------------
# Image-text pairs
# --------------------------------------------------------------------------------------------
def _karpathy_images(path: PathLike, splits, image_id: str,
                     data: Any = None) -> Iterator[tuple[str, dict, str, str, str]]:
    """(where, image entry, image id, file, split) of a Karpathy json (``data``: its content, if read), restricted
    to ``splits``."""
    data = _load_json(path) if data is None else data
    wanted = _splits(splits)
    for k, img in enumerate(_get_list(data, "images", str(path))):
        where = f"{path}: images[{k}]"
        split = _get(img, "split", where)
        if wanted is not None and split not in wanted:
            continue
        filename = _get(img, "filename", where)
        file = f"{img['filepath']}/{filename}" if img.get("filepath") else filename
        if image_id == "stem":
            iid = Path(filename).stem
        elif image_id in ("cocoid", "imgid"):
            iid = str(_get(img, image_id, where))
        else:
            raise ValueError(f"unknown Karpathy image id {image_id!r}; use 'stem', 'cocoid' or 'imgid'")
        yield where, img, iid, file, split


def read_karpathy(path: PathLike, splits: str | Iterable[str] | None = None, image_id: str = "stem",
                  data: Any = None) -> list[dict]:
    """COCO / Flickr30k Karpathy json (``dataset_coco.json``): one record per sentence
    ``{id (sentid), image_id, caption, file, split}``. ``image_id`` is the file stem by default
    (or ``"cocoid"`` / ``"imgid"``); ``splits`` e.g. ``("train", "restval")``, None for all."""
    out = []
    for where, img, iid, file, split in _karpathy_images(path, splits, image_id, data):
        for s, sent in enumerate(_get_list(img, "sentences", where)):
            w = f"{where}.sentences[{s}]"
            out.append({"id": str(_get(sent, "sentid", w)), "image_id": iid, "caption": _text(sent, "raw", w),
                        "file": file, "split": split})
    return out


def read_coco_captions(path: PathLike, image_id: str = "stem", data: Any = None) -> list[dict]:
    """COCO's own caption file (``captions_train2014.json``: ``{images: [{id, file_name, ...}], annotations:
    [{image_id, id, caption}]}``): one record per annotation ``{id, image_id, caption, file}`` in annotation
    order. ``image_id`` is the file stem (``COCO_train2014_000000391895``, as Karpathy's ``stem``) or
    ``"cocoid"`` (the integer id, as Karpathy's ``cocoid``)."""
    if image_id not in ("stem", "cocoid"):
        raise ValueError(f"unknown image id {image_id!r} for COCO's own caption file {path}; use 'stem' or 'cocoid'")
    data = _load_json(path) if data is None else data
    files = {}
    for k, img in enumerate(_get_list(data, "images", str(path))):
        where = f"{path}: images[{k}]"
        files[_get(img, "id", where)] = str(_get(img, "file_name", where))
    out = []
    for k, ann in enumerate(_get_list(data, "annotations", str(path))):
        where = f"{path}: annotations[{k}]"
        cocoid = _get(ann, "image_id", where)
        if cocoid not in files:
            raise FormatError(f"{where}: image_id {cocoid!r} is not in the file's images")
        iid = Path(files[cocoid]).stem if image_id == "stem" else str(cocoid)
        out.append({"id": str(_get(ann, "id", where)), "image_id": iid, "caption": _text(ann, "caption", where),
                    "file": files[cocoid]})
    return out


def read_caption_json(path: PathLike, splits: str | Iterable[str] | None = None, image_id: str = "stem") -> list[dict]:
    """Captions of either COCO's own file (``captions_*.json``, `read_coco_captions`: the file is one split, so
    ``splits`` does not apply) or a Karpathy json (``dataset_coco.json`` / ``dataset_flickr30k.json``,
    `read_karpathy`), told apart by their keys."""
    data = _load_json(path)
    if isinstance(data, dict) and "annotations" in data:
        return read_coco_captions(path, image_id, data)
    if isinstance(data, dict) and "images" in data:
        return read_karpathy(path, splits, image_id, data)
    raise FormatError(f"{path}: neither COCO's captions_*.json ({{images, annotations}}) nor a Karpathy json "
                      f"({{images: [{{split, filename, sentences}}]}}); its top level has "
                      f"{sorted(data) if isinstance(data, dict) else type(data).__name__}")


def read_karpathy_retrieval(path: PathLike, split: str | Iterable[str], image_id: str = "stem") -> list[dict]:
    """The images of a Karpathy split with their captions: ``{image_id, file, split, captions, caption_ids}``."""
    out = []
    for where, img, iid, file, s in _karpathy_images(path, split, image_id):
        sents = _get_list(img, "sentences", where)
        if not sents:
            raise FormatError(f"{where}: image {iid!r} has no sentences")
        out.append({"image_id": iid, "file": file, "split": s,
                    "captions": [_text(x, "raw", f"{where}.sentences[{k}]") for k, x in enumerate(sents)],
                    "caption_ids": [str(_get(x, "sentid", f"{where}.sentences[{k}]")) for k, x in enumerate(sents)]})
    return out


def read_caption_jsonl(path: PathLike) -> list[dict]:
    """Any JSON lines of ``{image_id, caption}`` (an ``id`` is kept, else ``"<image_id>#<k>"``,
    k counting that image's captions)."""
    out, seen = [], {}
    for where, rec in _iter_jsonl(path):
        iid = str(_get(rec, "image_id", where))
        k = seen[iid] = seen.get(iid, -1) + 1
        out.append({"id": str(rec.get("id", f"{iid}#{k}")), "image_id": iid, "caption": _text(rec, "caption", where)})
    return out


def _read_lines(path: PathLike) -> list[str]:
    lines = [line.rstrip("\r") for line in _read_text(path).split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def read_cc_tsv(path: PathLike, image_id: str = "index", columns: Sequence[str] = ("caption", "url")) -> list[dict]:
    """Conceptual Captions tsv (``caption<TAB>url`` per line as Google ships it, no header; CC12M's order is
    ``columns=("url", "caption")``): ``{id, image_id, caption, url}``, image id per `url_image_id` (the index
    counts the data rows). A first line that names the two columns (``caption<TAB>url``, as re-packaged copies
    have) is a header and skipped."""
    if sorted(columns) != ["caption", "url"]:
        raise ValueError(f"columns must name 'caption' and 'url', got {list(columns)}")
    lines = _read_lines(path)
    header = int(bool(lines) and sorted(f.strip().lower() for f in lines[0].split("\t")) == ["caption", "url"])
    if header:
        columns = [f.strip().lower() for f in lines[0].split("\t")]
    out = []
    for k, line in enumerate(lines[header:]):
        where = f"{path}:{k + 1 + header}"
        fields = line.split("\t")
        if len(fields) != 2:
            raise FormatError(f"{where}: expected 2 tab-separated fields ({' <TAB> '.join(columns)}), got {len(fields)}")
        rec = dict(zip(columns, fields))
        caption, url = rec["caption"].strip(), rec["url"].strip()
        if not caption or not url:
            raise FormatError(f"{where}: empty caption or url")
        iid = url_image_id(k, url, image_id)
        out.append({"id": iid, "image_id": iid, "caption": caption, "url": url})
    return out


def read_sbu(captions_path: PathLike, urls_path: PathLike, image_id: str = "index") -> list[dict]:
    """SBU Captions (``SBU_captioned_photo_dataset_{captions,urls}.txt``, line k of one matches
    line k of the other): ``{id, image_id, caption, url}``."""
    captions, urls = _read_lines(captions_path), _read_lines(urls_path)
    if len(captions) != len(urls):
        raise FormatError(f"{captions_path} has {len(captions)} captions but {urls_path} has {len(urls)} urls")
    out = []
    for k, (caption, url) in enumerate(zip(captions, urls)):
        if not caption.strip() or not url.strip():
            raise FormatError(f"{captions_path}:{k + 1} / {urls_path}:{k + 1}: empty caption or url")
        iid = url_image_id(k, url.strip(), image_id)
        out.append({"id": iid, "image_id": iid, "caption": caption.strip(), "url": url.strip()})
    return out


def read_vg_regions(path: PathLike) -> list[dict]:
    """Visual Genome ``region_descriptions.json``: one record per region
    ``{id (region_id), image_id, caption (phrase), region_box (xyxy pixels)}``."""
    out = []
    for k, entry in enumerate(_load_json(path)):
        where = f"{path}: [{k}]"
        for r, reg in enumerate(_get_list(entry, "regions", where)):
            w = f"{where}.regions[{r}]"
            x, y, width, height = (_get(reg, key, w) for key in ("x", "y", "width", "height"))
            iid = reg.get("image_id", entry.get("id"))
            if iid is None:
                raise FormatError(f"{w}: no image_id in the region nor id in its entry")
            out.append({"id": str(_get(reg, "region_id", w)), "image_id": str(iid), "caption": _text(reg, "phrase", w),
                        "region_box": [float(x), float(y), float(x + width), float(y + height)]})
    return out


# --------------------------------------------------------------------------------------------
# Downstream tasks
# --------------------------------------------------------------------------------------------
def _question_id(entry: Any, where: str, field: str) -> int:
    """An entry's ``question_id``, an integer as in the official VQA files (the VQA API's ``getQuesIds``: "integer
    array of question ids", GT-Vision-Lab/VQA ``vqaTools/vqa.py``); `FormatError` naming the file and the first id of
    another type (a string id would reach the results table and fail there in an Arrow type error)."""
    qid = _get(entry, "question_id", where)
    if not isinstance(qid, int) or isinstance(qid, bool):
        raise FormatError(f"{where}: question_id {qid!r} is a {type(qid).__name__}; the VQA format's question ids are "
                          f"integers, as in the official {field} files: write each question_id of the file as a number")
    return qid


def _once(qid: Any, k: int, seen: dict[Any, int], path: PathLike, field: str) -> None:
    """`FormatError` when ``question_id`` ``qid`` (``path``'s ``field[k]``) was given before: the VQA format gives each
    question one entry, and a second one would silently replace the first."""
    if qid in seen:
        raise FormatError(f"{path}: {field}[{k}] gives question_id {qid} again (first at {field}[{seen[qid]}]); "
                          f"each question_id appears once in a VQA {field} file")
    seen[qid] = k


def read_vqa(questions_path: PathLike, annotations_path: PathLike | None = None,
             image_id_format: str = "{}") -> list[dict]:
    """VQA v2 questions (+ annotations) json: ``{id, question_id, image_id, question, answers
    (the 10 raw answer strings; [] without annotations), answer_type, question_type,
    multiple_choice_answer}`` in question order. Question ids are integers, as in the official files."""
    questions = _get_list(_load_json(questions_path), "questions", str(questions_path))
    anns: dict[int, dict] = {}
    if annotations_path is not None:
        first: dict[Any, int] = {}
        for k, ann in enumerate(_get_list(_load_json(annotations_path), "annotations", str(annotations_path))):
            qid = _question_id(ann, f"{annotations_path}: annotations[{k}]", "annotations")
            _once(qid, k, first, annotations_path, "annotations")
            anns[qid] = ann
    out, seen = [], {}
    for k, q in enumerate(questions):
        where = f"{questions_path}: questions[{k}]"
        qid = _question_id(q, where, "questions")
        _once(qid, k, seen, questions_path, "questions")
        rec = {"id": str(qid), "question_id": qid,
               "image_id": _format_id(_get(q, "image_id", where), image_id_format, where),
               "question": _text(q, "question", where), "answers": [], "answer_type": None,
               "question_type": None, "multiple_choice_answer": None}
        if annotations_path is not None:
            if qid not in anns:
                raise FormatError(f"{annotations_path}: no annotation for question_id {qid} ({where})")
            ann, w = anns[qid], f"{annotations_path}: question_id {qid}"
            rec["answers"] = [str(_get(a, "answer", f"{w}.answers[{j}]"))
                              for j, a in enumerate(_get_list(ann, "answers", w))]
            rec.update(answer_type=ann.get("answer_type"), question_type=ann.get("question_type"),
                       multiple_choice_answer=ann.get("multiple_choice_answer"))
        out.append(rec)
    return out


def read_nlvr2(path: PathLike) -> list[dict]:
    """NLVR2 jsonl: ``{id (identifier), left_image, right_image, sentence, label (bool or None)}``.

    Image ids come from ``left_image`` / ``right_image`` when present (vlkit's shapes files),
    else from the identifier as in the released images: ``train-10171-0-0`` ->
    ``train-10171-0-img0`` / ``train-10171-0-img1``.
    """
    out = []
    for where, rec in _iter_jsonl(path):
        ident = str(_get(rec, "identifier", where))
        if "left_image" in rec and "right_image" in rec:
            left, right = str(rec["left_image"]), str(rec["right_image"])
        else:
            parts = ident.split("-")
            if len(parts) < 4:
                raise FormatError(f"{where}: identifier {ident!r} is not of the form split-set-pair-sentence")
            stem = "-".join(parts[:-1])
            left, right = f"{stem}-img0", f"{stem}-img1"
        label = rec.get("label")
        if label not in (None, "True", "False", True, False):
            raise FormatError(f"{where}: label must be 'True' or 'False', got {label!r}")
        out.append({"id": ident, "left_image": left, "right_image": right, "sentence": _text(rec, "sentence", where),
                    "label": None if label is None else label in ("True", True)})
    return out


def read_snli_ve(path: PathLike) -> list[dict]:
    """SNLI-VE jsonl: ``{id (pairID), image_id (Flickr30K_ID), premise (sentence1 or None),
    hypothesis (sentence2), label (gold_label)}``."""
    out = []
    for where, rec in _iter_jsonl(path):
        label = _get(rec, "gold_label", where)
        if label not in VE_LABELS:
            raise FormatError(f"{where}: gold_label must be one of {', '.join(VE_LABELS)}, got {label!r}")
        out.append({"id": str(_get(rec, "pairID", where)), "image_id": str(_get(rec, "Flickr30K_ID", where)),
                     "premise": rec.get("sentence1"), "hypothesis": _text(rec, "sentence2", where), "label": label})
    return out


def read_refs(refs_path: PathLike, instances_path: PathLike, splits: str | Iterable[str] | None = None,
              image_id_format: str = "{}") -> list[dict]:
    """RefCOCO / RefCOCO+ / RefCOCOg refs (``refs(unc).p`` pickle, read with the restricted
    unpickler, or its JSON version) + COCO ``instances.json``: one record per ref
    ``{id, ref_id, ann_id, image_id, split, sentences, sent_ids, bbox (xyxy pixels), category_id,
    image_size (h, w)}``."""
    refs = safe_pickle_load(refs_path) if Path(refs_path).suffix in (".p", ".pkl", ".pickle") else _load_json(refs_path)
    if not isinstance(refs, list):
        raise FormatError(f"{refs_path}: expected a list of refs, got {type(refs).__name__}")
    instances = _load_json(instances_path)
    anns = {}
    for k, ann in enumerate(_get_list(instances, "annotations", str(instances_path))):
        anns[_get(ann, "id", f"{instances_path}: annotations[{k}]")] = ann
    sizes = {}
    for k, img in enumerate(_get_list(instances, "images", str(instances_path))):
        w = f"{instances_path}: images[{k}]"
        sizes[_get(img, "id", w)] = (_get(img, "height", w), _get(img, "width", w))
    wanted = _splits(splits)
    out = []
    for k, ref in enumerate(refs):
        where = f"{refs_path}: [{k}]"
        split = _get(ref, "split", where)
        if wanted is not None and split not in wanted:
            continue
        ann_id, image_id = _get(ref, "ann_id", where), _get(ref, "image_id", where)
        if ann_id not in anns:
            raise FormatError(f"{where}: ann_id {ann_id} is not in {instances_path}")
        if image_id not in sizes:
            raise FormatError(f"{where}: image_id {image_id} is not in {instances_path}")
        x, y, w, h = _get(anns[ann_id], "bbox", f"{instances_path}: annotation {ann_id}")
        sents = _get_list(ref, "sentences", where)
        out.append({
            "id": str(_get(ref, "ref_id", where)), "ref_id": ref["ref_id"], "ann_id": ann_id,
            "image_id": _format_id(image_id, image_id_format, where), "split": split,
            "sentences": [_text(s, "sent", f"{where}.sentences[{j}]") for j, s in enumerate(sents)],
            "sent_ids": [_get(s, "sent_id", f"{where}.sentences[{j}]") for j, s in enumerate(sents)],
            "bbox": [float(x), float(y), float(x + w), float(y + h)],
            "category_id": ref.get("category_id", anns[ann_id].get("category_id")), "image_size": list(sizes[image_id]),
        })
    return out
