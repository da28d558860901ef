"""vlkit's import graph against its layer order: the floors, every upward arrow and the import circles.

    python scripts/import_layers.py            # vlkit/ of this checkout; exit status 1 on an upward arrow, a circle,
                                               # an import of the package root or a broken import of benchmarks/
    python scripts/import_layers.py --root DIR # another tree laid out as DIR/vlkit/... (and DIR/benchmarks/)

The order is written once, in ``pyproject.toml`` under ``[tool.vlkit.layers]``: ``floors`` lists the floors
bottom first, each a list of module prefixes (the longest prefix decides a module's floor). A module may
import its own floor and the floors below it. Every ``import`` statement counts, at module level or inside a
function (a lazy import is still a dependency), and importing ``vlkit.a.b`` also runs the package
``__init__`` files above it, so each package ``__init__`` is held to its own floor like any other module.
A circle is a set of modules of one floor that import one another (a strongly connected component). The
package root ``vlkit`` (its ``__init__``, the public facade) is on the bottom floor: it imports only that floor
and names the rest in a table it imports on first use, and no module of vlkit imports it (a module imports
the module that defines a name, e.g. ``vlkit.version`` for ``__version__``).

A string import is an arrow like any other: a string literal that names a vlkit module, whole
(``importlib.import_module("vlkit.models.base")``, a ``"vlkit.train.commands:pretrain"`` target in a table
such as the CLI's ``COMMANDS``), counts as an import of that module, wherever it stands, save a logger's name
(``logging.getLogger("vlkit.data")``); a name computed at run time (an f-string) is not seen: write it whole. The one declared exception is the package root's table of lazy
names (``vlkit/__init__``, the facade): its string targets name the rooms above it on purpose (the public names
they define, and the home package of each registry, see ``vlkit.registry``) and are listed, not held to its
floor; its ``import`` statements are.

The scripts of ``benchmarks/`` stand outside the floors, but each ``from vlkit.x import name`` there must
resolve: the module exists and defines ``name`` at its top level (or ``name`` is a submodule, or the module
has a ``__getattr__`` and names ``name`` in a string, its table of lazy names); ``import vlkit.x`` needs the
module.

The figures printed: rooms (the package root's modules and subpackages), floors, arrows (distinct
module -> module imports as the code names them; string imports among them), arrows up, circles.
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPT_FOLDERS = ("benchmarks",)  # folders of scripts whose vlkit imports must resolve
# a string literal naming a vlkit module (and perhaps a name in it): "vlkit.a.b", "vlkit.a.b.Name", "vlkit.a.b:func"
MODULE_STRING = re.compile(r"vlkit(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?")
LOGGER_CALLS = {"getLogger", "get_logger"}  # a logger's name ("vlkit.data") names no import


def read_floors(pyproject: Path = REPOSITORY / "pyproject.toml") -> list[list[str]]:
    """The floors of ``[tool.vlkit.layers]``, bottom first."""
    return tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["vlkit"]["layers"]["floors"]


def module_names(root: Path, package: str = "vlkit") -> dict[str, Path]:
    """Dotted module name -> file for every ``.py`` file of ``root/package``."""
    names = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> dict[str, str]:
    """The vlkit modules that ``name`` imports -> ``"code"`` (an import statement) or ``"string"`` (only a string
    literal names it, `MODULE_STRING`); a ``from a import b`` of a submodule ``b`` names ``a.b``."""
    is_package = path.name == "__init__.py"
    found: dict[str, str] = {}
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    logger_names = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
                    and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in LOGGER_CALLS
                    for arg in node.args}
    for node in ast.walk(tree):
        how = "code"
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value)
              and id(node) not in logger_names):
            how, targets = "string", [node.value.partition(":")[0]]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import vlkit.a.b.C`-style names: the module part
                target = target.rpartition(".")[0]
            if how == "string" and "." not in target:
                continue  # "vlkit.plugins" (an entry-point group) names no module; a string never names the root
            if target and found.get(target) != "code":
                found[target] = how
    found.pop(name, None)
    return found


def with_packages(target: str) -> set[str]:
    """``vlkit.a.b`` and the package ``__init__`` files that importing it runs (``vlkit``, ``vlkit.a``)."""
    parts = target.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def floor_of(module: str, floors: list[list[str]]) -> int:
    best, floor = -1, None
    for level, prefixes in enumerate(floors):
        for prefix in prefixes:
            # the package root names itself only; any other prefix names a module and what lies under it
            if (module == prefix or "." in prefix and module.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), level
    if floor is None:
        raise SystemExit(f"{module}: on no floor of [tool.vlkit.layers]; add its prefix to a floor")
    return floor


@dataclass
class Graph:
    floors: list[list[str]]
    modules: dict[str, int] = field(default_factory=dict)  # module -> floor
    edges: dict[str, set[str]] = field(default_factory=dict)  # module -> modules it imports (with packages)
    arrows: dict[str, dict[str, str]] = field(default_factory=dict)  # module -> {module it names: "code" | "string"}
    facade: list[str] = field(default_factory=list)  # modules that import the package root itself
    lazy: list[str] = field(default_factory=list)  # the modules the package root's table names (the exception)
    scripts: int = 0  # vlkit imports of the scripts checked (`SCRIPT_FOLDERS`)
    broken: list[str] = field(default_factory=list)  # those that do not resolve: "file:line: why"

    @property
    def rooms(self) -> list[str]:
        """The package root's modules and subpackages."""
        root = next(iter(self.modules))
        return sorted({m.split(".")[1] for m in self.modules if m != root})

    @property
    def strings(self) -> list[tuple[str, str]]:
        """The arrows only a string literal draws (the package root's lazy table left out)."""
        return sorted((a, b) for a, targets in self.arrows.items() for b, how in targets.items() if how == "string")

    @property
    def upward(self) -> list[tuple[str, str]]:
        return sorted((a, b) for a, targets in self.edges.items() for b in targets
                      if self.modules[b] > self.modules[a] and not a.startswith(b + "."))

    @property
    def circles(self) -> list[list[str]]:
        """Strongly connected components of more than one module (Tarjan), a package's own ``__init__``
        importing its children left out (the child runs the ``__init__`` first, not a circle in the code)."""
        edges = {a: {b for b in targets if not b.startswith(a + ".") and not a.startswith(b + ".")}
                 for a, targets in self.edges.items()}
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        components: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in sorted(edges[v]):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

        for v in sorted(edges):
            if v not in index:
                visit(v)
        return sorted(components)


