"""Fail on a file too large to read: a Python file in ``shadow/`` or ``benchmarks/`` over 450 lines,
a text file outside the data folders over 256 KB, or a trace kept with the benchmarks' results
(``*.trace.jsonl``, ``*.jsonl``) over 100 KB.

    python tools/check_sizes.py [--max-lines N] [--limit-kb N] [--root DIR]

The line limit is the project's rule for its package and its benchmarks (small modules, one job
each: a benchmark's parts sit in its package beside its ``run.py``); a file allowed
past it would be named in ``LONG_FILES`` with the reason and the issue that removes it (none is). A bad
scripted edit once grew benchmarks/README.md to 4.5 MB by repeating one paragraph; the size limit
stops that. Data is allowed to be large: the package's data folder, test data, benchmark results and
binary files (a NUL byte in the first 8 KB) are skipped; but a span trace kept with a result is read
by a person, who wants its summary, not a megabyte of spans. Files git tracks or would track (untracked
but not ignored) are checked, so a new file fails before its commit, not after.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 450
# exceptions to the line limit: none since issue 18 split the fast path (fast.py, graphs.py, staging.py)
LONG_FILES: dict[str, str] = {}
DATA_PREFIXES = ("shadow/data/", "tests/data/", "benchmarks/results/")
DATA_SUFFIXES = (".safetensors", ".bin", ".pt", ".npy", ".npz", ".gguf", ".parquet")
LINE_RULED = ("shadow/", "benchmarks/")  # folders whose Python files keep to MAX_LINES
TRACE_KB = 100  # a trace kept under benchmarks/results: a summary beyond this


def is_trace(path: str) -> bool:
    return path.startswith("benchmarks/results/") and path.endswith(".jsonl")


def is_data(path: str) -> bool:
    return path.startswith(DATA_PREFIXES) or path.endswith(DATA_SUFFIXES)


def is_binary(path: Path) -> bool:
    with path.open("rb") as f:
        return b"\0" in f.read(8192)


def files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout.decode()
    return sorted({name for name in out.split("\0") if name and (root / name).is_file()})


def oversized(root: Path, names: list[str], limit: int) -> list[tuple[str, int]]:
    found = []
    for name in names:
        path = root / name
        if is_data(name):
            continue
        size = path.stat().st_size
        if size > limit and not is_binary(path):
            found.append((name, size))
    return found


def traces(root: Path, names: list[str], limit: int) -> list[tuple[str, int]]:
    return [(name, size) for name in names if is_trace(name) and (size := (root / name).stat().st_size) > limit]


def overlong(root: Path, names: list[str], max_lines: int) -> list[tuple[str, int]]:
    found = []
    for name in names:
        if name.startswith(LINE_RULED) and name.endswith(".py") and name not in LONG_FILES:
            with (root / name).open("rb") as f:
                lines = sum(1 for _ in f)
            if lines > max_lines:
                found.append((name, lines))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-lines", type=int, default=MAX_LINES)
    parser.add_argument("--limit-kb", type=int, default=256)
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    names = files(args.root)
    long_ = overlong(args.root, names, args.max_lines)
    big = oversized(args.root, names, args.limit_kb * 1024)
    kept = traces(args.root, names, TRACE_KB * 1024)
    for name, lines in long_:
        print(f"{name}: {lines} lines, over the {args.max_lines}-line limit for a Python file in "
              f"{' or '.join(LINE_RULED)} (split it by job; the only exception is {', '.join(LONG_FILES)})",
              file=sys.stderr)
    for name, size in big:
        print(f"{name}: {size:,} bytes, over the {args.limit_kb} KB limit for a text file "
              f"outside the data folders ({', '.join(DATA_PREFIXES)})", file=sys.stderr)
    for name, size in kept:
        print(f"{name}: {size:,} bytes, over the {TRACE_KB} KB limit for a trace kept with a result "
              "(keep its summary: python -m benchmarks.ab_cost.spans TRACE)", file=sys.stderr)
    return 1 if long_ or big or kept else 0


if __name__ == "__main__":
    sys.exit(main())
