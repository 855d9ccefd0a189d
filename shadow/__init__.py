"""shadow: a small Qwen3.5 that follows every session of a served Qwen, exactly, on a grid.

    from shadow import build_shadow, ShadowSettings
    sh = build_shadow(ShadowSettings(model="path/to/Qwen3.5-0.8B", device="cpu", dtype="float32"))
"""

from __future__ import annotations

from shadow.core.settings import ShadowSettings
from shadow.core.shadow import Answer, Shadow

__all__ = ["Answer", "Shadow", "ShadowSettings", "build_shadow"]


def build_shadow(settings: ShadowSettings | None = None) -> Shadow:
    """The facade, wired by the container from ``settings`` (environment and serve.env by default)."""
    from shadow.container import build_container

    return build_container(settings or ShadowSettings()).shadow()
