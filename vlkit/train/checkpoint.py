"""Training checkpoints: ``<output_dir>/checkpoints/step_<N>/`` written atomically.

A checkpoint holds ``model.safetensors`` (the whole training module: model + heads),
``optimizer.pt``, ``scheduler.pt``, ``rng.pt`` (every rank's Python / NumPy / torch RNG states),
``scaler.pt`` with fp16, and ``trainer_state.json`` (step, data position, config and the size and
SHA-256 of every other file). All ``.pt`` files load with ``torch.load(weights_only=True)``. The
directory is filled under a hidden temporary name and renamed into place, so a crash mid-save
leaves the previous checkpoints untouched; ``latest`` names the newest one. Files and folders get the
modes the umask gives (a shared machine's other users can read them when the umask lets them).
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from vlkit.io import (UnreadableFileError, atomic_write_text, honour_umask, key_difference, sha256_file,
                      torch_load_weights, write_failures)

WEIGHTS = "model.safetensors"
STATE = "trainer_state.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_PREFIX = ".tmp-step_"


class CheckpointError(RuntimeError):
    """A checkpoint file that is missing, truncated or corrupt (the message names it)."""


# -- RNG states as plain tensors / lists (weights_only-loadable) ---------------------------------
def rng_state() -> dict[str, Any]:
    """This process's Python, NumPy, torch (and CUDA) RNG states."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(internal), gauss],
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- finding checkpoints ---------------------------------------------------------------------------
def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_<N>`` directory under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest checkpoint directory under ``root`` (None when there is none)."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def _digest(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


# -- save ------------------------------------------------------------------------------------------
def save_checkpoint(root: str | os.PathLike, step: int, module: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, rng_states: list[dict[str, Any]], state: Mapping[str, Any],
                    scaler: Any = None, keep: int = 0) -> Path:
    """Write ``root/step_<step>`` atomically, point ``root/latest`` at it and keep the newest
    ``keep`` checkpoints (all when ``keep <= 0``). Call on one process only."""
    from safetensors.torch import save_model

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    with write_failures(final):
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{step}.", dir=root))
    try:
        with write_failures(final / WEIGHTS):
            save_model(module, str(tmp / WEIGHTS), metadata={"format": "pt", "step": str(step)})
        objects = {"optimizer.pt": optimizer.state_dict(), "scheduler.pt": scheduler.state_dict(),
                   "rng.pt": {"ranks": list(rng_states)}, **({"scaler.pt": scaler.state_dict()} if scaler is not None else {})}
        for name, obj in objects.items():
            with write_failures(final / name), open(tmp / name, "wb") as f:  # a file object: a full disk is ENOSPC
                torch.save(obj, f)
        files = {}
        for path in sorted(tmp.iterdir()):
            with write_failures(final / path.name):  # a full disk may show only when the data is synced
                _fsync(path)
            files[path.name] = _digest(path)
        meta = {**state, "step": step, "files": files}
        with write_failures(final / STATE):
            (tmp / STATE).write_text(json.dumps(meta, indent=2, sort_keys=True))
            _fsync(tmp / STATE)
        honour_umask(tmp, recursive=True)  # mkdtemp makes 0700, safetensors 0600
        if final.exists():  # the same step saved again: swap it out, then drop the old copy
            old = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{step}.old.", dir=root))
            os.replace(final, old / final.name)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(root / LATEST, final.name + "\n")
    if keep > 0:
        for _, old_path in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old_path, ignore_errors=True)
    return final


def remove_stale_temporaries(root: str | os.PathLike) -> None:
    """Delete half-written checkpoint directories left by a crash during save."""
    root = Path(root)
    if root.is_dir():
        for path in root.glob(f"{_TMP_PREFIX}*"):
            shutil.rmtree(path, ignore_errors=True)


# -- load ------------------------------------------------------------------------------------------
def read_state(path: str | os.PathLike, verify: bool = True) -> dict[str, Any]:
    """``trainer_state.json`` of a checkpoint, after checking the size and hash of every file (``verify``)."""
    path = Path(path)
    state_file = path / STATE
    if not state_file.is_file():
        raise CheckpointError(f"{state_file} is missing: {path} is not a complete checkpoint")
    try:
        meta = json.loads(state_file.read_text())
        files = meta["files"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{state_file} is corrupt ({err})") from err
    for name, expected in (files.items() if verify else ()):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing from the checkpoint")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointError(f"{file} is truncated or corrupt: {size} bytes, expected {expected['bytes']}")
        if _digest(file)["sha256"] != expected["sha256"]:
            raise CheckpointError(f"{file} is corrupt: its SHA-256 does not match {state_file}")
    return meta


def _torch_load(file: Path) -> Any:
    try:
        return torch_load_weights(file)
    except (OSError, UnreadableFileError) as err:  # any unpickling failure means a bad file
        raise CheckpointError(str(err) if str(file) in str(err) else f"{file} cannot be read ({err})") from err


def load_checkpoint(path: str | os.PathLike, module: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, scaler: Any = None) -> dict[str, Any]:
    """Validate the checkpoint at ``path``, load it into the given objects and return its state
    (``trainer_state.json`` plus ``rng``: the list of per-rank RNG states)."""
    from safetensors.torch import load_model

    path = Path(path)
    meta = read_state(path)
    weights = path / WEIGHTS
    try:
        missing, unexpected = load_model(module, str(weights), strict=False, device=str(_device_of(module)))
    except Exception as err:  # noqa: BLE001 - safetensors raises several kinds on a bad file
        raise CheckpointError(f"{weights} cannot be read ({type(err).__name__}: {err})") from err
    if missing or unexpected:
        raise CheckpointError(f"{weights} does not match {type(module).__name__}: {key_difference(missing, unexpected)}")
    for obj, name in ((optimizer, "optimizer.pt"), (scheduler, "scheduler.pt"), (scaler, "scaler.pt")):
        if obj is None or (name == "scaler.pt" and name not in meta["files"]):  # fp16 turned on since
            continue
        saved = _torch_load(path / name)
        try:
            obj.load_state_dict(saved)
        except (KeyError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"{path / name} does not fit this run ({err})") from err
    meta["rng"] = _torch_load(path / "rng.pt")["ranks"]
    return meta


def _device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device
