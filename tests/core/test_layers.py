"""Issue 23: imports only go down the layer order written once in ``pyproject.toml`` (``[tool.vlkit.layers]``),
no folder holds an import circle and no module imports the package root; the checker
(``scripts/import_layers.py``) catches a planted upward import, circle and root import. Issue 45: a string import
(``importlib.import_module("vlkit.x")``, a ``"vlkit.x:f"`` target) is an arrow too, so the registry's bottom floor
cannot list the rooms above it; the facade's lazy table is the one exception; benchmarks/ imports must resolve.
Issue 52: no two rooms import each other (``data`` and ``features`` were tied by the shapes palette), compare/ holds
no module that imports nothing of it (its roots listed), and the function-level imports of vlkit modules are
counted, each with its stated reason, fewer than the 348 of 455e9a4 and never more than ``lazy_imports``."""
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
    assert graph.room_circles == [] and graph.strangers == [], layers.report(graph)
    assert graph.facade == [], layers.report(graph)
    assert len(graph.function_imports) < 348 and not graph.too_lazy, layers.report(graph)
    assert all(f.reason for f in graph.function_imports), layers.report(graph, lazy=True)  # each states its reason
    # the shapes palette sits below both rooms: features imports nothing of data
    assert not any(b.startswith("vlkit.data") for a, targets in graph.edges.items() if a.startswith("vlkit.features")
                   for b in targets), layers.report(graph)
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
    models, train = graph.modules["vlkit.models.planted"], graph.modules["vlkit.train.pipeline"]
    assert f"vlkit.models.planted (floor {models}) -> vlkit.train.pipeline (floor {train})" in capsys.readouterr().out


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
    assert f"vlkit.registry (floor 0) -> vlkit.tasks.vqa (floor {graph.modules['vlkit.tasks.vqa']})" in capsys.readouterr().out


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


def test_rooms_of_one_floor_that_import_each_other_fail(tree, capsys):
    """A circle of rooms needs no circle of modules: data's images read a feature store, and a features module
    that reads the shapes world from data closes the circle between the folders."""
    (tree / "vlkit" / "features" / "planted.py").write_text("from vlkit.data.shapes import scenes\n")
    graph = layers.build_graph(tree)
    assert graph.circles == [] and graph.upward == []
    assert graph.room_circles == [["vlkit.data", "vlkit.features"]]
    assert layers.main(["--root", str(tree)]) == 1
    assert "vlkit.data <-> vlkit.features" in capsys.readouterr().out


def test_a_compare_module_that_imports_nothing_of_compare_fails(tree, capsys):
    (tree / "vlkit" / "compare" / "planted.py").write_text("from vlkit.io import dump_json\n")
    (tree / "vlkit" / "compare" / "knows.py").write_text("from vlkit.compare.units import Unit\n")
    graph = layers.build_graph(tree)
    assert graph.strangers == ["vlkit.compare.planted"]
    assert layers.main(["--root", str(tree)]) == 1
    assert "strangers (modules of vlkit.compare that import nothing of it): 1\n  vlkit.compare.planted" in \
        capsys.readouterr().out
    graph.cohesive = {"vlkit.compare": [*graph.cohesive["vlkit.compare"], "vlkit.compare.gone"]}
    assert "vlkit.compare.gone: listed as a root of vlkit.compare but not a module of it" in graph.strangers


def test_function_level_imports_are_counted_with_their_reasons(tree):
    (tree / "vlkit" / "tasks" / "planted.py").write_text(
        "def f():\n    from vlkit.io import dump_json\n    import json\n\n"
        "def g():\n    from vlkit.features.detector import extract_features\n"
        "    from vlkit.models import (base,\n                              heads)  # start-up cost: planted\n")
    graph = layers.build_graph(tree)
    planted = [f for f in graph.function_imports if f.importer == "vlkit.tasks.planted"]
    assert [(f.line, f.targets, f.reason) for f in planted] == [
        (2, ("vlkit.io",), None),  # the json import is no vlkit module's
        (6, ("vlkit.features.detector",), layers.LAZY_TARGETS["vlkit.features.detector"]),
        (7, ("vlkit.models.base", "vlkit.models.heads"), "start-up cost: planted")]
    assert str(planted[0]) in layers.report(graph) and str(planted[2]) not in layers.report(graph)
    assert str(planted[2]) in layers.report(graph, lazy=True)
    graph.lazy_ceiling = len(graph.unexplained)
    assert not graph.too_lazy
    graph.lazy_ceiling -= 1  # one more without a reason than allowed
    assert graph.too_lazy and "without a stated reason, at most" in layers.report(graph)
