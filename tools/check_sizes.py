"""Fail when a tracked text file outside the data folders is over 256 KB.

    python tools/check_sizes.py [--limit-kb N]

A bad scripted edit once grew benchmarks/README.md to 4.5 MB by repeating one paragraph; this
check (part of `make lint`) stops that from being committed again. Data is allowed to be large:
the package's data folder, test data, benchmark results and binary files (a NUL byte in the first
8 KB) are skipped.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_PREFIXES = ("shadow/data/", "tests/data/", "benchmarks/results/")
DATA_SUFFIXES = (".safetensors", ".bin", ".pt", ".npy", ".npz", ".gguf", ".parquet")


def is_data(path: str) -> bool:
    return path.startswith(DATA_PREFIXES) or path.endswith(DATA_SUFFIXES)


def is_binary(path: Path) -> bool:
    with path.open("rb") as f:
        return b"\0" in f.read(8192)


def oversized(limit: int) -> list[tuple[str, int]]:
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode().split("\0")
    found = []
    for name in filter(None, tracked):
        path = ROOT / name
        if is_data(name) or not path.is_file():
            continue
        size = path.stat().st_size
        if size > limit and not is_binary(path):
            found.append((name, size))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-kb", type=int, default=256)
    args = parser.parse_args()
    found = oversized(args.limit_kb * 1024)
    for name, size in found:
        print(f"{name}: {size:,} bytes, over the {args.limit_kb} KB limit for a tracked text file "
              f"outside the data folders ({', '.join(DATA_PREFIXES)})", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
