"""The C allocator of a serving process: glibc's malloc arenas capped at start.

glibc gives each thread that allocates its own arena, up to 8 per core. The server reads on its
request threads (``sync_to_thread``: anyio's worker threads, about ten under load) and every read
allocates and frees CPU tensors of many sizes (chunk activations, parked states coming back), so
each thread's arena keeps its own high-water mark of free, fragmented memory. Measured with the
soak (``benchmarks/soak.py``, 16 minutes, loaded 2-core machine): without a cap the arenas grew
to 550 MiB holding about 190 MiB in use, and the RSS kept climbing for minutes after warm-up; two
arenas stayed near 280 MiB with the same use, and the RSS stayed flat (benchmarks/README.md).

``MALLOC_ARENA_MAX`` in the environment (read by glibc at start) wins: nothing is changed then.
Elsewhere than glibc (no ``mallopt``) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2


def limit_arenas(arenas: int = ARENAS) -> str:
    """Cap glibc's malloc arenas for the threads created from now on; says what it did. Call it
    before the threads that allocate start (an arena a thread already has stays)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return f"malloc arenas: MALLOC_ARENA_MAX={os.environ['MALLOC_ARENA_MAX']} from the environment"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "malloc arenas: left as they are (not glibc)"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_ARENA_MAX, arenas) != 1:
        return "malloc arenas: left as they are (mallopt refused M_ARENA_MAX)"
    return f"malloc arenas: at most {arenas} (set MALLOC_ARENA_MAX to choose)"