def build_graph(root: Path = REPOSITORY, floors: list[list[str]] | None = None) -> Graph:
    floors = read_floors() if floors is None else floors
    files = module_names(root)
    graph = Graph(floors)
    package = next(iter(files))
    for name, path in files.items():
        graph.modules[name] = floor_of(name, floors)
        targets = imports_of(name, path, files)
        if name == package:  # the facade's lazy table: listed, not held to its floor
            graph.lazy = sorted(t for t, how in targets.items() if how == "string")
            targets = {t: how for t, how in targets.items() if how == "code"}
        if package in targets:
            graph.facade.append(name)
        graph.arrows[name] = targets
        graph.edges[name] = set().union(*(with_packages(t) for t in targets)) - {name}
    graph.scripts, graph.broken = check_scripts(root, files)
    return graph


def top_level_names(path: Path) -> tuple[set[str], bool]:
    """The names a module binds at its top level (definitions, assignments, imports, also under ``if`` / ``try``),
    and whether it has a module ``__getattr__`` (then its string literals count: its table of lazy names)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names: set[str] = set()
    lazy = False
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            lazy |= node.name == "__getattr__"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).partition(".")[0] for alias in node.names}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            body += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(s for handler in getattr(node, "handlers", []) for s in handler.body)]
    if lazy:
        names |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return names, lazy


def check_scripts(root: Path, modules: dict[str, Path]) -> tuple[int, list[str]]:
    """(how many vlkit imports the scripts of `SCRIPT_FOLDERS` hold, those that do not resolve)."""
    count, broken = 0, []
    for path in sorted(p for folder in SCRIPT_FOLDERS for p in (root / folder).glob("*.py")):
        where = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                wanted = [(alias.name, None) for alias in node.names if alias.name.partition(".")[0] == "vlkit"]
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").partition(".")[0] == "vlkit":
                wanted = [(node.module, alias.name) for alias in node.names]
            else:
                continue
            for module, name in wanted:
                count += 1
                if module not in modules:
                    broken.append(f"{where}:{node.lineno}: no module {module}")
                elif name and name != "*" and f"{module}.{name}" not in modules and name not in top_level_names(modules[module])[0]:
                    broken.append(f"{where}:{node.lineno}: {module} defines no {name}")
    return count, broken


def report(graph: Graph) -> str:
    root = next(iter(graph.modules))
    lines = [f"rooms: {len(graph.rooms)} ({', '.join(graph.rooms)})", f"floors (bottom first): {len(graph.floors)}"]
    for level, prefixes in enumerate(graph.floors):
        count = sum(1 for floor in graph.modules.values() if floor == level)
        lines.append(f"  {level}: {', '.join(prefixes)}  ({count} modules)")
    strings = graph.strings
    lines.append(f"arrows: {sum(map(len, graph.arrows.values()))} ({len(strings)} string imports)")
    lines += [f"  {a} -> {b} (string)" for a, b in strings]
    up = graph.upward
    lines.append(f"upward arrows: {len(up)}")
    lines += [f"  {a} (floor {graph.modules[a]}) -> {b} (floor {graph.modules[b]})" for a, b in up]
    circles = graph.circles
    lines.append(f"circles: {len(circles)}")
    lines += [f"  {' <-> '.join(c)}" for c in circles]
    lines.append(f"imports of the package root (the public facade): {len(graph.facade)}")
    lines += [f"  {name} -> {root}" for name in graph.facade]
    lines.append(f"modules the facade's lazy table names (the declared exception): {len(graph.lazy)}")
    lines.append(f"vlkit imports of {', '.join(f'{f}/' for f in SCRIPT_FOLDERS)}: {graph.scripts}, "
                 f"broken: {len(graph.broken)}")
    lines += [f"  {b}" for b in graph.broken]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPOSITORY, help="the directory holding vlkit/")
    args = parser.parse_args(argv)
    graph = build_graph(args.root)
    print(report(graph))
    return 1 if graph.upward or graph.circles or graph.facade or graph.broken else 0


if __name__ == "__main__":
    sys.exit(main())
