"""A run's folder, the format that ``vlkit pretrain | finetune`` and `vlkit.convert` write and ``finetune init=``,
``evaluate checkpoint=`` and `vlkit.from_pretrained` read: ``model/``, ``tokenizer/`` (when the run has its own),
the training module's weights and ``run.json``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vlkit.validate import DataError

PRETRAINING_WEIGHTS = "pretraining.safetensors"
TASK_WEIGHTS = "task.safetensors"
RUN_INFO = "run.json"


def save_run(directory: Path, module: Any, info: dict[str, Any], tokenizer: Any = None) -> None:
    """Write the final model (``model/``), the run's ``tokenizer/`` (when given), the whole training module's
    weights and ``run.json``."""
    from vlkit.data.tokenizers import save_tokenizer
    from vlkit.io import atomic_write_text, save_weights

    directory.mkdir(parents=True, exist_ok=True)
    module.model.save_pretrained(directory / "model")
    if tokenizer is not None:
        save_tokenizer(tokenizer, directory)
    name = TASK_WEIGHTS if info.get("kind") == "finetune" else PRETRAINING_WEIGHTS
    save_weights(module, directory / name)
    atomic_write_text(directory / RUN_INFO, json.dumps(info, indent=2, sort_keys=True, default=str))


def read_run_info(directory: str | Path) -> dict[str, Any]:
    """``run.json`` of a pretrain / finetune output_dir; a missing or corrupt file is an error naming it."""
    path = Path(directory) / RUN_INFO
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {directory} is not the output_dir of a vlkit pretrain or finetune run")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        info["kind"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise DataError(f"{path} is not a vlkit run record ({type(err).__name__}: {err})") from err
    return info
