"""The API's own answers, which no layer below has: an error and a hold's id. Every other answer is
a layer's record as it is (``shadow.core.records``, ``shadow.adapters.status``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """An error: the HTTP status and what was wrong (key, value and where it came from)."""

    status_code: int
    detail: str


@dataclass(frozen=True, slots=True)
class Hold:
    hold_id: str
