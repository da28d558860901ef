"""vlkit's import graph against its layer order: the floors, every upward arrow and the import circles.

    python scripts/import_layers.py            # vlkit/ of this checkout; exit status 1 on an upward arrow or a circle
    python scripts/import_layers.py --root DIR # another tree laid out as DIR/vlkit/...

The order is written once, in ``pyproject.toml`` under ``[tool.vlkit.layers]``: ``floors`` lists the floors
bottom first, each a list of module prefixes (the longest prefix decides a module's floor). A module may
import its own floor and the floors below it. Every ``import`` statement counts, at module level or inside a
function (a lazy import is still a dependency), and importing ``vlkit.a.b`` also runs the package
``__init__`` files above it, so each package ``__init__`` is held to its own floor like any other module.
A circle is a set of modules of one floor that import one another (a strongly connected component). The
package root ``vlkit`` (its ``__init__``, the public facade) is on the bottom floor: it imports only that floor
and names the rest in a table it imports on first use, and no module of vlkit imports it (a module imports
the module that defines a name, e.g. ``vlkit.version`` for ``__version__``).
"""
from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPOSITORY = Path(__file__).resolve().parents[1]


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


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The vlkit modules that ``name`` imports (a ``from a import b`` of a submodule ``b`` names ``a.b``)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import vlkit.a.b.C`-style names: the module part
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    found.discard(name)
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
    facade: list[str] = field(default_factory=list)  # modules that import the package root itself

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
    root = next(iter(files))
    for name, path in files.items():
        graph.modules[name] = floor_of(name, floors)
        targets = imports_of(name, path, files)
        if root in targets:
            graph.facade.append(name)
        graph.edges[name] = set().union(*(with_packages(t) for t in targets)) - {name}
    return graph


def report(graph: Graph) -> str:
    lines = ["floors (bottom first):"]
    for level, prefixes in enumerate(graph.floors):
        count = sum(1 for floor in graph.modules.values() if floor == level)
        lines.append(f"  {level}: {', '.join(prefixes)}  ({count} modules)")
    up = graph.upward
    lines.append(f"upward arrows: {len(up)}")
    lines += [f"  {a} (floor {graph.modules[a]}) -> {b} (floor {graph.modules[b]})" for a, b in up]
    circles = graph.circles
    lines.append(f"circles: {len(circles)}")
    lines += [f"  {' <-> '.join(c)}" for c in circles]
    lines.append(f"imports of the package root (the public facade): {len(graph.facade)}")
    lines += [f"  {name} -> {next(iter(graph.modules))}" for name in graph.facade]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPOSITORY, help="the directory holding vlkit/")
    args = parser.parse_args(argv)
    graph = build_graph(args.root)
    print(report(graph))
    return 1 if graph.upward or graph.circles or graph.facade else 0


if __name__ == "__main__":
    sys.exit(main())
