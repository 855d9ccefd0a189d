"""shadow: a small Qwen3.5 that follows every session of a served Qwen, exactly, on a grid.

    from shadow import build_shadow, ShadowSettings
    sh = build_shadow(ShadowSettings(model="path/to/Qwen3.5-0.8B", device="cpu", dtype="float32"))

The names below are loaded when first used, not when the package is: importing a part of it (the
HTTP client, a record) loads that part alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shadow.core.records import Answer
    from shadow.core.settings import ShadowSettings
    from shadow.core.shadow import Shadow

__all__ = ["Answer", "Shadow", "ShadowSettings", "build_shadow"]


def __getattr__(name: str) -> Any:
    if name == "Answer":
        from shadow.core.records import Answer

        return Answer
    if name == "Shadow":
        from shadow.core.shadow import Shadow

        return Shadow
    if name == "ShadowSettings":
        from shadow.core.settings import ShadowSettings

        return ShadowSettings
    raise AttributeError(f"module 'shadow' has no attribute {name!r}")


def build_shadow(settings: ShadowSettings | None = None) -> Shadow:
    """The facade, wired by the container from ``settings`` (environment and serve.env by default)."""
    from shadow.container import build_container
    from shadow.core.settings import ShadowSettings

    return build_container(settings or ShadowSettings()).shadow()
