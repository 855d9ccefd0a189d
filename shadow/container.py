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


def _prompter() -> Any:
    from shadow.adapters.prompter import QwenPrompter

    return QwenPrompter()


class Container(containers.DeclarativeContainer):
    settings = providers.Dependency(instance_of=ShadowSettings)
    model = providers.Singleton(_model, settings)
    reader = providers.Singleton(_reader, model, settings.provided.grid)
    prompter = providers.Singleton(_prompter)
    shadow = providers.Singleton(Shadow, reader=reader, prompter=prompter)


def build_container(settings: ShadowSettings) -> Container:
    return Container(settings=settings)
