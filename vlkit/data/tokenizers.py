"""Tokenizers: which one a run uses, loading it without a late or slow failure, and the run's own copy.

``data.tokenizer`` is ``shapes`` (the shapes world's closed-vocabulary WordPiece), a local folder
(``save_pretrained`` files, or only a BERT ``vocab.txt``: `vocabulary_tokenizer`), a ``vocab.txt`` file, or a
hub name. Left null it is the model family's official tokenizer
(`family_tokenizer`: ViLBERT ``bert-base-uncased``, UNITER ``bert-base-cased``, METER ``roberta-base``; a
``text_pretrained`` folder holding tokenizer files gives its own). Every training run saves its tokenizer
into ``<output_dir>/tokenizer/`` (`save_tokenizer`), and ``finetune init=`` / ``evaluate checkpoint=`` use
that copy (`run_tokenizer`) unless ``data.tokenizer`` is given. A hub name is looked up in the local cache
first; when it is not there and the hub cannot be asked (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``, or
the hub does not answer), `build_tokenizer` fails at once with a `TokenizerError` that names
``data.tokenizer``, the files a folder needs and how to give one.
"""
from __future__ import annotations

import difflib
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vlkit.data.shapes import shapes_tokenizer
from vlkit.validate import DataError, check_no_custom_code

SHAPES = "shapes"
TOKENIZER_DIR = "tokenizer"  # a run's own tokenizer: <output_dir>/tokenizer/
# the files a tokenizer folder holds (any one set of them)
FOLDER_FILES = (("tokenizer.json",), ("vocab.txt",), ("vocab.json", "merges.txt"), ("sentencepiece.bpe.model",),
                ("spiece.model",))
FILES_HELP = ("tokenizer.json, or vocab.txt (BERT WordPiece, alone or with its configuration), or vocab.json + merges.txt (RoBERTa BPE), "
              "with tokenizer_config.json / special_tokens_map.json as save_pretrained writes them")
PROBE_TIMEOUT = 3.0  # seconds to wait for the hub before calling it unreachable


class TokenizerError(DataError):
    """A tokenizer that cannot be loaded, or that does not fit the model; the message names the key."""


def family_tokenizer(model_cls: Any, config: Any) -> str:
    """The official tokenizer of a model family for ``config`` (`VLModel.official_tokenizer`), or the folder of
    its ``text_pretrained`` tower when that folder holds tokenizer files."""
    text = getattr(config, "text_pretrained", None)
    if text and _has_tokenizer_files(Path(text)):
        return str(text)
    return model_cls.official_tokenizer(config)


def _has_tokenizer_files(folder: Path) -> bool:
    return folder.is_dir() and any(all((folder / f).is_file() for f in files) for files in FOLDER_FILES)


def run_tokenizer(directory: str | os.PathLike) -> str | None:
    """The tokenizer a saved run uses: its ``tokenizer/`` folder (``directory`` being the run or its
    ``model/``), else the name its ``run.json`` records (a converted official checkpoint); None if neither."""
    root = Path(directory)
    if root.name == "model" and not (root / TOKENIZER_DIR).is_dir():
        root = root.parent
    if _has_tokenizer_files(root / TOKENIZER_DIR):
        return str(root / TOKENIZER_DIR)
    try:
        recorded = json.loads((root / "run.json").read_text(encoding="utf-8")).get("tokenizer")
    except (OSError, ValueError, AttributeError):
        return None
    return str(recorded) if recorded else None


