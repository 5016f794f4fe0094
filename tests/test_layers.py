"""The floor plan holds: imports point down, the only upward ones are declared, and nothing is circular.

Read off the source with ``ast`` (lazy imports inside functions included),
against the table in ``topos/layers.py``. Every failure names the file, the
line and the edge. ``python tests/test_layers.py`` prints the figures:
modules per room, imports, lazy imports, hooks, cycles, largest modules.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from topos.layers import DOORS, FACADE_HELPERS, HOOKS, ROOMS, room_of

ROOT = Path(__file__).resolve().parents[1]
FACADES = {"topos.nn", "topos.optim", "topos.init", "topos.checkpoint"}


def _module_name(path: Path) -> str:
    if path.is_relative_to(ROOT / "dialect"):
        parts = ("topos", "dialect", *path.relative_to(ROOT / "dialect").with_suffix("").parts)
    else:
        parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    """Every module of the package (topos/ and dialect/, which installs as topos.dialect) -> its file."""
    found = {}
    for folder in ("topos", "dialect"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found[_module_name(path)] = path
    return found


class Import(NamedTuple):
    importer: str
    imported: str
    names: tuple[str, ...]  # the names taken from ``imported`` (empty when the module itself is imported)
    path: Path
    line: int
    lazy: bool  # inside a function: runs at the call, not when the importer loads

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _enclosing(node: ast.AST, parents: dict) -> tuple[bool, bool]:
    """(inside a function, inside ``if TYPE_CHECKING:``)."""
    lazy = typing_only = False
    while node in parents:
        node = parents[node]
        lazy |= isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        typing_only |= isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
    return lazy, typing_only


@functools.cache
def imports() -> tuple[Import, ...]:
    """Every import of a topos module by a topos module; imports only a type checker runs are left out."""
    known = modules()
    found = []
    for importer, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        parents = _parents(tree)
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            lazy, typing_only = _enclosing(node, parents)
            if typing_only:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "topos":
                        found.append(Import(importer, _deepest(alias.name, known), (), path, node.lineno, lazy))
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.split(".")[0] != "topos":
                continue
            taken: dict[str, list[str]] = defaultdict(list)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    taken[f"{base}.{alias.name}"]
                else:
                    taken[_deepest(base, known)].append(alias.name)
            for module, names in taken.items():
                found.append(Import(importer, module, tuple(names), path, node.lineno, lazy))
    return tuple(found)


def _deepest(name: str, known) -> str:
    while name not in known and "." in name:
        name = name.rpartition(".")[0]
    return name


def _layer(module: str) -> str:
    return ROOMS[room_of(module)].layer


def _upward(edge: Import) -> bool:
    return room_of(edge.imported) > room_of(edge.importer)


def _declared(edge: Import) -> bool:
    return any(edge.importer == h.importer and edge.imported == h.imported for h in HOOKS)


def _packages(module: str, importer: str = "") -> list[str]:
    """The packages Python runs before ``module`` for ``importer``: its ancestors, but the root door (which
    loads first) and those holding ``importer`` (already running when it imports a sibling)."""
    parts = module.split(".")
    ancestors = [".".join(parts[:k]) for k in range(2, len(parts))]
    return [p for p in ancestors if not importer.startswith(p + ".")]


def _cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative).

    Importing ``a.b.c`` runs ``a.b/__init__.py`` first, so an edge to a module
    is an edge to each package above it too.
    """
    graph: dict[str, set[str]] = defaultdict(set)
    known = modules()
    for edge in edges:
        for target in (*_packages(edge.imported, edge.importer), edge.imported):
            if edge.importer != target and target in known:
                graph[edge.importer].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe_cycles(cycles, edges) -> str:
    lines = []
    for component in cycles:
        members = set(component)
        lines.append(f"cycle of {len(component)} modules: {', '.join(component)}")
        lines += [f"  {e.where()}: {e.importer} -> {e.imported}" for e in edges
                  if e.importer in members and e.importer != e.imported
                  and any(t in members for t in (*_packages(e.imported, e.importer), e.imported))]
    return "\n".join(lines)


def test_every_module_has_a_room():
    for module in modules():
        room_of(module)  # a KeyError names the module and the table to add it to


def test_no_import_points_to_a_higher_layer_except_the_declared_hooks():
    bad = []
    for edge in imports():
        if not _upward(edge):
            continue
        if not _declared(edge):
            bad.append(f"{edge.where()}: {edge.importer} ({_layer(edge.importer)}) imports {edge.imported} "
                       f"({_layer(edge.imported)}), a higher room; move the code down, or declare a hook in "
                       "topos/layers.py if this is a convenience method")
        elif not edge.lazy:
            bad.append(f"{edge.where()}: the hook {edge.importer} -> {edge.imported} imports when its module "
                       "loads; a hook imports inside its method")
    assert not bad, "\n".join(bad)


