"""tools/import_graph.py: the drawing in docs/imports.md is the code's, and the packages hold no
import circle, but those named in ``KNOWN_CIRCLES`` (report only: their owners restructure them, and
this test fails once one is gone, so that its entry goes too). The tool itself is checked on a
scratch package, where it must find the circles planted there."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.api.test_client_imports import CLIENT_SET

TOOL = Path(__file__).resolve().parents[2] / "tools" / "import_graph.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = module  # registered before it runs, as an import would
    spec.loader.exec_module(module)
    return module


ig = _tool()

# Circles that are known, each with who removes it: none left (issue 54: the fast path and the attention
# kernels as objects, the proxy's turn seeing its app through a Protocol, the index's registry apart).
KNOWN_CIRCLES: dict[str, list[list[str]]] = {}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = ig.graph()
    return g


def test_the_page_is_what_the_tool_writes_from_the_code(graph: dict[str, set[str]]) -> None:
    want = ig.page(graph, ig.graph(runtime=True))
    assert ig.PAGE.read_text(encoding="utf-8") == want, "docs/imports.md is stale: run python tools/import_graph.py"


@pytest.mark.parametrize("package", ["shadow.core", "shadow.adapters", "shadow.api", "shadow.backends.qwen35",
                                     "shadow.proxy"])
def test_no_circle_inside_a_package_but_the_known_ones(graph: dict[str, set[str]], package: str) -> None:
    found = ig.circles(ig.inside(graph, package))
    assert found == KNOWN_CIRCLES.get(package, []), (
        f"circles inside {package}: {found}; known: {KNOWN_CIRCLES.get(package, [])} "
        "(a new one is a defect; a known one gone: delete its entry)")


def test_the_client_loads_the_records_and_the_paths_only() -> None:
    assert ig.closure(ig.graph(runtime=True), "shadow.api.client") == CLIENT_SET


def test_the_tool_finds_a_circle_through_type_checking_and_functions(tmp_path: Path) -> None:
    pkg = tmp_path / "shadow"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from . import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n")
    (pkg / "sub" / "c.py").write_text("def late():\n    from shadow.sub.d import f\n")
    (pkg / "sub" / "d.py").write_text("import shadow.sub.c\nimport shadow.sub.e\n")
    (pkg / "sub" / "e.py").write_text("x = 1\n")
    g = ig.graph(pkg, tmp_path)
    assert g["shadow.sub.a"] == {"shadow.sub.b"} and g["shadow.sub.b"] == {"shadow.sub.a"}
    assert ig.circles(ig.inside(g, "shadow.sub")) == [["shadow.sub.a", "shadow.sub.b"],
                                                       ["shadow.sub.c", "shadow.sub.d"]]
    loaded = ig.graph(pkg, tmp_path, runtime=True)  # an import runs neither TYPE_CHECKING nor functions
    assert loaded["shadow.sub.b"] == set() and loaded["shadow.sub.c"] == set()
    assert ig.circles(loaded) == []
    assert ig.closure(loaded, "shadow.sub.d") == {"shadow", "shadow.sub", "shadow.sub.c", "shadow.sub.d",
                                                  "shadow.sub.e"}
