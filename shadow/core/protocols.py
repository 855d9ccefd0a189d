"""The seams between the domain and what does the work. Implementations live in ``shadow.backends``
and ``shadow.adapters``; ``shadow.container`` picks them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .session import SessionBook


class Reader(Protocol):
    """Advances sessions' model state in whole grid chunks and answers forks on top of it."""

    grid: int

    @property
    def vocab_size(self) -> int: ...

    def new_session(self) -> Any: ...

    def read_chunk(self, book: SessionBook, tensors: Any) -> float: ...

    def checkpoint_if_due(self, book: SessionBook, tensors: Any) -> None: ...

    def roll_back(self, tensors: Any, resume_at: int) -> None: ...

    def fork_logits(self, book: SessionBook, tensors: Any, extra: list[int]) -> Any: ...

    def fork_decode(self, book: SessionBook, tensors: Any, prompt: list[int], max_new: int,
                    stop: set[int]) -> list[int]: ...

    def export(self, tensors: Any) -> dict[str, Any]: ...

    def fresh(self, ids: list[int]) -> dict[str, Any]: ...

    def probabilities(self, logits: Any, token_ids: Sequence[int]) -> list[float]: ...


class Prompter(Protocol):
    """Turns a question's text into ids, and a choice label into its one token."""

    def question_ids(self, text: str) -> list[int]: ...

    def single_token(self, label: str) -> int | None: ...

    @property
    def stop_ids(self) -> set[int]: ...
