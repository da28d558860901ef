"""The manifest of a comparison: what reruns it exactly (config, seeds, data hash, ids seen, feature store
digest) and the environment it ran in (package versions, git commit, the float kernels and torch's build)."""
from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from vlkit.io import atomic_write_text, dump_json, read_json, sha256_file
from vlkit.runtime import kernels
from vlkit.version import __version__

PACKAGES = ("torch", "torchvision", "transformers", "timm", "accelerate", "hydra-core", "datasets", "h5py", "pot",
            "safetensors", "numpy")


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"vlkit": __version__, "python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def platform_record() -> dict[str, Any]:
    """The machine the comparison was started on: its processor, the float kernels (`vlkit.runtime.kernels`) and
    torch's build configuration (``torch.__config__.show()``: compiler, BLAS, CPU capability)."""
    import torch

    return {"processor": _processor(), "machine": platform.machine(), "kernels": kernels(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch_build": torch.__config__.show()}


def _processor() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _written(path: Path) -> dict[str, Any]:
    """The manifest already at ``path`` ({} when there is none or it is unreadable)."""
    try:
        found = read_json(path)
    except OSError:  # none yet, or unreadable (`vlkit.io.UnreadableFileError`): written afresh
        return {}
    return found if isinstance(found, dict) else {}


def git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parent.parent
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def write_manifest(output_dir: Path, cfg: dict[str, Any], audit: dict[str, Any], store: str | None,
                   account: dict[str, Any], complete: bool = True) -> dict[str, Any]:
    """Write ``manifest.json``: the resolved config (``vlkit compare manifest=`` reruns it), seeds, data hash
    and parts, ids seen, the feature store's digest, package versions, the platform (processor, float kernels, torch's
    build), git commit and command of the session that started the comparison (a resume or `compare-report` keeps
    them; each session's own command is in ``sessions/``), wall time over every
    session and what the comparison spent (``account``: `vlkit.compare.account`, without its per-unit rows), the
    machine speed its units recorded (``machine``) and whether every unit had finished (``complete``)."""
    first = _written(output_dir / "manifest.json")  # the command, machine and commit that started it stay its own
    manifest = {
        "config": {k: v for k, v in cfg.items() if k not in ("output_dir", "manifest", "expected_data_hash", "resume",
                                                             "dry_run")},
        "seeds": cfg["compare"]["seeds"],
        "data": {"hash": audit["data_hash"], "parts": audit["data"]},
        "ids_seen": {"pretrain": audit["pretrain_ids"], "finetune": audit["finetune_ids"]},
        "feature_store": {"path": store, "sha256": sha256_file(store)} if store else None,
        "packages": package_versions(),
        "platform": first.get("platform") or platform_record(),
        "git_commit": first.get("git_commit") or git_commit(),
        "command": first.get("command") or " ".join(sys.argv),
        "wall_s": account["wall_s"],
        "account": {k: v for k, v in account.items() if k != "units"},
        "machine": audit.get("machine"),
        "complete": complete,
    }
    atomic_write_text(output_dir / "manifest.json", dump_json(manifest))
    return manifest
