"""The two schedulers behind ``shadow.core.scheduling.Scheduler``: the idle window and the ration."""

from __future__ import annotations

from .idle import IdleScheduler
from .rationed import RationedScheduler

__all__ = ["IdleScheduler", "RationedScheduler"]
