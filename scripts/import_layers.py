"""vlkit's import graph against its layer order: the floors, every upward arrow and the import circles.

    python scripts/import_layers.py            # vlkit/ of this checkout; exit status 1 on an upward arrow, a circle (of
                                               # modules or of rooms), an import of the package root, a stranger,
                                               # more unexplained function-level imports than allowed or a broken
                                               # import of benchmarks/
    python scripts/import_layers.py --root DIR # another tree laid out as DIR/vlkit/... (and DIR/benchmarks/)
    python scripts/import_layers.py --lazy     # also list every function-level import of a vlkit module, with its reason

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

Three more checks hold the rooms apart:

- A circle of rooms: rooms of one floor (``vlkit.data`` and ``vlkit.features``, say) that import one another,
  whichever modules do it: each pair of rooms on a floor is one-way, so no circle between folders comes back
  even where no two modules import each other.
- A stranger: a module of a package listed under ``[tool.vlkit.layers.cohesive]`` that imports nothing of that
  package: it knows nothing of what the package is about and belongs elsewhere (``compare/`` holds the runner,
  the plan of units, the account and the report, not a statistics library or a FLOP engine). The modules the
  rest of the package stands on (which import none of it by nature) are listed there as its roots.
- Function-level imports of vlkit modules (``def f(): from vlkit.x import y``): each needs a stated reason,
  an optional dependency or start-up cost, as a comment on its line or in `LAZY_REASONS` (the imported module,
  or the importing one, and why). The count of those without one may not grow past ``lazy_imports`` of
  ``[tool.vlkit.layers]``; ``--lazy`` lists every function-level import with its reason.

The figures printed: rooms (the package root's modules and subpackages), floors, arrows (distinct
module -> module imports as the code names them; string imports among them), arrows up, circles, circles of
rooms, strangers and function-level imports.
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

# Why a function imports a vlkit module instead of its module doing so at the top: the imported module (or a prefix)
# and the optional dependency or start-up cost it brings ...
LAZY_TARGETS = {
    "vlkit.features.detector": "torchvision: only when features are extracted or a detector converted",
}
# ... or the importing module and why it stays light.
LAZY_IMPORTERS = {
    "vlkit.cli": "start-up cost: the console parses and answers --help before any command's modules load",
}


def read_layers(pyproject: Path = REPOSITORY / "pyproject.toml") -> dict:
    """The table ``[tool.vlkit.layers]``: ``floors``, ``cohesive`` (package -> its roots), ``lazy_imports``."""
    return tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["vlkit"]["layers"]


def read_floors(pyproject: Path = REPOSITORY / "pyproject.toml") -> list[list[str]]:
    """The floors of ``[tool.vlkit.layers]``, bottom first."""
    return read_layers(pyproject)["floors"]


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
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            targets = imports_of_node(name, is_package, node, modules)
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


@dataclass(frozen=True)
class FunctionImport:
    """An import statement of vlkit modules inside a function: where, what, and the reason it states (None: none)."""

    importer: str
    line: int
    targets: tuple[str, ...]
    reason: str | None

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} -> {', '.join(self.targets)}" + (f"  ({self.reason})" if self.reason else "")


def function_imports(name: str, path: Path, modules: dict[str, Path]) -> list[FunctionImport]:
    """The imports of vlkit modules that ``name`` makes inside its functions, each with its stated reason: the
    comment on its line, else `LAZY_TARGETS` / `LAZY_IMPORTERS`."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text, str(path))
    seen: set[int] = set()
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in seen:
                continue
            seen.add(id(node))
            targets = tuple(imports_of_node(name, path.name == "__init__.py", node, modules))
            if not targets:
                continue
            comment = " ".join(line.partition("#")[2].strip() for line in lines[node.lineno - 1:node.end_lineno])
            reason = comment.strip() or next((why for prefix, why in LAZY_TARGETS.items() for target in targets
                                              if target == prefix or target.startswith(prefix + ".")),
                                             LAZY_IMPORTERS.get(name))
            found.append(FunctionImport(name, node.lineno, targets, reason))
    return sorted(found, key=lambda f: f.line)


