"""The one place that builds shadow's object graph from settings and picks its backends.

Backends are imported inside the factories, so building the container with the shadow off
imports no torch. Tests override providers (``container.reader.override(...)``) instead of patching.
"""

from __future__ import annotations

from typing import Any

from dependency_injector import containers, providers

from shadow.core.errors import BadInput
from shadow.core.settings import ShadowSettings
from shadow.core.shadow import Shadow


def _model(settings: ShadowSettings) -> Any:
    if not settings.model:
        raise BadInput("QWEN38_SHADOW_MODEL is empty: the shadow is off")
    import torch

    from shadow.backends.qwen35 import Qwen35

    device = settings.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return Qwen35.from_pretrained(settings.model, device=device, dtype=settings.dtype)


def _reader(model: Any, grid: int) -> Any:
    from shadow.backends.reader import TorchReader

    return TorchReader(model, grid)


DEFAULT_DISK = "~/.qwen38-spark-engine/cache/shadow"
DISK_OFF = ("", "off", "none")


def _memory() -> Any:
    from shadow.backends.stores import MemoryStore

    return MemoryStore()


def _disk(settings: ShadowSettings, reader: Any) -> Any:
    """Parked files under DISK, one folder per model (by weights hash), so models never touch each
    other's sessions; None when DISK is off."""
    if settings.disk.strip().lower() in DISK_OFF:
        return None
    from pathlib import Path

    from shadow.backends.stores import DiskStore

    root = Path(DEFAULT_DISK if settings.disk == "auto" else settings.disk).expanduser()
    digest = reader.model.weights_hash
    return DiskStore(root / digest[:16], reader, digest, max_bytes=int(settings.disk_gb * 2**30))


def _cap_bytes(settings: ShadowSettings) -> int:
    return int(settings.gb * 2**30)


def _prompter() -> Any:
    from shadow.adapters.prompter import QwenPrompter

    return QwenPrompter()


class Container(containers.DeclarativeContainer):
    settings = providers.Dependency(instance_of=ShadowSettings)
    model = providers.Singleton(_model, settings)
    reader = providers.Singleton(_reader, model, settings.provided.grid)
    prompter = providers.Singleton(_prompter)
    memory = providers.Singleton(_memory)
    disk = providers.Singleton(_disk, settings, reader)
    shadow = providers.Singleton(Shadow, reader=reader, prompter=prompter, memory=memory, disk=disk,
                                 cap_bytes=providers.Callable(_cap_bytes, settings))


def build_container(settings: ShadowSettings) -> Container:
    return Container(settings=settings)
