"""The soak's figures of a serving process's RSS over its life: the least-squares slope, and the
median of each quarter of its samples."""

from __future__ import annotations


def slope(pts: list[tuple[float, int]]) -> float | None:
    """Least-squares slope of RSS over time, MiB per hour."""
    if len(pts) < 3:
        return None
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mr = sum(r for _, r in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    if var == 0:
        return None
    return round(sum((t - mt) * (r - mr) for t, r in pts) / var * 3600 / 2**20, 2)


def quarters(pts: list[tuple[float, int]]) -> list[float]:
    """The median RSS (MiB) of each quarter of a process's samples: flat after warm-up reads as
    equal quarters (a median, so that a transient large tensor's pages do not count)."""
    n = len(pts)
    if n < 4:
        return []
    parts = [sorted(r for _, r in pts[i * n // 4:(i + 1) * n // 4]) for i in range(4)]
    return [round(p[len(p) // 2] / 2**20, 1) for p in parts]
