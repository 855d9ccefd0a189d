"""The model's package imports in one direction: no circle among the modules of
``shadow/backends/qwen35`` (the fast path's parts and the attention backends included), counting
every import in the code, those made only for the type checker and those inside functions too. Until
issue 54 the fast path's seven files and the four attention files each formed a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import shadow

ROOT = Path(shadow.__file__).parent.parent
PACKAGE = ROOT / "shadow" / "backends" / "qwen35"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from pkg import module`` imports the module)."""
    modules = _modules()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            edges[name] |= {t for t in targets if t in modules and t != name}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_model_package_has_no_import_circle() -> None:
    edges = import_graph()
    assert "shadow.backends.qwen35.fast.forward" in edges and "shadow.backends.qwen35.attention.gluon_ws" in edges
    assert "shadow.backends.qwen35.fast.staging" in edges["shadow.backends.qwen35.fast.slots"]  # it sees imports
    assert circles(edges) == []


def test_a_circle_is_found() -> None:
    """The check can fail: the fast path's circle before issue 54, as its imports were."""
    before = {"fast": {"fork", "graphs", "slots"}, "fork": {"fast"}, "graphs": {"fast"}, "slots": {"fast"},
              "state": set()}
    assert circles(before) == [["fast", "fork", "graphs", "slots"]]
