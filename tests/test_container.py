"""The container picks backends from settings (nothing of torch with MODEL empty is checked in
tests/core/test_settings.py, through the app)."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

from shadow.container import build_container
from shadow.core.settings import ShadowSettings


def test_the_disk_store_and_the_tracer_are_picked_by_settings(tmp_path: Path) -> None:
    off = build_container(ShadowSettings(_env_file=None, model="", disk="off", trace="none", dir=str(tmp_path)))
    assert off.disk() is None and off.tracer_provider() is None
    on = build_container(ShadowSettings(_env_file=None, model="", trace="jsonl", dir=str(tmp_path),
                                        trace_file=str(tmp_path / "t.jsonl")))
    assert isinstance(on.tracer_provider(), TracerProvider)
    on.shutdown_resources()