def save_tokenizer(tokenizer: Any, directory: str | os.PathLike) -> Path:
    """``tokenizer.save_pretrained(<directory>/tokenizer)``: the run's own copy, written beside its model into a
    temporary folder that then takes the place of ``tokenizer/`` (never a half-written one)."""
    target = Path(directory) / TOKENIZER_DIR
    partial = target.with_name(f".{TOKENIZER_DIR}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    tokenizer.save_pretrained(str(partial))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    return target


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or Path(name).expanduser().exists()


def _near_folders(name: str) -> list[str]:
    """The tokenizer folders beside where ``name`` would be whose names are close to it (a misspelt folder)."""
    path = Path(name).expanduser()
    parent = path.parent
    if not parent.is_dir():
        return []
    try:
        folders = [p.name for p in parent.iterdir() if _has_tokenizer_files(p)]
    except OSError:
        return []
    return [str(parent / close) if str(parent) != "." else close
            for close in difflib.get_close_matches(path.name, folders, n=2, cutoff=0.6)]


def _meant_as_folder(name: str) -> bool:
    """Whether a name that is neither a folder nor cached is a misspelt local folder rather than a hub name: its
    parent is a local folder (``data/tokenizr``), or a tokenizer folder of a close name is beside it."""
    parent = Path(name).expanduser().parent
    return (str(parent) != "." and parent.is_dir()) or bool(_near_folders(name))


def _no_folder(name: str, key: str) -> str:
    near = _near_folders(name)
    hint = f" (did you mean {' or '.join(f'{key}={n}' for n in near)}?)" if near else ""
    return (f"{key}={name}: no such folder {Path(name).expanduser().absolute()}{hint}; {key} takes a folder holding "
            f"{FILES_HELP}, a vocab.txt file, or a hub name")


def _offline() -> bool:
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(v.strip().lower() in ("1", "true", "yes", "on") for v in flags)


def _hub_reachable() -> bool:
    """Whether the hub's host accepts a connection within `PROBE_TIMEOUT` (one try, no retries)."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((endpoint.hostname or "huggingface.co", endpoint.port or 443),
                                      timeout=PROBE_TIMEOUT):
            return True
    except OSError:
        return False


def _cached(name: str) -> bool:
    """Whether the hub's local cache holds tokenizer files of ``name``."""
    from huggingface_hub import try_to_load_from_cache

    for file in ("tokenizer_config.json", "tokenizer.json", "vocab.txt", "vocab.json"):
        try:
            if isinstance(try_to_load_from_cache(name, file), str):
                return True
        except ValueError:  # not a valid repo id
            return False
    return False


def _help(name: str, key: str) -> str:
    return (f"give {key} a local folder holding the tokenizer's files ({FILES_HELP}): {key}=/path/to/folder "
            f"(e.g. what AutoTokenizer.from_pretrained({name!r}).save_pretrained('/path/to/folder') writes on a "
            "machine that reaches the hub)")


def vocabulary_tokenizer(path: str | os.PathLike, key: str = "data.tokenizer") -> Any:
    """A BERT WordPiece tokenizer (``BertTokenizerFast``) over a ``vocab.txt`` file, or a folder holding one, with
    nothing else and no network: lower-casing when the vocabulary holds no upper-case word (as ``bert-base-uncased``),
    BERT's special tokens, which the vocabulary must hold."""
    from transformers import BertTokenizerFast

    file = Path(path).expanduser()
    file = file / "vocab.txt" if file.is_dir() else file
    try:
        words = [line.rstrip("\r") for line in file.read_text(encoding="utf-8").split("\n")]
        words = words[:-1] if words and not words[-1] else words
    except (OSError, UnicodeDecodeError) as err:
        raise TokenizerError(f"{key}={path}: cannot read the vocabulary {file} ({err})") from err
    special = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    missing = [token for token in special if token not in words]
    if missing:
        raise TokenizerError(f"{key}={path}: the vocabulary {file} lacks BERT's special tokens {', '.join(missing)}; "
                             "a vocab.txt holds one WordPiece token a line, [PAD] [UNK] [CLS] [SEP] [MASK] among them")
    cased = any(word != word.lower() for word in words if word not in special and not word.startswith("[unused"))
    vocab = {word: index for index, word in enumerate(words)}
    return BertTokenizerFast(vocab=vocab, do_lower_case=not cased, model_max_length=512)


def _vocabulary_only(folder: Path) -> bool:
    """A folder whose only tokenizer file is a BERT ``vocab.txt`` (no configuration for AutoTokenizer to read)."""
    return (folder / "vocab.txt").is_file() and not any(
        (folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "config.json"))


def on_this_machine(name: str) -> bool:
    """Whether tokenizer ``name`` loads without the network: ``shapes``, a local folder, or the hub's local cache."""
    return name == SHAPES or _looks_like_path(name) or _cached(name)


def build_tokenizer(name: str | os.PathLike | None, key: str = "data.tokenizer") -> Any:
    """The tokenizer ``name`` names (see the module docstring); every failure is a `TokenizerError` naming ``key``."""
    if name is None:
        raise TokenizerError(f"{key} is not set: name a tokenizer (shapes, a hub name or a local folder)")
    name = str(name)
    if name == SHAPES:
        return shapes_tokenizer()
    if _looks_like_path(name):
        folder = Path(name).expanduser()
        if folder.is_file() and folder.suffix == ".txt":
            return vocabulary_tokenizer(folder, key)
        if not folder.is_dir():
            raise TokenizerError(_no_folder(name, key))
        if not _has_tokenizer_files(folder):
            found = ", ".join(sorted(p.name for p in folder.iterdir())[:8]) or "nothing"
            raise TokenizerError(f"{key}={name}: the folder holds no tokenizer files (found {found}); it needs "
                                 f"{FILES_HELP}")
        if _vocabulary_only(folder):
            return vocabulary_tokenizer(folder, key)
        check_no_custom_code(folder, key)
        return _load(str(folder), key, local_only=True)
    if _cached(name):
        return _load(name, key, local_only=True)
    if _meant_as_folder(name):
        raise TokenizerError(_no_folder(name, key))
    if _offline() or not _hub_reachable():
        why = "offline mode (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) is set" if _offline() else "the hub does not answer"
        raise TokenizerError(f"{key}={name}: the tokenizer is not in the local hub cache and {why}, so it cannot be "
                             f"downloaded; {_help(name, key)}")
    return _load(name, key, local_only=False)


def _load(name: str, key: str, local_only: bool) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=local_only, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise TokenizerError(f"{key}={name}: the tokenizer could not be loaded ({err}); {_help(name, key)}") from err


def same_vocabulary(a: Any, b: Any) -> bool:
    """Whether two tokenizers map the same tokens to the same ids."""
    return len(a) == len(b) and a.get_vocab() == b.get_vocab()


__all__ = ["FILES_HELP", "SHAPES", "TOKENIZER_DIR", "TokenizerError", "build_tokenizer", "family_tokenizer",
           "on_this_machine", "run_tokenizer", "same_vocabulary", "save_tokenizer", "vocabulary_tokenizer"]
