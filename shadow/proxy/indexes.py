"""Which session index a proxy keeps, by ``QWEN38_SHADOW_STORE``: the registry of ``SessionIndex``
implementations (``index.py``'s local one, ``redis_index.py``'s shared one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .index import LocalIndex, SessionIndex


def index_folder(settings: Any) -> Path | None:
    """Where ``LocalIndex`` keeps its files: beside the parked sessions (``DISK``), one folder a grid."""
    from shadow.container import DEFAULT_DISK, DISK_OFF

    disk = str(settings.disk).strip()
    if disk.lower() in DISK_OFF:
        return None
    root = Path(DEFAULT_DISK if disk == "auto" else disk).expanduser()
    return root / "proxy-index" / f"grid-{settings.grid}"


def open_index(settings: Any) -> SessionIndex:
    """The index ``QWEN38_SHADOW_STORE`` names: a ``redis://`` or ``rediss://`` URL keeps it in that
    Redis; empty keeps it here (on disk under ``DISK``, in memory when ``DISK`` is off)."""
    store = str(getattr(settings, "store", "") or "").strip()
    scheme = store.split("://", 1)[0].lower() if "://" in store else ""
    opener = INDEXES.get(scheme)
    if opener is None:
        raise ValueError(f"QWEN38_SHADOW_STORE={store!r}: the proxy's index takes redis:// or rediss:// (or empty)")
    return opener(settings)


def _local(settings: Any) -> SessionIndex:
    return LocalIndex(settings.grid, settings.proxy_max_sessions, index_folder(settings))


def _redis(settings: Any) -> SessionIndex:
    from .redis_index import RedisIndex

    return RedisIndex.from_url(settings.store, settings.grid, settings.proxy_max_sessions)


INDEXES = {"": _local, "redis": _redis, "rediss": _redis}
