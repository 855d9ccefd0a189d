"""What every benchmark records: when, where, which commit; and a median timer that syncs the device."""

from __future__ import annotations

import datetime
import subprocess
import time
from collections.abc import Callable

import torch


def environment() -> dict[str, object]:
    import os

    commit = os.environ.get("SHADOW_COMMIT", "")  # the device copy may carry no .git: the caller passes it
    dirty = False
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                    check=True).stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True).stdout.strip() != ""
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "commit": commit + ("+dirty" if dirty else ""),
        "torch": torch.__version__,
    }


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], warmup: int = 2, repeat: int = 7) -> float:
    """Median wall time of ``fn`` in ms, the device synchronised before each clock read."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]
