"""Issue 23: imports only go down the layer order written once in ``pyproject.toml`` (``[tool.vlkit.layers]``),
no folder holds an import circle and no module imports the package root; the checker
(``scripts/import_layers.py``) catches a planted upward import, circle and root import."""
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

import vlkit

REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = Path(vlkit.__file__).resolve().parents[1]  # the vlkit under test: the checkout, or CI's installed wheel
_spec = importlib.util.spec_from_file_location("import_layers", REPOSITORY / "scripts" / "import_layers.py")
layers = sys.modules.setdefault("import_layers", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(layers)


def test_vlkit_imports_only_go_down():
    graph = layers.build_graph(PACKAGE_ROOT)
    assert len(graph.modules) > 90 and set(graph.modules.values()) == set(range(len(graph.floors)))
    assert graph.upward == [], layers.report(graph)
    assert graph.circles == [], layers.report(graph)
    assert graph.facade == [], layers.report(graph)
    assert layers.main(["--root", str(PACKAGE_ROOT)]) == 0


@pytest.fixture
def tree(tmp_path):
    """A copy of vlkit/ to plant imports in."""
    shutil.copytree(PACKAGE_ROOT / "vlkit", tmp_path / "vlkit", ignore=shutil.ignore_patterns("__pycache__", "assets"))
    return tmp_path


def test_a_planted_upward_import_fails(tree, capsys):
    (tree / "vlkit" / "models" / "planted.py").write_text("def f():\n    from vlkit.train import pipeline  # lazy\n")
    graph = layers.build_graph(tree)
    assert ("vlkit.models.planted", "vlkit.train.pipeline") in graph.upward
    assert ("vlkit.models.planted", "vlkit.train") in graph.upward  # the package __init__ it runs
    assert layers.main(["--root", str(tree)]) == 1
    assert "vlkit.models.planted (floor 2) -> vlkit.train.pipeline (floor 5)" in capsys.readouterr().out


def test_a_package_init_that_imports_a_higher_floor_fails(tree):
    init = tree / "vlkit" / "data" / "__init__.py"
    init.write_text(init.read_text() + "\nfrom ..objectives import mix  # relative\n")
    assert ("vlkit.data", "vlkit.objectives.mix") in layers.build_graph(tree).upward


def test_a_planted_circle_and_root_import_fail(tree):
    (tree / "vlkit" / "tasks" / "planted_a.py").write_text("from vlkit.tasks import planted_b\n")
    (tree / "vlkit" / "tasks" / "planted_b.py").write_text("import vlkit.tasks.planted_a\n")
    (tree / "vlkit" / "objectives" / "planted.py").write_text("from vlkit import __version__\n")
    graph = layers.build_graph(tree)
    assert graph.upward == [] and ["vlkit.tasks.planted_a", "vlkit.tasks.planted_b"] in graph.circles
    assert graph.facade == ["vlkit.objectives.planted"]
    assert layers.main(["--root", str(tree)]) == 1


def test_a_module_on_no_floor_is_named(tree):
    (tree / "vlkit" / "newroom").mkdir()
    (tree / "vlkit" / "newroom" / "__init__.py").write_text("")
    with pytest.raises(SystemExit, match="vlkit.newroom: on no floor"):
        layers.build_graph(tree)
