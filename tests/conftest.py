"""Shared fixtures and helpers: tiny random Qwen3.5 checkpoints in the Hugging Face format, the one
fake clock, the one polling helper, an in-memory span exporter, containers built from settings with
providers overridden, ``torch.empty`` filled with NaN so that a row never written cannot pass as
zero, and ``shared_data``: the real agent sessions, the full set in ``../shared/data`` (or the folder
``SHADOW_SHARED_DATA`` names) when present, else the licensed subset shipped in ``tests/data`` (the same
layout; tests/data/README.md lists it), so the tests on real sessions run on any clone. A test that
needs the full set takes ``full_data`` and skips, saying why, on the subset."""

from __future__ import annotations

import glob
import os
import shutil

# Without a GPU the fast path's Triton kernels run under Triton's interpreter. It must be chosen
# before triton.language is imported, and torch imports it when triton is installed: so here, first,
# and without asking torch whether there is a GPU.
if not glob.glob("/dev/nvidia[0-9]*") and not shutil.which("nvidia-smi"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist each worker gets one core's worth of threads (and so do the processes the tests
# start): torch's default of one OpenMP thread per core in every worker oversubscribes the CPU, and
# the tiny model's many small parallel regions then wait on each other (the openhands replay of
# tests/test_verify_real_sessions.py: 22 s alone, 216 s beside the compaction replay under -n 2).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import math
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from dependency_injector import providers
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
from shadow.container import Container, build_container
from shadow.core.settings import ShadowSettings

REPO = Path(__file__).resolve().parents[1]
_NAMED_DATA = os.environ.get("SHADOW_SHARED_DATA")
_SHARED_DATA = Path(_NAMED_DATA or REPO.parent / "shared" / "data")
TEST_DATA = REPO / "tests" / "data"  # the subset of the real sessions that ships with the repo
GRID = 64  # the grid of the service tests' settings


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: no GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real sessions' folder (``sessions/raw/...`` under it): the full set beside the repo when
    present, else the subset in tests/data. A folder named by SHADOW_SHARED_DATA must exist."""
    if _SHARED_DATA.is_dir():
        return _SHARED_DATA
    if _NAMED_DATA:
        pytest.fail(f"SHADOW_SHARED_DATA={_NAMED_DATA} is not a folder")
    return TEST_DATA


@pytest.fixture(scope="session")
def full_data(shared_data: Path) -> Path:
    """The full set of real sessions (../shared/data): skipped, saying why, with only tests/data's subset."""
    if shared_data == TEST_DATA:
        pytest.skip(f"needs the full set of real sessions: {_SHARED_DATA} is absent (tests/data holds a subset)")
    return shared_data


@pytest.fixture(autouse=True)
def _restore_rng() -> Iterator[None]:
    state = torch.random.get_rng_state()
    yield
    torch.random.set_rng_state(state)


# ---- uninitialised memory reads as NaN -------------------------------------------------------------

_EMPTY, _EMPTY_LIKE = torch.empty, torch.empty_like


def _nan(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() or t.is_complex():
        t.fill_(math.nan)
    return t


@pytest.fixture(autouse=True)
def _nan_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.empty``/``empty_like`` give NaN instead of whatever the allocator held (often zeros on
    a fresh page), so code that reads a row it never wrote fails (as fla's own tests do)."""
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: _nan(_EMPTY(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: _nan(_EMPTY_LIKE(*a, **kw)))


# ---- time --------------------------------------------------------------------------------------------


class FakeClock:
    """A clock that moves only when told: the schedulers' and the stores' time, never a sleep."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


class Ticks:
    """The reader's timer in service tests: every reading moves it on by ``step``, so a pass (the
    reader reads its timer once before and once after) costs exactly ``step``, however loaded the
    machine is. A chunk's cost comes from here, the schedulers' time from the ``FakeClock``."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.t = 0.0

    def __call__(self) -> float:
        self.t += self.step
        return self.t


CHUNK_S = 0.004  # what a chunk costs in the service tests (Ticks): a fast GPU's order, not this box's


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def wait_until(ready: Callable[[], object], what: str, timeout_s: float = 120.0, poll_s: float = 0.01) -> None:
    """Poll ``ready`` until it is true; past ``timeout_s`` fail, naming what never happened."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:g} s for {what}; it never happened")
        time.sleep(poll_s)


def joined(thread: Any, what: str, timeout_s: float = 30.0) -> None:
    """Join ``thread``; fail, naming it, when it is still running after ``timeout_s``."""
    thread.join(timeout_s)
    if thread.is_alive():
        pytest.fail(f"{what} still running after {timeout_s:g} s")


# ---- the service: a real-vocabulary checkpoint, spans, containers -----------------------------------


def ids(n: int, seed: int = 0) -> list[int]:
    """``n`` random ids of the real vocabulary (below the special tokens)."""
    rng = random.Random(seed)
    return [rng.randrange(200, 240_000) for _ in range(n)]


class Spans:
    """An in-memory exporter on a provider of its own (never the process-wide one)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def all(self, name: str | None = None) -> list[Any]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def chunks(self, window: str | None = None) -> list[Any]:
        return [s for s in self.all("shadow.chunk") if window is None or s.attributes["shadow.window"] == window]


@pytest.fixture
def spans() -> Spans:
    return Spans()


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("service") / "demo", demo_text_config(),
                            dtype=torch.float32, seed=0)


def make_settings(checkpoint: Path | str, home: Path, **kw: Any) -> ShadowSettings:
    # A long idle window: a test that counts the chunks of one window must not depend on the machine's
    # speed (a busy CI box reads a chunk in seconds); the window's own bound has a test of its own.
    # The ration in the round and at once (RATION_THREAD off, RATION_GATHER 1): tests count what a
    # round reads; the thread and the gathering have tests of their own.
    values: dict[str, Any] = dict(model=str(checkpoint), device="cpu", dtype="float32", grid=GRID, disk="off",
                                  dir=str(home), idle_window_s=60.0, ration_thread=False, ration_gather=1)
    values.update(kw)
    return ShadowSettings(_env_file=None, **values)


def make_container(settings: ShadowSettings, clock: FakeClock | None = None, spans: Spans | None = None,
                   chunk_s: float | None = CHUNK_S) -> Container:
    """The container, its clock, spans and chunk cost overridden; ``chunk_s=None``: chunks cost what
    the wall clock measures."""
    c = build_container(settings)
    if chunk_s is not None:
        c.reader_timer.override(providers.Object(Ticks(chunk_s)))
    if clock is not None:
        c.clock.override(providers.Object(clock))
    if spans is not None:
        c.tracer_provider.override(providers.Object(spans.provider))
    return c
