"""Resident sessions: their tensors on the reader's device, counted byte for byte."""

from __future__ import annotations

from typing import Any, Protocol

from shadow.core.protocols import Stored
from shadow.core.session import SessionBook


class Sized(Protocol):
    """What the memory store needs of a session's tensors: their size (any reader's tensors)."""

    def nbytes(self) -> int: ...


class MemoryStore:
    def __init__(self) -> None:
        self._held: dict[str, tuple[SessionBook, Any]] = {}

    def put(self, name: str, book: SessionBook, tensors: Sized) -> int:
        self._held[name] = (book, tensors)
        return tensors.nbytes()

    def peek(self, name: str) -> tuple[SessionBook, Any] | None:
        return self._held.get(name)

    def take(self, name: str) -> tuple[SessionBook, Any] | None:
        return self._held.pop(name, None)

    def remove(self, name: str) -> None:
        self._held.pop(name, None)

    def names(self) -> list[str]:
        return list(self._held)

    def info(self, name: str) -> Stored | None:
        held = self._held.get(name)
        # the device tensors and the session's ids on the host: both are what it holds resident
        return None if held is None else Stored(held[1].nbytes() + held[0].ids_nbytes())

    def close(self) -> None:
        """Nothing held open: the tensors stay until taken or removed."""
