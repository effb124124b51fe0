"""Import cycles among the project's own modules: ``python -m devkit.cycles`` (in ``make lint``).

Every import statement in a module counts, wherever it stands: at the top, inside a function (a
lazy import), or under ``if TYPE_CHECKING:``. A cycle through any of them says that two modules
share something neither owns (a type, a helper); the way out is a module both import, or one
dependency turned around, not an import moved out of sight.

How an import names a module (as import-linter's graph does): ``import a.b.c`` and
``from a.b.c import name`` point at ``a.b.c``; ``from a.b import c`` at ``a.b.c`` when that is a
module and at ``a.b`` otherwise; relative imports are resolved from the importing module's package.
The parent packages an import runs on the way (``a``, ``a.b``) are not counted, and neither are
modules loaded by name (``importlib.import_module``). Imports of anything outside the scanned
packages are left out.

The cycles are the strongly connected components of that graph (Tarjan); each is printed on one
line as one cycle through it, every step with the file and line of its import.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupilot_common.entrypoint import OWN_PACKAGES

# The project's own top-level packages (pyproject.toml's [tool.importlinter] root_packages; the
# entry points' list, which a test keeps equal to it).
PACKAGES = tuple(sorted(OWN_PACKAGES))


@dataclass(frozen=True)
class Import:
    """One import of ``target`` by ``source``, at ``path``:``line``."""

    source: str
    target: str
    path: Path
    line: int


@dataclass(frozen=True)
class Graph:
    """The modules found (name → file) and, per importing module, its first import of each target."""

    modules: Mapping[str, Path]
    imports: Mapping[str, Mapping[str, Import]]

    @property
    def edge_count(self) -> int:
        return sum(len(targets) for targets in self.imports.values())


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` file under each package folder in ``root``."""
    found: dict[str, Path] = {}
    for package in packages:
        folder = root / package
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such package folder (run from the repository root)")
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if any(not part.isidentifier() for part in parts):
                continue  # not importable as a module (e.g. a folder with a dash)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _known(name: str, modules: Mapping[str, Path]) -> str | None:
    """``name`` or its longest prefix that is a scanned module (``a.b.func`` → ``a.b``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _base(module: str, path: Path, level: int) -> str | None:
    """The package a relative import of ``level`` dots in ``module`` starts from (None: above the top)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    up = level - 1
    if up > len(package) - 1:
        return None
    return ".".join(package[: len(package) - up])


def targets(
    node: ast.Import | ast.ImportFrom, *, module: str, path: Path, modules: Mapping[str, Path]
) -> set[str]:
    """The scanned modules one import statement of ``module`` points at."""
    found: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if (hit := _known(alias.name, modules)) is not None:
                found.add(hit)
        return found
    if node.level:
        base = _base(module, path, node.level)
        if base is None:
            return found
        origin = f"{base}.{node.module}" if node.module else base
    else:
        origin = node.module or ""
    for alias in node.names:
        submodule = f"{origin}.{alias.name}"
        if submodule in modules:
            found.add(submodule)
        elif (hit := _known(origin, modules)) is not None:
            found.add(hit)
    return found


def build(root: Path, packages: Iterable[str] = PACKAGES) -> Graph:
    """Parses every module under ``packages`` and records its imports of the others."""
    modules = module_files(root, packages)
    imports: dict[str, dict[str, Import]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_bytes(), filename=str(path))
        edges: dict[str, Import] = {}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in targets(node, module=module, path=path, modules=modules):
                seen = edges.get(target)
                if target != module and (seen is None or node.lineno < seen.line):
                    edges[target] = Import(module, target, path, node.lineno)
        imports[module] = edges
    return Graph(modules, imports)


def components(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph.modules):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph.imports.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.imports.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return sorted(found)


def cycle_through(graph: Graph, members: Sequence[str]) -> list[Import]:
    """A shortest cycle from the component's first module back to it, inside the component."""
    inside = set(members)
    start = members[0]
    came_by: dict[str, Import] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target, edge in sorted(graph.imports.get(node, {}).items()):
            if target not in inside:
                continue
            if target == start:
                steps = [edge]
                while steps[-1].source != start:
                    steps.append(came_by[steps[-1].source])
                return steps[::-1]
            if target not in came_by:
                came_by[target] = edge
                queue.append(target)
    raise AssertionError(f"{start}: no cycle inside its own component")  # Tarjan's components have one


def describe(graph: Graph, members: Sequence[str], root: Path) -> str:
    """One line: the cycle, each step with the file and line of its import, and the component's size."""
    steps = cycle_through(graph, members)
    text = " -> ".join(f"{step.source} ({_where(step, root)})" for step in steps) + f" -> {steps[0].source}"
    extra = len(members) - len(steps)
    tangled = f"; {extra} more module(s) in the same knot: {', '.join(sorted(set(members) - {s.source for s in steps}))}"
    return f"import cycle: {text}{tangled if extra else ''}"


def _where(step: Import, root: Path) -> str:
    try:
        shown = step.path.relative_to(root)
    except ValueError:
        shown = step.path
    return f"{shown}:{step.line}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.cycles",
        description="Fails on an import cycle among the project's modules (lazy and type-only imports counted).",
    )
    parser.add_argument("packages", nargs="*", default=list(PACKAGES), help="top-level packages to scan")
    parser.add_argument(
        "--root", type=Path, default=Path(), help="folder holding the packages (default: here)"
    )
    args = parser.parse_args(argv)
    root: Path = args.root
    try:
        graph = build(root, args.packages)
    except (FileNotFoundError, SyntaxError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    knots = components(graph)
    for members in knots:
        print(describe(graph, members, root))
    if knots:
        print(
            f"{len(knots)} import cycle(s) among {len(graph.modules)} modules: move what the modules share "
            "into a module both import, or turn one dependency around",
            file=sys.stderr,
        )
        return 1
    print(f"no import cycle among {len(graph.modules)} modules ({graph.edge_count} imports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
