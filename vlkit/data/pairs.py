"""Image-text pair datasets over Hugging Face `datasets`, image sources and the `VLCollator`.

An example is a dict: ``id``, ``image_id``, ``input_ids`` [T] and the image side from an image
source (``region_feats`` [K, D], ``region_boxes`` [K, 4] normalised xyxy, optional
``region_soft_labels`` [K, C], ``image_size`` [2] (h, w), optional ``region_wh`` [K, 2] and ``region_global``
[D]; or ``pixel_values`` [3, H, W]); task
datasets add a ``targets`` dict. `VLCollator` turns a list of them into a `VLBatch`.

Bad examples follow ``data.on_error`` (carried by the image source, see `build_image_source`):
``raise`` stops at the first one with an error naming it; ``skip`` leaves it out (``dataset[i]`` is
None and the collators drop it), counted, logged and recorded with its reason in the run's
``skipped.jsonl`` (`vlkit.validate.SkipLog`).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping

import torch

from vlkit.data.collate import VLCollator
from vlkit.data.images import IMAGE_ERRORS, build_image_source
from vlkit.data.tokenizers import build_tokenizer
from vlkit.validate import DataError, SkipLog, check_on_error, check_unique_ids, first

log = logging.getLogger("vlkit.data")


# --------------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------------
class ImageTextPairs(torch.utils.data.Dataset):
    """Captions tokenised as ``[CLS] caption [SEP]`` (any HF tokenizer) paired with an image source.

    ``max_len`` counts the special tokens. Over-long captions are truncated by default (counted in
    ``truncated`` and logged); with ``filter_long=True`` they are dropped instead, as UNITER does (its
    ``max_txt_len`` excludes [CLS]/[SEP], so UNITER's 60 is ``max_len=62`` here). Task datasets read
    their text from ``text_key`` (a question, a statement, a hypothesis) and give ``targets(record) ->
    dict`` per example, which `VLCollator` merges into ``VLBatch.targets``.

    ``on_error`` (default: the image source's, else ``raise``): an empty or whitespace-only text raises
    `DataError` listing every such example, and so does an image that fails to load, naming it; with
    ``skip`` those examples are left out and recorded in ``skips`` (a `vlkit.validate.SkipLog`).
    """

    def __init__(self, records: Any, tokenizer: Any, image_source: Any, max_len: int = 62,
                 filter_long: bool = False, text_key: str = "caption",
                 targets: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 on_error: str | None = None, skips: SkipLog | None = None):
        import datasets

        data = records if isinstance(records, datasets.Dataset) else datasets.Dataset.from_list(list(records))
        if len(data) == 0:
            raise ValueError("ImageTextPairs: no records (is the split empty?)")
        missing = {"id", "image_id", text_key} - set(data.column_names)
        if missing:
            raise KeyError(f"ImageTextPairs: records lack {', '.join(sorted(missing))} (have {data.column_names})")
        if max_len < 3:
            raise ValueError(f"ImageTextPairs: max_len={max_len} leaves no room for a caption")
        check_unique_ids(data["id"], "example")  # the skip policy and the preflight name examples by id
        self.on_error = check_on_error(on_error or getattr(image_source, "on_error", None) or "raise")
        if skips is None:
            skips = getattr(image_source, "skips", None)
        self.skips = skips if skips is not None else SkipLog()
        texts = list(data[text_key])
        empty = [k for k, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
        if empty:
            all_ids = [str(x) for x in data["id"]]
            names = [all_ids[k] for k in empty]
            if self.on_error == "raise":
                raise DataError(f"{len(empty)} example(s) have an empty or whitespace-only {text_key}: "
                                f"{first(names)} (data.on_error=skip leaves them out)")
            for name in names:
                self.skips.add("example", name, f"empty {text_key}")
            keep = sorted(set(range(len(texts))) - set(empty))
            if not keep:
                raise DataError(f"ImageTextPairs: every {text_key} is empty")
            data, texts = data.select(keep), [texts[k] for k in keep]
        ids = tokenizer(texts, truncation=False)["input_ids"]
        long = [k for k, x in enumerate(ids) if len(x) > max_len]
        self.truncated: list[tuple[str, int]] = []  # (example id, tokens before truncation)
        if filter_long:
            keep = [k for k, x in enumerate(ids) if len(x) <= max_len]
            data, ids = data.select(keep), [ids[k] for k in keep]
        elif long:
            cut = tokenizer([texts[k] for k in long], truncation=True, max_length=max_len)["input_ids"]
            all_ids = [str(x) for x in data["id"]]
            self.truncated = [(all_ids[k], len(ids[k])) for k in long]
            for k, x in zip(long, cut):
                ids[k] = x
            worst = max(self.truncated, key=lambda t: t[1])
            log.warning("%d of %d %ss are longer than max_len=%d tokens and were truncated (longest: example %r, "
                        "%d tokens); filter_long=true drops them instead", len(long), len(texts), text_key, max_len,
                        worst[0], worst[1])
        if len(data) == 0:
            raise ValueError(f"ImageTextPairs: every caption is longer than max_len={max_len}")
        self._set_data(data.add_column("input_ids", ids), targets is not None)
        self.tokenizer, self.image_source, self.targets = tokenizer, image_source, targets
        self.max_len, self.filter_long, self.text_key = max_len, filter_long, text_key

    def _set_data(self, data: Any, keep_records: bool) -> None:
        self.data = data
        self._rows = [(str(r), str(m)) for r, m in zip(data["id"], data["image_id"])]  # fast row access
        self._ids = [torch.tensor(x, dtype=torch.long) for x in data["input_ids"]]
        self._records = data.to_list() if keep_records else None

    def __len__(self) -> int:
        return len(self.data)

    def image_ids(self) -> list[str]:
        return [m for _, m in self._rows]

    def example_ids(self) -> list[str]:
        return [r for r, _ in self._rows]

    def drop(self, example_ids: Iterable[str]) -> int:
        """Leave the examples ``example_ids`` out (the preflight's ``skip``); returns how many were dropped."""
        gone = set(map(str, example_ids))
        keep = [k for k, (r, _) in enumerate(self._rows) if r not in gone]
        dropped = len(self._rows) - len(keep)
        if not dropped:
            return 0
        if not keep:
            raise DataError(f"every example of this dataset was skipped (see {self.skips.path or 'the log'})")
        self._set_data(self.data.select(keep), self._records is not None)
        return dropped

    def load_image(self, example_id: str, image_id: str) -> dict[str, Any] | None:
        """The image fields of ``image_id`` for example ``example_id``; None when ``on_error=skip`` left it out."""
        try:
            return self.image_source(image_id)
        except IMAGE_ERRORS as err:
            if self.on_error == "raise":
                raise
            reason = str(err).strip("'\"") if isinstance(err, KeyError) else str(err)
            self.skips.add("example", example_id, reason, image_id=image_id)
            return None

    def __getitem__(self, i: int) -> dict[str, Any] | None:
        i = int(i)
        example_id, image_id = self._rows[i]
        fields = self.load_image(example_id, image_id)
        if fields is None:
            return None
        example = {"id": example_id, "image_id": image_id, "input_ids": self._ids[i], **fields}
        if self.targets is not None:
            example["targets"] = self.targets(self._records[i])
        return example

    def lengths(self) -> list[tuple[int, int]]:
        """(text tokens, image units) per example, for `vlkit.data.batching` (0 units for an image
        ``on_error=skip`` leaves out)."""
        out = []
        for ids, (example_id, image_id) in zip(self._ids, self._rows):
            try:
                units = self.image_source.units(image_id)
            except IMAGE_ERRORS as err:
                if self.on_error == "raise":
                    raise
                self.skips.add("example", example_id, str(err), image_id=image_id)
                units = 0
            out.append((len(ids), units))
        return out

    def collator(self, **kwargs: Any) -> "VLCollator":
        return VLCollator(pad_token_id=self.tokenizer.pad_token_id or 0, **kwargs)


def build_pairs(cfg: Mapping[str, Any], records: Iterable[dict], world: Any = None) -> ImageTextPairs:
    """`ImageTextPairs` over ``records`` with the tokenizer, lengths, image source and ``on_error`` of ``cfg``."""
    return ImageTextPairs(list(records), build_tokenizer(cfg.get("tokenizer")),
                          build_image_source(cfg.get("image", {}), world, cfg.get("on_error") or "raise"),
                          max_len=cfg.get("max_len", 62), filter_long=cfg.get("filter_long", False))
