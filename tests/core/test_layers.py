"""Issue 23: imports only go down the layer order written once in ``pyproject.toml`` (``[tool.vlkit.layers]``),
no folder holds an import circle and no module imports the package root; the checker
(``scripts/import_layers.py``) catches a planted upward import, circle and root import. Issue 45: a string import
(``importlib.import_module("vlkit.x")``, a ``"vlkit.x:f"`` target) is an arrow too, so the registry's bottom floor
cannot list the rooms above it; the facade's lazy table is the one exception; benchmarks/ imports must resolve."""
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
    # the registry names no room above its floor, not even by string; the facade's table names the homes
    assert {graph.modules[b] for b in graph.edges["vlkit.registry"]} <= {0}, graph.edges["vlkit.registry"]
    assert {"vlkit.models", "vlkit.tasks", "vlkit.convert"} <= set(graph.lazy)
    assert ("vlkit.cli", "vlkit.train.commands") in graph.strings  # the CLI's COMMANDS table: downward arrows
    assert not any(b == "vlkit.data" for a, b in graph.strings)  # a logger's name is no import


def test_benchmark_imports_resolve():
    count, broken = layers.check_scripts(REPOSITORY, layers.module_names(PACKAGE_ROOT))
    assert count > 50 and broken == []


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
    assert "vlkit.models.planted (floor 2) -> vlkit.train.pipeline (floor 6)" in capsys.readouterr().out


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


@pytest.mark.parametrize("planted", [
    'import importlib\n\ndef _load():\n    importlib.import_module("vlkit.tasks.vqa")\n',
    '_BUILTINS = {"task": ["vlkit.tasks.vqa"]}\n',
    'COMMANDS = {"x": "vlkit.tasks.vqa:main"}\n',
])
def test_a_string_import_above_the_registry_fails(tree, capsys, planted):
    registry = tree / "vlkit" / "registry.py"
    registry.write_text(registry.read_text() + "\n" + planted)
    graph = layers.build_graph(tree)
    assert ("vlkit.registry", "vlkit.tasks.vqa") in graph.upward and ("vlkit.registry", "vlkit.tasks.vqa") in graph.strings
    assert layers.main(["--root", str(tree)]) == 1
    assert "vlkit.registry (floor 0) -> vlkit.tasks.vqa (floor 5)" in capsys.readouterr().out


def test_the_facade_table_is_the_one_exception(tree):
    init = tree / "vlkit" / "__init__.py"
    init.write_text(init.read_text() + '\n_MORE = {"x": "vlkit.train.pipeline"}\n')
    graph = layers.build_graph(tree)
    assert "vlkit.train.pipeline" in graph.lazy and graph.upward == []
    init.write_text(init.read_text() + "\ndef _f():\n    from vlkit.train import pipeline\n")  # a real import is held
    assert ("vlkit", "vlkit.train.pipeline") in layers.build_graph(tree).upward


def test_a_broken_benchmark_import_fails(tree, capsys):
    (tree / "benchmarks").mkdir()
    (tree / "benchmarks" / "good.py").write_text(
        "import vlkit.models.base\nfrom vlkit import build_model\nfrom vlkit.runtime import shutdown\n"
        "from vlkit.train import pipeline\n\ndef f():\n    from vlkit.registry import MODELS\n")
    assert layers.main(["--root", str(tree)]) == 0
    (tree / "benchmarks" / "moved.py").write_text(
        "def f():\n    from vlkit.train.distributed import shutdown\n    from vlkit.nowhere import x\n"
        "    from vlkit import no_such_name\n")
    graph = layers.build_graph(tree)
    assert graph.broken == ["benchmarks/moved.py:2: vlkit.train.distributed defines no shutdown",
                            "benchmarks/moved.py:3: no module vlkit.nowhere",
                            "benchmarks/moved.py:4: vlkit defines no no_such_name"]
    assert layers.main(["--root", str(tree)]) == 1
    assert "vlkit.train.distributed defines no shutdown" in capsys.readouterr().out
