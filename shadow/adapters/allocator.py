"""The C allocator of a serving process: glibc's malloc arenas capped and its mmap threshold fixed at start.

glibc gives each thread that allocates its own arena, up to 8 per core. The server reads on its
request threads (``sync_to_thread``: anyio's worker threads, about ten under load) and every read
allocates and frees CPU tensors of many sizes (chunk activations, parked states coming back), so
each thread's arena keeps its own high-water mark of free, fragmented memory. Measured with the
soak (``benchmarks/soak``, 16 minutes, loaded 2-core machine): without a cap the arenas grew
to 550 MiB holding about 190 MiB in use, and the RSS kept climbing for minutes after warm-up; two
arenas stayed near 280 MiB with the same use, and the RSS stayed flat (benchmarks/README.md).

glibc also serves a block of 128 KiB or more by its own ``mmap``, given back whole when freed, but
it raises that threshold to the size of every mapped block freed (up to 32 MiB). After the first
large tensors come and go, blocks of a few hundred KiB to a few MiB (a chunk's activations, a
parked state coming back, their sizes following each session's length) are cut from the heap
instead, where the holes between live blocks stay resident. ``fix_mmap_threshold`` pins the
threshold at glibc's own starting value, so such blocks keep going back to the system when freed.

Free heap pages inside the arenas still count in the RSS until something gives them back: glibc
trims only the top of a heap on ``free``. With the two settings above, the soak's server still
rose by 48-76 MiB an hour after warm-up, its Python objects flat (tracemalloc, started after
warm-up, held 6-10 MiB throughout) and the RSS following the heap's high-water mark: in use plus
free-but-touched (13 to 27 MiB free in 15 minutes). ``trim_every`` gives those pages back
(``malloc_trim``) once a minute; what a trim costs is a walk of the two arenas.

``MALLOC_ARENA_MAX`` and ``MALLOC_MMAP_THRESHOLD_`` in the environment (read by glibc at start), or
``GLIBC_TUNABLES`` naming them, win: that setting is left as they made it. Elsewhere than glibc (no
``mallopt``) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
import time
from collections.abc import Callable

M_ARENA_MAX = -8  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
ARENAS = 2
MMAP_THRESHOLD = 128 << 10  # glibc's DEFAULT_MMAP_THRESHOLD_MIN, where the dynamic threshold starts
TRIM_EVERY_S = 60.0


def tune() -> str:
    """The three below; says what was done (one line for the log)."""
    return f"{limit_arenas()}; {fix_mmap_threshold()}; {trim_every()}"


@functools.cache  # find_library may run ldconfig: once a process, not at every minute's trim
def _libc_function(name: str, argtypes: tuple[type, ...], restype: type) -> Callable[..., int] | None:
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = list(argtypes), restype
    return fn  # type: ignore[no-any-return]


def _mallopt() -> Callable[[int, int], int] | None:
    return _libc_function("mallopt", (ctypes.c_int, ctypes.c_int), ctypes.c_int)


def trim() -> bool | None:
    """Give the free pages of every arena back to the system now (``malloc_trim(0)``): whether any
    went back; None where there is no ``malloc_trim`` (not glibc)."""
    malloc_trim = _libc_function("malloc_trim", (ctypes.c_size_t,), ctypes.c_int)
    return None if malloc_trim is None else malloc_trim(0) == 1


_trimming_every: float | None = None  # the trimmer thread's period, once started


def trim_every(seconds: float = TRIM_EVERY_S) -> str:
    """``trim`` every ``seconds`` on a daemon thread, for the process's life (one thread a process: a
    later call leaves the first one's period); says what it did."""
    global _trimming_every
    if trim() is None:
        return "heap trimming: none (not glibc)"
    if _trimming_every is None:
        def run() -> None:
            while True:
                time.sleep(seconds)
                trim()

        threading.Thread(target=run, name="malloc-trim", daemon=True).start()
        _trimming_every = seconds
    return f"free heap pages given back every {_trimming_every:g} s"


def _set(what: str, option: int, name: str, value: int, env: str, tunable: str) -> str | None:
    """``mallopt(option, value)`` unless the environment chose (``env``, or ``tunable`` in
    ``GLIBC_TUNABLES``); None once set, else what stopped it."""
    if env in os.environ:
        return f"{what}: {env}={os.environ[env]} from the environment"
    if f"glibc.malloc.{tunable}=" in os.environ.get("GLIBC_TUNABLES", ""):
        return f"{what}: as GLIBC_TUNABLES set it"
    mallopt = _mallopt()
    if mallopt is None:
        return f"{what}: left as it is (not glibc)"
    if mallopt(option, value) != 1:
        return f"{what}: left as it is (mallopt refused {name})"
    return None


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> str:
    """Blocks of ``threshold`` bytes or more mapped apart for the process's life (glibc's dynamic
    threshold off); says what it did."""
    return (_set("mmap threshold", M_MMAP_THRESHOLD, "M_MMAP_THRESHOLD", threshold, "MALLOC_MMAP_THRESHOLD_",
                 "mmap_threshold")
            or f"blocks of {threshold >> 10} KiB and more mapped apart (set MALLOC_MMAP_THRESHOLD_ to choose)")


def limit_arenas(arenas: int = ARENAS) -> str:
    """Cap glibc's malloc arenas for the threads created from now on; says what it did. Call it
    before the threads that allocate start (an arena a thread already has stays)."""
    return (_set("malloc arenas", M_ARENA_MAX, "M_ARENA_MAX", arenas, "MALLOC_ARENA_MAX", "arena_max")
            or f"malloc arenas: at most {arenas} (set MALLOC_ARENA_MAX to choose)")
