"""The evaluation data of image-text retrieval (`RetrievalSet`): N images x M captions, tokenised once, images
loaded on first use; batches of captions, of images, or of pairs."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from vlkit.data.collate import VLCollator
from vlkit.types import VLBatch


class RetrievalSet:
    """An evaluation set: ``image_ids`` [N], ``captions`` [M] and ``txt2img`` [M] (the image index of
    each caption). Captions are tokenised once (truncated to ``max_len``); images are loaded from
    ``image_source`` on first use and kept in memory when ``cache_images`` is true."""

    def __init__(self, image_ids: Sequence[str], captions: Sequence[str], txt2img: Sequence[int], tokenizer: Any,
                 image_source: Any, max_len: int = 62, caption_ids: Sequence[str] | None = None,
                 cache_images: bool = True):
        self.image_ids = [str(i) for i in image_ids]
        self.captions = list(captions)
        self.txt2img = torch.as_tensor(list(txt2img), dtype=torch.long)
        self.caption_ids = [str(c) for c in caption_ids] if caption_ids is not None else \
            [str(t) for t in range(len(self.captions))]
        if not self.image_ids or not self.captions:
            raise ValueError(f"RetrievalSet: needs images and captions, got {len(self.image_ids)} images and "
                             f"{len(self.captions)} captions")
        if len(set(self.image_ids)) != len(self.image_ids):
            dup = next(i for i in self.image_ids if self.image_ids.count(i) > 1)
            raise ValueError(f"RetrievalSet: image {dup!r} is listed twice")
        if len(self.txt2img) != len(self.captions) or len(self.caption_ids) != len(self.captions):
            raise ValueError(f"RetrievalSet: {len(self.captions)} captions but {len(self.txt2img)} txt2img entries "
                             f"and {len(self.caption_ids)} caption ids")
        bad = ((self.txt2img < 0) | (self.txt2img >= len(self.image_ids))).nonzero()
        if len(bad):
            t = int(bad[0])
            raise ValueError(f"RetrievalSet: caption {self.caption_ids[t]!r} points to image index "
                             f"{int(self.txt2img[t])} of {len(self.image_ids)}")
        lonely = sorted(set(range(len(self.image_ids))) - set(self.txt2img.tolist()))
        if lonely:
            raise ValueError(f"RetrievalSet: image {self.image_ids[lonely[0]]!r} has no caption")
        ids = tokenizer(self.captions, truncation=True, max_length=max_len)["input_ids"]
        self.input_ids = [torch.tensor(x, dtype=torch.long) for x in ids]
        self.text_lengths = torch.tensor([len(x) for x in ids])
        self.image_source, self.cache_images = image_source, cache_images
        self.collate = VLCollator(pad_token_id=tokenizer.pad_token_id or 0)
        self._images: dict[int, dict[str, Tensor]] = {}

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]], tokenizer: Any, image_source: Any,
                     **kwargs: Any) -> "RetrievalSet":
        """From ``{image_id, captions[, caption_ids]}`` records (`vlkit.data.formats.read_karpathy_retrieval`)."""
        image_ids, captions, txt2img, caption_ids = [], [], [], []
        for i, rec in enumerate(records):
            image_ids.append(str(rec["image_id"]))
            caps = list(rec["captions"])
            captions += caps
            txt2img += [i] * len(caps)
            caption_ids += record_caption_ids(rec)
        return cls(image_ids, captions, txt2img, tokenizer, image_source, caption_ids=caption_ids, **kwargs)

    @property
    def num_images(self) -> int:
        return len(self.image_ids)

    @property
    def num_texts(self) -> int:
        return len(self.captions)

    def image_fields(self, i: int) -> dict[str, Tensor]:
        """The image side of image ``i`` as the image source gives it."""
        if i in self._images:
            return self._images[i]
        fields = self.image_source(self.image_ids[i])
        if self.cache_images:
            self._images[i] = fields
        return fields

    def _examples(self, img_idx: Sequence[int] | None, txt_idx: Sequence[int] | None) -> list[dict[str, Any]]:
        n = len(img_idx if img_idx is not None else txt_idx)
        out = []
        for k in range(n):
            ex: dict[str, Any] = {}
            if txt_idx is not None:
                t = int(txt_idx[k])
                ex.update(id=self.caption_ids[t], input_ids=self.input_ids[t])
            if img_idx is not None:
                i = int(img_idx[k])
                ex.update(self.image_fields(i), image_id=self.image_ids[i])
                ex.setdefault("id", self.image_ids[i])
                ex.setdefault("input_ids", self.input_ids[0][:1])  # encode_image reads no text
            out.append(ex)
        return out

    def text_batch(self, txt_idx: Sequence[int]) -> VLBatch:
        return self.collate(self._examples(None, txt_idx))

    def image_batch(self, img_idx: Sequence[int]) -> VLBatch:
        return self.collate(self._examples(img_idx, None))

    def pair_batch(self, img_idx: Sequence[int], txt_idx: Sequence[int]) -> VLBatch:
        """Caption ``txt_idx[k]`` with image ``img_idx[k]``: the input of a full forward."""
        return self.collate(self._examples(img_idx, txt_idx))


def record_caption_ids(rec: Mapping[str, Any]) -> list[str]:
    """The ids of a record's captions: its ``caption_ids``, else ``<image_id>#<k>``."""
    return [str(c) for c in rec.get("caption_ids") or [f"{rec['image_id']}#{k}" for k in range(len(rec["captions"]))]]
