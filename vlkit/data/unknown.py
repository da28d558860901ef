"""How much of a text the tokenizer does not know: the share of its tokens that are ``[UNK]``, and which words.

A tokenizer whose vocabulary lacks a data set's words maps them to ``[UNK]``: two questions that differ only in an
unknown word become the same question, and training goes on without a word. The preflight
(`vlkit.train.preflight.Preflight.check_unknown_words`) counts it on a sample of every training and evaluation text
and refuses a rate above ``data.max_unk_rate``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from vlkit.validate import sample_evenly

SAMPLE = 5000  # texts tokenised to count unknown tokens (spread evenly over the data)
MAX_UNK_RATE = 0.05  # data.max_unk_rate's default: the share of [UNK] tokens a run accepts


@dataclass
class UnknownTokens:
    """``unknown`` of ``tokens`` text tokens (special tokens left out) are ``[UNK]``, in ``texts_with_unknown`` of
    the ``texts`` counted; ``words``: the text each ``[UNK]`` stands for, with its count."""

    tokens: int = 0
    unknown: int = 0
    texts: int = 0
    texts_with_unknown: int = 0
    words: Counter = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        return self.unknown / self.tokens if self.tokens else 0.0

    def summary(self) -> dict[str, Any]:
        return {"rate": round(self.rate, 6), "tokens": self.tokens, "unknown": self.unknown, "texts": self.texts,
                "texts_with_unknown": self.texts_with_unknown, "words": dict(self.words.most_common(10))}


def dataset_texts(dataset: Any) -> list[str] | None:
    """The texts of a dataset vlkit builds: `ImageTextPairs` (and the NLVR2 pairs around one) or a retrieval
    evaluation set; None for one whose texts are not held (a stream)."""
    pairs = getattr(dataset, "pairs", dataset)
    data, key = getattr(pairs, "data", None), getattr(pairs, "text_key", None)
    if data is not None and key is not None and key in getattr(data, "column_names", ()):
        return list(data[key])
    captions = getattr(dataset, "captions", None)
    return list(captions) if isinstance(captions, list) else None


def unknown_tokens(tokenizer: Any, texts: Sequence[str], sample: int = SAMPLE) -> UnknownTokens | None:
    """The ``[UNK]`` tokens of ``texts`` (``sample`` of them, spread evenly) under ``tokenizer``; None for a
    tokenizer without an unknown token (byte-level BPE knows every text)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return None
    special = set(getattr(tokenizer, "all_special_ids", ())) - {unk}
    chosen = [t for t in sample_evenly(list(texts), sample) if isinstance(t, str)]
    out = UnknownTokens(texts=len(chosen))
    if not chosen:
        return out
    if getattr(tokenizer, "is_fast", False):  # offsets name the unknown words
        encoded = tokenizer(chosen, add_special_tokens=False, return_offsets_mapping=True)
        offsets = encoded["offset_mapping"]
    else:  # a slow or custom tokenizer: counts without the words
        encoded, offsets = tokenizer(chosen, add_special_tokens=False), None
    for k, ids in enumerate(encoded["input_ids"]):
        hits = [j for j, i in enumerate(ids) if i == unk]
        out.tokens += sum(i not in special for i in ids)
        out.unknown += len(hits)
        out.texts_with_unknown += bool(hits)
        if offsets is not None:
            out.words.update(chosen[k][offsets[k][j][0]:offsets[k][j][1]] for j in hits)
    return out


__all__ = ["MAX_UNK_RATE", "SAMPLE", "UnknownTokens", "dataset_texts", "unknown_tokens"]
