"""The two schedulers behind ``shadow.core.scheduling.Scheduler``: the idle window and the ration."""

from __future__ import annotations

from .common import device_sync
from .idle import IdleScheduler
from .rationed import RationedScheduler

__all__ = ["IdleScheduler", "RationedScheduler", "device_sync"]
