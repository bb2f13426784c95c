"""Fail on any import cycle among the modules of a package (src/finetune_studio by default).

Standard library only: every .py file under the package is parsed with `ast` and
each `import` and `from ... import` of a module of the package is an edge, wherever
it is written: at the top, inside a function (a lazy import), or under
`if TYPE_CHECKING:`. A cycle through a lazy import does not fail at import time,
but it is still two modules that each need the other. Relative imports are resolved;
a package is its `__init__.py`; `from pkg import name` is an edge to `pkg.name`
when that is a module, else to `pkg`. An import of a submodule is not counted as an
import of its parent packages (`pkg/__init__.py` running first is Python's doing,
not the importer's).

Each cycle is printed as the modules in order, the first repeated at the end, with
the file and line of each import; one cycle per module that lies on one (the
shortest through it), so a tangle of several is shown whole. Exit status: 0 when
there is none, 1 when there is one or more, 2 when the package cannot be read.

    python scripts/import_cycles.py [PACKAGE_DIR]
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from pathlib import Path

DEFAULT_PACKAGE = Path(__file__).resolve().parent.parent / "src" / "finetune_studio"

Edges = dict[str, dict[str, str]]  # importer -> imported -> where ("path:line")


def module_names(package: Path) -> dict[str, Path]:
    """Each module's dotted name (a package is its __init__) -> its file."""
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if any(not part.isidentifier() for part in parts[:-1]):
            continue  # a folder that is not a package name (e.g. __pycache__)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        elif not parts[-1].isidentifier():
            continue
        found[".".join(parts)] = path
    return found


def imported_by(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The package's modules that `name` imports -> the line of the first such import."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target in modules and target != name:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                if node.level - 1 > len(here) - 1:
                    continue  # beyond the top of the package: not one of its modules
                base_parts = here[: len(here) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if alias.name != "*" and submodule in modules:
                    add(submodule, node.lineno)
                else:
                    add(base, node.lineno)
    return found


def import_graph(package: Path) -> Edges:
    modules = module_names(package)
    edges: Edges = {}
    for name, path in modules.items():
        where = shown(path)
        edges[name] = {target: f"{where}:{line}" for target, line in imported_by(name, path, modules).items()}
    return edges


def shown(path: Path) -> str:
    """The path as the reader can open it: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def strongly_connected(edges: Edges) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges.get(nxt, {}))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def shortest_cycle(start: str, members: set[str], edges: Edges) -> list[str]:
    """The shortest path start -> ... -> start inside one component (breadth first)."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(edges[node]):
            if nxt not in members:
                continue
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is on no cycle of its component")  # a component always has one


def find_cycles(package: Path) -> tuple[Edges, list[list[str]]]:
    """The graph and its cycles: for each module on one, the shortest through it, each shown once."""
    edges = import_graph(package)
    cycles: list[list[str]] = []
    for component in strongly_connected(edges):
        members = set(component)
        covered: set[str] = set()
        seen: set[tuple[str, ...]] = set()
        for module in component:
            if module in covered:
                continue
            cycle = shortest_cycle(module, members, edges)
            covered.update(cycle)
            # The same cycle found from another of its modules: start it at its smallest name.
            ring = cycle[:-1]
            first = ring.index(min(ring))
            canonical = (*ring[first:], *ring[:first])
            if canonical not in seen:
                seen.add(canonical)
                cycles.append([*canonical, canonical[0]])
    return edges, cycles


def describe(cycle: list[str], edges: Edges) -> str:
    lines = [" -> ".join(cycle)]
    for importer, imported in zip(cycle, cycle[1:], strict=False):
        lines.append(f"    {importer} imports {imported} ({edges[importer][imported]})")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    package = Path(argv[1]) if len(argv) > 1 else DEFAULT_PACKAGE
    if not (package / "__init__.py").is_file():
        print(f"{package} is not a package (no __init__.py)", file=sys.stderr)
        return 2
    try:
        edges, cycles = find_cycles(package)
    except SyntaxError as exc:
        print(f"cannot parse {exc.filename}:{exc.lineno}: {exc.msg}", file=sys.stderr)
        return 2
    if not cycles:
        print(f"no import cycles among the {len(edges)} modules of {package.name}")
        return 0
    print(f"{len(cycles)} import cycle{'s' if len(cycles) != 1 else ''} among the modules of {package.name}:")
    for cycle in cycles:
        print(describe(cycle, edges))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
