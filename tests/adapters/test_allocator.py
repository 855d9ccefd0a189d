"""``shadow serve`` (and ``shadow proxy`` with the model in its process) caps glibc's malloc arenas at
start: without the cap each thread that allocates gets an arena of its own (up to 8 a core), and the
soak's server kept ~550 MiB of arenas for ~190 MiB in use, climbing for minutes after warm-up; with
two, ~280 MiB and flat (benchmarks/README.md). It also gives the heap's free pages back once a
minute (``trim_every``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shadow import cli
from shadow.adapters import allocator
from shadow.api import launch

REPO = Path(__file__).parents[2]
# eight threads alive at once, each allocating: glibc's malloc_stats then lists one arena a thread
THREADS = """
import ctypes, sys, threading
from shadow.adapters.allocator import limit_arenas
if sys.argv[1] == "cap":
    print(limit_arenas(), flush=True)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
ready, done = threading.Barrier(9), threading.Event()
def work():
    held = [libc.malloc(1000 + i) for i in range(100)]
    ready.wait()
    done.wait()
    for p in held:
        libc.free(p)
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
ready.wait()
libc.malloc_stats()
done.set()
for t in threads:
    t.join()
"""


def _arenas(mode: str, **env: str) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", THREADS, mode], cwd=REPO, env={**clean, **env},
                         capture_output=True, text=True, timeout=120, check=True)
    return sum(line.startswith("Arena ") for line in out.stderr.splitlines()), out.stdout


needs_glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                                 reason="glibc's arenas and malloc_stats: Linux with glibc only")


@needs_glibc
def test_threads_share_two_arenas_once_capped() -> None:
    free, _ = _arenas("free")
    capped, said = _arenas("cap")
    assert free >= 5, f"without the cap 8 threads took only {free} arenas: the test shows nothing here"
    assert capped <= allocator.ARENAS, f"{capped} arenas after limit_arenas()"
    assert "at most 2" in said


@needs_glibc
def test_malloc_arena_max_in_the_environment_wins() -> None:
    arenas, said = _arenas("cap", MALLOC_ARENA_MAX="4")
    assert 2 < arenas <= 4 and "MALLOC_ARENA_MAX=4 from the environment" in said


# A 4 MiB block freed, then a 1 MiB one: with glibc's dynamic threshold the free raises it to 4 MiB
# and the 1 MiB block is cut from the heap (hblkhd, the bytes in mapped blocks, does not grow)
THRESHOLD = """
import ctypes, sys
from shadow.adapters.allocator import fix_mmap_threshold
if sys.argv[1] == "fix":
    print(fix_mmap_threshold(), flush=True)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Info
libc.free(libc.malloc(4 << 20))
before = libc.mallinfo2().hblkhd
block = libc.malloc(1 << 20)
print("hblkhd=%d" % (libc.mallinfo2().hblkhd - before), flush=True)
libc.free(block)
"""


def _mapped(mode: str, **env: str) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    out = subprocess.run([sys.executable, "-c", THRESHOLD, mode], cwd=REPO, env={**clean, **env},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return int(out.split("hblkhd=")[1].split()[0]), out


@needs_glibc
def test_a_freed_large_block_no_longer_sends_the_next_ones_to_the_heap() -> None:
    dynamic, _ = _mapped("dynamic")
    fixed, said = _mapped("fix")
    assert dynamic == 0, f"{dynamic} bytes mapped without the fix: glibc's dynamic threshold did not rise here"
    assert fixed >= 1 << 20, f"the 1 MiB block after the fix came from the heap ({fixed} bytes mapped): {said}"
    assert "128 KiB and more mapped apart" in said


@needs_glibc
def test_malloc_mmap_threshold_in_the_environment_wins() -> None:
    mapped, said = _mapped("fix", MALLOC_MMAP_THRESHOLD_=str(8 << 20))
    assert mapped == 0 and "MALLOC_MMAP_THRESHOLD_=8388608 from the environment" in said


def test_serve_caps_the_arenas_before_it_builds_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(allocator, "tune", lambda: calls.append("limit") or "tuned")
    monkeypatch.setattr(launch, "listening", lambda args, command: calls.append(command))  # None: bad settings
    assert cli.main(["serve"]) == 2
    assert calls == ["limit", "serve"]


def test_proxy_with_the_model_in_its_process_caps_the_arenas_first(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(allocator, "tune", lambda: calls.append("limit") or "tuned")
    monkeypatch.setattr(launch, "listening", lambda args, command: calls.append(command))
    assert cli.main(["proxy", "--upstream", "http://127.0.0.1:9"]) == 2
    assert calls == ["limit", "proxy"]
    calls.clear()  # with --shadow URL the model lives in another process, which caps its own
    assert cli.main(["proxy", "--upstream", "http://127.0.0.1:9", "--shadow", "http://127.0.0.1:8"]) == 2
    assert calls == ["proxy"]


# 64 MiB in blocks of 64 KiB (under the mmap threshold: cut from the heap), one kept past them so
# the freed ones are a hole inside the heap, not its top, which free() would trim by itself
HOLE = """
import ctypes, json
from shadow.adapters.allocator import fix_mmap_threshold, trim
fix_mmap_threshold()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
blocks = [libc.malloc(64 << 10) for _ in range(1024)]
for p in blocks:
    libc.memset(p, 1, 64 << 10)
keep = libc.malloc(64 << 10)
for p in blocks:
    libc.free(p)
before = rss()
released = trim()
print(json.dumps({"released": released, "freed_mib": (before - rss()) / 2**20}))
"""


@needs_glibc
def test_trim_gives_a_hole_in_the_heap_back_to_the_system() -> None:
    import json

    out = subprocess.run([sys.executable, "-c", HOLE], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=True)
    got = json.loads(out.stdout)
    assert got["released"] is True
    assert got["freed_mib"] > 48, got  # most of the 64 MiB hole


PERIODIC = """
import json, threading, time
from shadow.adapters import allocator
from shadow.api import launch
calls = []
real = allocator.trim
allocator.trim = lambda: calls.append(1) or real()
said = [allocator.trim_every(0.02), allocator.trim_every(5.0)]
time.sleep(0.5)
print(json.dumps({"said": said, "trims": len(calls),
                  "threads": sum(t.name == "malloc-trim" for t in threading.enumerate())}))
"""


@needs_glibc
def test_trimming_runs_on_one_thread_at_the_first_period() -> None:
    import json

    out = subprocess.run([sys.executable, "-c", PERIODIC], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=True)
    got = json.loads(out.stdout)
    assert got["said"] == ["free heap pages given back every 0.02 s"] * 2
    assert got["threads"] == 1
    assert got["trims"] >= 2 + 10  # one check a call, then the thread's own, about 25 in the half second
