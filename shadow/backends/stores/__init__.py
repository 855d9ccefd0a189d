"""State stores: ``memory`` (resident) and ``disk`` (parked files)."""

from .disk import DiskStore
from .memory import MemoryStore

__all__ = ["DiskStore", "MemoryStore"]
