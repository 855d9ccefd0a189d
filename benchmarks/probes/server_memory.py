"""Where a serving process's memory goes: runs ``shadow <args>`` (``serve``) with a sampler thread
that appends one JSON line every ``SHADOW_MEMORY_EVERY_S`` seconds (30) to ``SHADOW_MEMORY_LOG``.

    SHADOW_MEMORY_LOG=mem.jsonl python -m benchmarks.probes.server_memory serve
    python -m benchmarks.soak --minutes 45 --memory-log   # the soak launches its server this way

Why: the soak saw the server's RSS rise by 23-43 MiB an hour after warm-up with glibc's arenas
capped (``shadow/adapters/allocator.py``). RSS alone cannot say whether Python objects pile up or
the C heap fragments. Each line holds:

- ``rss``: resident bytes (``/proc/self/statm``);
- ``malloc``: glibc's ``mallinfo2()``, all arenas: ``arena`` (heap bytes got by brk and in the other
  arenas), ``hblkhd`` (bytes in mmapped blocks), ``uordblks`` (in use), ``fordblks`` (free inside
  the heap, which RSS still counts where touched), ``keepcost`` (releasable at the top);
- ``maps``: where the resident bytes lie (``/proc/self/smaps``): anonymous and file-backed KiB, and
  each mapping holding at least 1 MiB by its address range and name, so that a region outside
  glibc's heap that grows shows itself;
- ``pymalloc``: Python's small-object allocator (``sys._debugmallocstats``): arenas held, bytes in
  blocks in use and free inside them, unused pools, and per size class the pools, blocks in use and
  blocks free; where the arenas grow while the bytes in use do not, a size class whose free blocks
  grow says which objects fragment them (the call writes to fd 2: for that instant the server's own
  stderr lines land in the sample's scratch file and are lost);
- ``objects``: objects the garbage collector tracks, and the 12 types that grew most since the
  baseline, the first line at least ``SHADOW_MEMORY_BASELINE_S`` seconds (300) in: after warm-up,
  so that what the imports and the model's load made does not hide what piles up later;
- ``traced``: with ``SHADOW_MEMORY_TRACE=N`` (tracemalloc started at the baseline, N frames), or
  ``PYTHONTRACEMALLOC=N`` (from launch), the bytes Python's allocator holds, and the 8 source lines
  (N = 1) or call paths (N > 1, innermost 6 frames) whose holdings grew most since the baseline.

A probe, not part of shadow: nothing in the package imports it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from collections import Counter
from typing import Any


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def mallinfo() -> dict[str, int] | None:
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None  # not glibc, or older than 2.33
    fn.restype = _Mallinfo2
    m = fn()
    return {n: int(getattr(m, n)) for n in ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maps() -> dict[str, Any] | None:
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    anon = file = 0
    big: dict[str, int] = {}
    name, backed = "", False
    for line in lines:
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line
            name = head[0] + (" " + head[5] if len(head) > 5 else "")
            backed = len(head) > 5 and head[5].startswith("/")
        elif head[:1] == ["Rss:"]:
            kb = int(head[1])
            if backed:
                file += kb
            else:
                anon += kb
            if kb >= 1024:
                big[name] = kb
    return {"anon_kb": anon, "file_kb": file, "big": big}


def _pymalloc() -> dict[str, Any] | None:
    import tempfile

    with tempfile.TemporaryFile("w+") as scratch:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(scratch.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        scratch.seek(0)
        text = scratch.read()
    classes: dict[str, list[int]] = {}
    totals: dict[str, int] = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) == 5 and all(c.isdigit() for c in cells):  # class size pools in-use free
            classes[cells[1]] = [int(c) for c in cells[2:]]
        elif line.startswith("# ") and "=" in line:
            key, _, value = line[2:].partition("=")
            totals[key.strip()] = int(value.strip().replace(",", ""))
        elif "unused pools *" in line:
            totals["unused pools"] = int(cells[0])
    if not classes:
        return None
    return {"totals": totals, "classes": classes}


def _types() -> Counter[str]:
    return Counter(type(o).__qualname__ for o in gc.get_objects())


class Sampler:
    def __init__(self, path: str, every_s: float, baseline_s: float, trace_frames: int = 0) -> None:
        self.path, self.every_s, self.baseline_s, self.trace_frames = path, every_s, baseline_s, trace_frames
        self.t0 = time.monotonic()
        self.first_types: Counter[str] | None = None
        self.first_snapshot: tracemalloc.Snapshot | None = None

    def sample(self) -> dict[str, Any]:
        types = _types()
        t = time.monotonic() - self.t0
        if self.first_types is None and t >= self.baseline_s:
            self.first_types = types
            if self.trace_frames and not tracemalloc.is_tracing():
                # Started here, not at launch: what it then holds was allocated after warm-up and is
                # still alive, and the import and the model's load pay no tracing.
                tracemalloc.start(self.trace_frames)
        grew = (types - self.first_types).most_common(12) if self.first_types is not None else []
        line: dict[str, Any] = {"t_s": round(t, 1), "rss": _rss(), "malloc": mallinfo(), "maps": _maps(),
                                "pymalloc": _pymalloc(), "objects": {"total": sum(types.values()), "grew": dict(grew)}}
        if tracemalloc.is_tracing() and self.first_types is not None:
            snap = tracemalloc.take_snapshot()
            if self.first_snapshot is None:
                self.first_snapshot = snap
            # With more than one frame traced (PYTHONTRACEMALLOC=N), whole call paths: a line that grows
            # is often generic (a list's extend), and who called it is the finding.
            deep = tracemalloc.get_traceback_limit() > 1
            top = snap.compare_to(self.first_snapshot, "traceback" if deep else "lineno")[:8]
            line["traced"] = {"bytes": tracemalloc.get_traced_memory()[0],
                              "grew": [{"where": [str(f) for f in s.traceback[-6:]], "bytes": s.size_diff,
                                        "count": s.count_diff} for s in top]}
        return line

    def run(self) -> None:
        while True:
            line = self.sample()
            try:
                with open(self.path, "a") as f:
                    f.write(json.dumps(line) + "\n")
            except OSError:  # the soak's disk-full window (RLIMIT_FSIZE): this line is lost, not the sampler
                pass
            time.sleep(self.every_s)


def main() -> int:
    path = os.environ.get("SHADOW_MEMORY_LOG")
    if not path:
        print("server_memory: SHADOW_MEMORY_LOG (the JSON-lines file to append to) is not set", file=sys.stderr)
        return 2
    sampler = Sampler(path, float(os.environ.get("SHADOW_MEMORY_EVERY_S", "30")),
                      float(os.environ.get("SHADOW_MEMORY_BASELINE_S", "300")),
                      int(os.environ.get("SHADOW_MEMORY_TRACE", "0")))
    threading.Thread(target=sampler.run, name="memory-sampler", daemon=True).start()
    from shadow.cli import main as shadow_main

    return shadow_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
