"""Small helpers shared by the converters."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LICENSE_NAMES = ("LICENSE", "LICENSE.md", "LICENSE.txt", "COPYING")


def find_license(path: Path, levels: int = 4) -> Path | None:
    """The LICENSE file of the source folder holding ``path`` (searched upwards)."""
    d = path if path.is_dir() else path.parent
    for _ in range(levels):
        for n in LICENSE_NAMES:
            if (d / n).is_file():
                return d / n
        if d.parent == d:
            break
        d = d.parent
    return None


def source_root(path: Path) -> Path:
    """The folder that carries the LICENSE (one per published source), else the parent."""
    lic = find_license(path)
    return lic.parent if lic is not None else (path if path.is_dir() else path.parent)


def session_name(path: Path, session: str) -> str:
    return f"{source_root(path).name}/{session}"


def license_str(path: Path) -> str | None:
    lic = find_license(path)
    return str(lic) if lic is not None else None


def iso_to_epoch(ts: str) -> float:
    """ISO-8601 with a ``Z`` or an offset (naive values are read as UTC)."""
    dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
