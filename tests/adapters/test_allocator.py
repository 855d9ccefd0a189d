"""``shadow serve`` (and ``shadow proxy`` with the model in its process) caps glibc's malloc arenas at
start: without the cap each thread that allocates gets an arena of its own (up to 8 a core), and the
soak's server kept ~550 MiB of arenas for ~190 MiB in use, climbing for minutes after warm-up; with
two, ~280 MiB and flat (benchmarks/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shadow import cli
from shadow.adapters import allocator

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


def test_serve_caps_the_arenas_before_it_builds_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(allocator, "limit_arenas", lambda: calls.append("limit") or "capped")
    monkeypatch.setattr(cli, "_listening", lambda args, command: calls.append(command))  # None: bad settings
    assert cli.main(["serve"]) == 2
    assert calls == ["limit", "serve"]


def test_proxy_with_the_model_in_its_process_caps_the_arenas_first(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(allocator, "limit_arenas", lambda: calls.append("limit") or "capped")
    monkeypatch.setattr(cli, "_listening", lambda args, command: calls.append(command))
    assert cli.main(["proxy", "--upstream", "http://127.0.0.1:9"]) == 2
    assert calls == ["limit", "proxy"]
    calls.clear()  # with --shadow URL the model lives in another process, which caps its own
    assert cli.main(["proxy", "--upstream", "http://127.0.0.1:9", "--shadow", "http://127.0.0.1:8"]) == 2
    assert calls == ["proxy"]
