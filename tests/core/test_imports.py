"""The core imports no torch and has no import circle: every module of ``shadow/core`` imports alone in
a fresh interpreter, and the graph of the core's imports of itself (those under ``TYPE_CHECKING``
included: a circle there is still a circle for a reader and for a type checker) has no cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "shadow" / "core"
MODULES = sorted(p.stem for p in CORE.glob("*.py") if p.stem != "__init__")


def _core_imports(module: str) -> set[str]:
    """The core modules ``module`` imports, at any depth of its code."""
    tree = ast.parse((CORE / f"{module}.py").read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .x import ... / from . import x
                names = [node.module] if node.module else [a.name for a in node.names]
            elif node.module and node.module.startswith("shadow.core."):
                names = [node.module.removeprefix("shadow.core.")]
            else:
                continue
            out.update(n.split(".")[0] for n in names)
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix("shadow.core.").split(".")[0] for a in node.names
                       if a.name.startswith("shadow.core."))
    return out & set(MODULES)


def test_the_core_has_no_import_circle() -> None:
    graph = {m: _core_imports(m) for m in MODULES}
    assert graph["records"] == set(), "records is the leaf every other module may import"
    state: dict[str, str] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for n in sorted(graph[m]):
            assert state.get(n) != "open", "import circle: " + " -> ".join([*path, m, n])
            if n not in state:
                visit(n, [*path, m])
        state[m] = "done"

    for m in MODULES:
        if m not in state:
            visit(m, [])


@pytest.mark.parametrize("module", MODULES)
def test_each_core_module_imports_alone_without_torch(module: str) -> None:
    code = (f"import sys; import shadow.core.{module}; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'fla')); "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
