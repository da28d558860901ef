"""The ``data`` block of a command's spec: the types and ranges of its keys (``data.max_len``, ``data.image.num_bb``
...), checked before any data is read. The block's other keys are read where they are used (``on_error`` by
`vlkit.data.pairs.check_on_error`, ``image.source`` by `vlkit.data.images.build_image_source`)."""
from __future__ import annotations

from typing import Any

from vlkit.config import COUNT, FRACTION, NATURAL, SWITCH, Problem, Rule, check_rules

RULES: dict[str, Rule] = {
    "max_len": Rule(int, 3), "num_images": COUNT, "val_images": NATURAL, "test_images": NATURAL,
    "image_size": COUNT, "eval_rounds": COUNT, "train_rounds": COUNT, "filter_long": SWITCH,
    "image.num_bb": COUNT, "image.conf_th": FRACTION, "image.max_bb": COUNT, "image.min_bb": COUNT,
    "image.size": COUNT, "image.patch_size": COUNT,
}


def data_problems(data: Any, key: str = "data") -> list[Problem]:
    """Every value of the data config ``data`` (a plain mapping) its readers cannot take, each named ``<key>.<name>``."""
    if data is None:
        return []
    if not isinstance(data, dict):
        return [Problem(key, f"={data!r}: give a data set name or a mapping of its keys")]
    return check_rules(RULES, data, f"{key}.")
