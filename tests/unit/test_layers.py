"""The package's import graph, function-level imports included, has no cycle.

A cycle held together by imports inside functions works until someone moves one of them; then
the package stops importing. Modules import downwards only (see DESIGN.md's layers).
"""

from __future__ import annotations

import ast
import os

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src", "lowband")


def module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(SRC))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def imports_of(path: str, known: set[str]) -> set[str]:
    """The lowband modules `path` imports anywhere in its body (a package import names its __init__)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m in known}


def graph() -> dict[str, set[str]]:
    paths = [os.path.join(d, f) for d, _, files in os.walk(SRC) for f in files if f.endswith(".py")]
    known = {module_name(p) for p in paths}
    edges = {module_name(p): imports_of(p, known) for p in paths}
    for name in edges:  # importing a.b.c runs a/__init__ and a/b/__init__ first
        edges[name] = {m for m in edges[name] if m != name}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)

