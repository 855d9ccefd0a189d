"""Draw the import graph of ``shadow/`` from the code, and find its circles.

    python tools/import_graph.py            # writes docs/imports.md
    python tools/import_graph.py --check    # exit 1 when docs/imports.md differs from the code
    python tools/import_graph.py --stdout   # print it

Every ``import shadow...`` and ``from . import ...`` in a module counts, at any depth of its code:
imports under ``if TYPE_CHECKING:`` and inside functions too (a circle there is still one for a
reader and for a type checker). ``from pkg import name`` counts as an import of ``pkg.name`` when that
is a module, else of ``pkg``. A package's ``__init__`` counts as the package.

The page holds, per layer, a DOT drawing of the layers' arrows, each module's imports of shadow's
modules, and the circles: the strongly connected parts of the graph, inside each package and in all.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "shadow"
PAGE = ROOT / "docs" / "imports.md"

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: Path = PACKAGE, root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_name(p, root): p for p in sorted(package.rglob("*.py"))}


def _resolve(name: str, known: Mapping[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies in."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))


def _run_at_import(body: list[ast.stmt]) -> Iterable[ast.AST]:
    """The statements an import runs: the module's and its classes' bodies, not a function's, not
    ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _type_checking(node):
            continue
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody"):
                yield from _run_at_import(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                yield from _run_at_import(handler.body)
        elif isinstance(node, ast.ClassDef):
            yield from _run_at_import(node.body)


def imports_of(name: str, path: Path, known: Mapping[str, Path], runtime: bool = False) -> set[str]:
    """The modules of the package that module ``name`` imports (itself left out); with ``runtime``
    only those its import loads (not in functions, not under ``TYPE_CHECKING``)."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in (_run_at_import(tree.body) if runtime else ast.walk(tree)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
        for t in targets:
            got = _resolve(t, known)
            if got is not None and got != name:
                out.add(got)
    return out


def graph(package: Path = PACKAGE, root: Path = ROOT, runtime: bool = False) -> Graph:
    known = modules(package, root)
    return {name: imports_of(name, path, known, runtime) for name, path in known.items()}


def inside(g: Mapping[str, set[str]], prefix: str) -> Graph:
    """The graph's part inside one package (its modules and their arrows to each other)."""
    def within(m: str) -> bool:
        return m == prefix or m.startswith(prefix + ".")

    return {m: {n for n in targets if within(n)} for m, targets in g.items() if within(m)}


def circles(g: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected parts with more than one module (Tarjan's), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out, key=lambda c: (-len(c), c))


def closure(g: Mapping[str, set[str]], start: str) -> set[str]:
    """Every module ``import start`` loads, itself and the packages above each included (with the
    graph of ``runtime`` imports: what the interpreter's ``sys.modules`` then holds of the package)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(g.get(m, ()))
        parent = m.rpartition(".")[0]
        if parent:
            todo.append(parent)
    return seen


LAYERS = ("shadow.core", "shadow.backends.qwen35", "shadow.backends.stores", "shadow.backends.schedulers",
          "shadow.backends", "shadow.adapters", "shadow.api", "shadow.proxy", "shadow.cli", "shadow.container")
WATCHED = ("shadow.core", "shadow.backends.qwen35", "shadow.adapters", "shadow.api", "shadow.proxy")


def layer_of(module: str) -> str:
    for layer in LAYERS:
        if module == layer or module.startswith(layer + "."):
            return layer
    return "shadow"


def layer_arrows(g: Mapping[str, set[str]]) -> dict[str, set[str]]:
    arrows: dict[str, set[str]] = {}
    for m, targets in g.items():
        for t in targets:
            a, b = layer_of(m), layer_of(t)
            if a != b:
                arrows.setdefault(a, set()).add(b)
    return arrows


def page(g: Mapping[str, set[str]], loaded: Mapping[str, set[str]]) -> str:
    """The page: ``g`` has every import, ``loaded`` those an import runs (``graph(runtime=True)``)."""
    short = {m: m.removeprefix("shadow.") for m in g}
    lines = ["# The import graph", "",
             "Written by `python tools/import_graph.py` from the code (every import of a `shadow` module, those",
             "under `TYPE_CHECKING` and inside functions included); `tests/tools/test_import_graph.py` fails when",
             "this page differs from what the tool writes. Names drop the leading `shadow.`.", "",
             "## The layers", "", "```dot", "digraph layers {", "  rankdir=BT;"]
    for a, targets in sorted(layer_arrows(g).items()):
        for b in sorted(targets):
            lines.append(f'  "{a.removeprefix("shadow.")}" -> "{b.removeprefix("shadow.")}";')
    lines += ["}", "```", "", "## Circles", ""]
    for prefix in WATCHED:
        found = circles(inside(g, prefix))
        where = f"`{prefix.removeprefix('shadow.')}/`"
        if not found:
            lines.append(f"- inside {where}: none")
        for c in found:
            lines.append(f"- inside {where}: " + ", ".join(short[m] for m in c))
    found = circles(g)
    lines.append("- in all of `shadow/`: " + ("none" if not found else
                                            "; ".join(", ".join(short[m] for m in c) for c in found)))
    client = sorted(short[m] for m in closure(loaded, "shadow.api.client"))
    lines += ["", "## What the HTTP client loads", "", "`import shadow.api.client` loads these of shadow's modules"
              " (`tests/api/test_client_imports.py` checks it in a fresh interpreter): "
              + ", ".join(f"`{m}`" for m in client) + ".", "", "## Each module's imports", ""]
    for layer in LAYERS:
        members = sorted(m for m in g if layer_of(m) == layer)
        if not members:
            continue
        lines += [f"### {layer.removeprefix('shadow.')}", ""]
        for m in members:
            targets = ", ".join(short[t] for t in sorted(g[m])) or "(none)"
            lines.append(f"- `{short[m]}`: {targets}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the page differs from the code")
    ap.add_argument("--stdout", action="store_true", help="print the page instead of writing it")
    args = ap.parse_args(argv)
    text = page(graph(), graph(runtime=True))
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        same = PAGE.exists() and PAGE.read_text(encoding="utf-8") == text
        if not same:
            print(f"{PAGE.relative_to(ROOT)} differs from the code: run python tools/import_graph.py", file=sys.stderr)
        return 0 if same else 1
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
