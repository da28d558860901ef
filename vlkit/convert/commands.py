"""`vlkit convert`: a Hydra app over ``conf/convert.yaml`` (see `vlkit.convert.from_official`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vlkit.config import SWITCH, plain
from vlkit.convert import from_official, save_converted
from vlkit.data.tokenizers import TokenizerError, build_tokenizer
from vlkit.io import atomic_directory, refuse_overwrite, safe_pickle_load
from vlkit.models.base import VLModel
from vlkit.released import PRETRAINED, check_released


def read_answers(path: str | Path) -> list[str]:
    """VQA answer strings in label order from a JSON list, or a JSON / pickle ``{answer: label}`` map or
    ``[answer, ...]`` list (the official ``ans2label`` / ``label2ans`` files; pickles through the restricted
    unpickler)."""
    path = check_released(path, "answers file")
    try:
        values: Any = json.loads(path.read_text()) if path.suffix == ".json" else safe_pickle_load(path)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a readable JSON answers file ({err})") from None
    if isinstance(values, dict):
        labels = sorted(values.items(), key=lambda kv: int(kv[1]))
        if [int(v) for _, v in labels] != list(range(len(labels))):
            raise ValueError(f"{path}: the answer -> label map does not number its answers 0..{len(labels) - 1}")
        values = [k for k, _ in labels]
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{path}: expected a list of answer strings or an answer -> label map")
    return values


# The rules of the command's own keys (`vlkit.config.Rule`), checked by the console before the command runs.
KEY_RULES = {"convert": {"overwrite": SWITCH}}

def convert(cfg) -> int:
    """Convert ``src`` (family ``family``, or the one whose key signature it carries) and write the vlkit run
    directory ``dst`` (with ``tokenizer``'s files); ``pretrained=<family>/<tag>`` gives the family, the task and
    ``dst`` of a named release (`vlkit.released.PRETRAINED`)."""
    family, task, dst = cfg.family, cfg.task, cfg.dst
    if cfg.get("pretrained"):
        entry = PRETRAINED.get(cfg.pretrained)
        if family is not None and family != entry.family:
            raise ValueError(f"family={family} conflicts with pretrained={entry.name} (a {entry.family} release)")
        family, task, dst = entry.family, task or entry.task, dst or entry.directory
    if dst is None:
        raise ValueError("vlkit convert needs dst= (the run directory to write) or pretrained= (a named release)")
    dst = Path(dst)
    refuse_overwrite(dst, cfg.overwrite, "dst")
    tokenizer = build_tokenizer(cfg.tokenizer, key="tokenizer") if cfg.get("tokenizer") else None
    options = dict(plain(cfg.options) or {})
    if cfg.answers:
        options["answers"] = read_answers(cfg.answers)
    config = plain(cfg.config)
    module, report = from_official(family, cfg.src, config=config, task=task, options=options, return_report=True)
    rows = (module if isinstance(module, VLModel) else module.model).vocab_size
    if tokenizer is not None and len(tokenizer) != rows:
        raise TokenizerError(f"tokenizer={cfg.tokenizer} has {len(tokenizer)} tokens but {cfg.src} has {rows} word "
                             "embeddings: give the tokenizer the checkpoint was trained with")
    with atomic_directory(dst) as building:  # built beside dst and swapped in whole: nothing of an old dst stays
        save_converted(module, report, building, tokenizer)
    print(report)
    print(json.dumps({"convert": {"dst": str(dst), "family": report.family, "kind": report.kind,
                                  "loaded": report.mapped, "unused": len(report.unused)}}, indent=2))
    return 0
