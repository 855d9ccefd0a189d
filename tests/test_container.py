"""The container: with the shadow off nothing of torch is imported; backends picked by settings."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from shadow.container import build_container
from shadow.core.settings import ShadowSettings


def test_with_the_model_empty_nothing_of_torch_is_imported(tmp_path: Path) -> None:
    # A fresh interpreter: this one has torch loaded by the other tests' fixtures.
    code = textwrap.dedent(f"""
        import sys
        from shadow.container import build_container
        from shadow.core.settings import ShadowSettings
        s = ShadowSettings(_env_file=None, model="", dir={str(tmp_path)!r}, trace="none")
        c = build_container(s)
        service = c.service()
        status = service.status()
        assert status["slot"]["state"] == "off", status["slot"]
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "triton", "fla")))
        print(loaded)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", f"torch imported with the shadow off: {r.stdout.strip()}"


def test_the_disk_store_and_the_tracer_are_picked_by_settings(tmp_path: Path) -> None:
    off = build_container(ShadowSettings(_env_file=None, model="", disk="off", trace="none", dir=str(tmp_path)))
    assert off.disk() is None and off.tracer_provider() is None
    on = build_container(ShadowSettings(_env_file=None, model="", trace="jsonl", dir=str(tmp_path),
                                        trace_file=str(tmp_path / "t.jsonl")))
    provider = on.tracer_provider()
    assert type(provider).__name__ == "TracerProvider"
    on.shutdown_resources()
