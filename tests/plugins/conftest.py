"""``install_plugin``: a plugin package of this folder pip-installed into a temporary target, found through its
``vlkit.plugins`` entry point (a family's, an executor's, a corruption view's and objective's ...), and removed
from every registry afterwards."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vlkit import registry

HERE = Path(__file__).resolve().parent


def _forget(family: str | None, module: str, entries: dict[registry.Registry, tuple[str, ...]]) -> None:
    for table, names in entries.items():
        for name in names:
            table._entries.pop(name, None)
    if family is not None:  # (a family of None would name the generic heads)
        for table in (registry.MODELS, registry.CONVERTERS):
            table._entries.pop(family, None)
        registry.CONVERTERS._signatures.pop(family, None)
        for key in [k for k in registry.HEADS._entries if k[1] == family]:
            registry.HEADS._entries.pop(key)
            registry.HEADS._defaults.pop(key, None)
    sys.modules.pop(module, None)


@pytest.fixture(scope="module")
def install_plugin(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    installed = []

    def install(package: str, module: str, family: str | None = None, **names: tuple[str, ...]) -> Path:
        """``names``: what the plugin registers besides a family, by registry (``executors=("subprocess",)``,
        ``objectives=...``, ``corruptions=...``: the plain-table registries, `vlkit.EXECUTORS` ...)."""
        entries = {getattr(registry, kind.upper()): tuple(keys) for kind, keys in names.items()}
        root = tmp_path_factory.mktemp(package)
        shutil.copytree(HERE / package, root / "src")  # build outside the repository
        target = root / "site"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(target), str(root / "src")], check=True)
        monkeypatch.syspath_prepend(str(target))
        monkeypatch.setattr(registry, "_plugins_loaded", False)
        assert module not in sys.modules and family not in registry.MODELS._entries
        assert not any(set(keys) & set(table._entries) for table, keys in entries.items())
        installed.append((family, module, entries))
        return target

    yield install
    monkeypatch.undo()
    for family, module, entries in installed:
        _forget(family, module, entries)