def test_every_declared_hook_is_used():
    edges = {(e.importer, e.imported) for e in imports()}
    stale = [h for h in HOOKS if (h.importer, h.imported) not in edges]
    assert not stale, f"hooks in topos/layers.py that no import uses any more: {stale}"


def test_no_import_cycle_when_modules_load():
    edges = [e for e in imports() if not e.lazy]
    cycles = _cycles(edges)
    assert not cycles, _describe_cycles(cycles, edges)


def test_no_import_cycle_at_run_time_outside_the_hooks():
    edges = [e for e in imports() if not _declared(e)]
    cycles = _cycles(edges)
    assert not cycles, _describe_cycles(cycles, edges)


def test_no_module_imports_another_modules_underscore_names():
    bad = [f"{e.where()}: {e.importer} imports {name} from {e.imported}"
           for e in imports() for name in e.names
           if name.startswith("_") and not name.startswith("__") and e.importer != e.imported]
    assert not bad, "\n".join(bad) + "\nmake the name public where it is defined, or move what needs it beside it"


COLUMNS = {"_opcodes", "_operands", "_attributes", "_specs", "_sites", "_payloads", "_names", "_state", "_required",
           "_nexts", "_slots", "_inputs", "_by_name"}
OWNERS = {"topos.spec.network", "topos.spec.tape", "topos.spec.parameters"}  # each reads its own fields


def test_readings_walk_the_spec_through_its_documented_reader():
    """No module but the spec's own reads a network's or a tape's private columns: ``.columns`` is the reader."""
    bad = []
    for module, path in modules().items():
        if module in OWNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in COLUMNS and ast.unparse(node.value) != "self":
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}; read .columns."
                           f"{node.attr[1:]} (topos.spec.network.Columns) instead")
    assert not bad, "\n".join(bad)


def test_import_topos_loads_no_mlir_iree_jax_or_torch():
    code = ("import sys, topos, topos.nn; "
            "print(sorted(m for m in sys.modules if m.startswith(('iree', 'topos.dialect', 'jax', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_facades_import_only_the_public_surface_and_the_listed_helpers():
    """Rule 5, read off the source: a facade imports exported names, another facade, or FACADE_HELPERS."""
    import topos

    exported = set(topos.__all__)
    bad = []
    for edge in imports():
        if room_of(edge.importer) != room_of("topos.nn") or edge.imported in DOORS and edge.imported != "topos":
            continue
        if edge.imported == "topos":
            if not set(edge.names) <= exported:
                bad.append(f"{edge.where()}: imports {sorted(set(edge.names) - exported)} from topos, not exported")
        elif any(edge.imported == f or edge.imported.startswith(f + ".") for f in FACADES):
            continue  # another facade (optim reuses nn's argument checks; modules draw from init)
        elif edge.imported not in FACADE_HELPERS or not set(edge.names) <= FACADE_HELPERS[edge.imported]:
            allowed = FACADE_HELPERS.get(edge.imported, frozenset())
            bad.append(f"{edge.where()}: imports {sorted(set(edge.names) - allowed) or 'the module'} from "
                       f"{edge.imported}; a facade uses the public surface (topos.__all__) or FACADE_HELPERS")
    assert not bad, "\n".join(bad)


def report() -> str:
    """The floor plan's figures, as the architecture issue asks for them."""
    known = modules()
    edges = imports()
    lines = ["modules per room:"]
    counts: dict[int, int] = defaultdict(int)
    for module in known:
        counts[room_of(module)] += 1
    for k, room in enumerate(ROOMS):
        lines.append(f"  {room.layer:<9} {', '.join(room.modules):<45} {counts[k]}")
    statements = {(e.path, e.line) for e in edges if e.importer != e.imported}
    lazy = {(e.path, e.line) for e in edges if e.lazy and e.importer != e.imported}
    upward = [e for e in edges if _upward(e)]
    lines.append(f"import statements between topos modules: {len(statements)}, lazy: {len(lazy)}")
    lines.append(f"upward imports: {len(upward)} (declared hooks: {len(HOOKS)})")
    load = _cycles([e for e in edges if not e.lazy])
    run = _cycles([e for e in edges if not _declared(e)])
    lines.append(f"cycles when loading: {[len(c) for c in load]}; at run time outside the hooks: "
                 f"{[len(c) for c in run]}")
    sizes = sorted(((len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in known.values()), reverse=True)
    lines.append("largest modules: " + ", ".join(f"{name} {n}" for n, name in sizes[:5]))
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
