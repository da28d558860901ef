"""``install_plugin``: a plugin package of this folder pip-installed into a temporary target, found through its
``vlkit.plugins`` entry point, and removed from every registry afterwards."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vlkit import registry

HERE = Path(__file__).resolve().parent


def _forget(family: str, module: str) -> None:
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

    def install(package: str, module: str, family: str) -> Path:
        root = tmp_path_factory.mktemp(package)
        shutil.copytree(HERE / package, root / "src")  # build outside the repository
        target = root / "site"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(target), str(root / "src")], check=True)
        monkeypatch.syspath_prepend(str(target))
        monkeypatch.setattr(registry, "_plugins_loaded", False)
        assert module not in sys.modules and family not in registry.MODELS._entries
        installed.append((family, module))
        return target

    yield install
    monkeypatch.undo()
    for family, module in installed:
        _forget(family, module)