def imports_of_node(name: str, is_package: bool, node: ast.AST, modules: dict[str, Path]) -> list[str]:
    """The vlkit modules an ``import`` / ``from ... import`` statement of module ``name`` names."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = name.split(".") if is_package else name.split(".")[:-1]
            anchor = anchor[:len(anchor) - node.level + 1]
            base = ".".join([*anchor, *([base] if base else [])])
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    out = []
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target not in out:
            out.append(target)
    return out


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
    cohesive: dict[str, list[str]] = field(default_factory=dict)  # package -> its roots (`strangers`)
    function_imports: list[FunctionImport] = field(default_factory=list)  # imports of vlkit modules inside functions
    lazy_ceiling: int | None = None  # most function-level imports without a reason allowed (``lazy_imports``)
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
        """Strongly connected components of more than one module, a package's own ``__init__`` importing its
        children left out (the child runs the ``__init__`` first, not a circle in the code)."""
        return strongly_connected({a: {b for b in targets if not b.startswith(a + ".") and not a.startswith(b + ".")}
                                   for a, targets in self.edges.items()})

    @property
    def room_circles(self) -> list[list[str]]:
        """Rooms (the package root's subpackages and modules) that import one another, whichever of their modules
        do: the module graph with each room's modules taken as one."""
        edges: dict[str, set[str]] = {}
        for a, targets in self.edges.items():
            if room_of(a):
                edges.setdefault(room_of(a), set()).update(room_of(b) for b in targets if room_of(b) not in (None, room_of(a)))
        return strongly_connected(edges)

    @property
    def strangers(self) -> list[str]:
        """Modules of a cohesive package (``[tool.vlkit.layers.cohesive]``) that import nothing of it, its listed
        roots and its ``__init__`` aside; a listed root that is not a module of the package is named too."""
        out = []
        for package, roots in self.cohesive.items():
            out += [f"{root}: listed as a root of {package} but not a module of it" for root in roots
                    if root not in self.modules or not root.startswith(package + ".")]
            out += [module for module in self.modules if module.startswith(package + ".") and module not in roots
                    and not any(b.startswith(package + ".") for b in self.arrows[module])]
        return sorted(out)

    @property
    def unexplained(self) -> list[FunctionImport]:
        """The function-level imports of vlkit modules that state no reason."""
        return [f for f in self.function_imports if f.reason is None]

    @property
    def too_lazy(self) -> bool:
        """More unexplained function-level imports than ``lazy_imports`` allows."""
        return self.lazy_ceiling is not None and len(self.unexplained) > self.lazy_ceiling


def room_of(module: str) -> str | None:
    """``vlkit.data`` for ``vlkit.data.images`` (and ``vlkit.io`` for itself); None for the package root."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node of the graph ``edges`` (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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


def build_graph(root: Path = REPOSITORY, floors: list[list[str]] | None = None, pyproject: Path | None = None) -> Graph:
    """The graph of ``root``/vlkit against the layers of ``pyproject`` (this checkout's; ``floors`` replaces its
    floors)."""
    layers = read_layers(pyproject or REPOSITORY / "pyproject.toml")
    floors = layers["floors"] if floors is None else floors
    files = module_names(root)
    graph = Graph(floors, cohesive=layers.get("cohesive", {}), lazy_ceiling=layers.get("lazy_imports"))
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
        graph.function_imports += function_imports(name, path, files)
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


def report(graph: Graph, lazy: bool = False) -> str:
    """The figures, each problem named; ``lazy``: every function-level import with its reason, not only those
    without one."""
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
    room_circles = graph.room_circles
    lines.append(f"circles of rooms: {len(room_circles)}")
    lines += [f"  {' <-> '.join(c)}" for c in room_circles]
    strangers = graph.strangers
    lines.append(f"strangers (modules of {', '.join(graph.cohesive) or 'no package'} that import nothing of it): "
                 f"{len(strangers)}")
    lines += [f"  {s}" for s in strangers]
    unexplained = graph.unexplained
    ceiling = "" if graph.lazy_ceiling is None else f", at most {graph.lazy_ceiling} allowed"
    lines.append(f"function-level imports of vlkit modules: {len(graph.function_imports)}, "
                 f"{len(unexplained)} without a stated reason{ceiling}")
    lines += [f"  {f}" for f in (graph.function_imports if lazy else unexplained)]
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
    parser.add_argument("--lazy", action="store_true", help="list every function-level import with its reason")
    args = parser.parse_args(argv)
    graph = build_graph(args.root)
    print(report(graph, args.lazy))
    return 1 if (graph.upward or graph.circles or graph.room_circles or graph.strangers or graph.too_lazy
                 or graph.facade or graph.broken) else 0


if __name__ == "__main__":
    sys.exit(main())
