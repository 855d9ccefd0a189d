"""Fixtures for the service tests: the demo-shaped Qwen3.5 checkpoint (real vocabulary), a simulated
clock, an in-memory span exporter, and containers built from settings with providers overridden."""

from __future__ import annotations

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


class FakeClock:
    """A clock that moves only when told: the schedulers' time, never a sleep."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


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


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("service") / "demo", demo_text_config(),
                            dtype=torch.float32, seed=0)


def make_settings(checkpoint: Path | str, home: Path, **kw: Any) -> ShadowSettings:
    # A long idle window: a test that counts the chunks of one window must not depend on the machine's
    # speed (a busy CI box reads a chunk in seconds); the window's own bound has a test of its own.
    values: dict[str, Any] = dict(model=str(checkpoint), device="cpu", dtype="float32", grid=64, disk="off",
                                  dir=str(home), idle_window_s=60.0)
    values.update(kw)
    return ShadowSettings(_env_file=None, **values)


def make_container(settings: ShadowSettings, clock: FakeClock | None = None, spans: Spans | None = None) -> Container:
    c = build_container(settings)
    if clock is not None:
        c.clock.override(providers.Object(clock))
    if spans is not None:
        c.tracer_provider.override(providers.Object(spans.provider))
    return c


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def spans() -> Spans:
    return Spans()
