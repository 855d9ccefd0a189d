"""What every benchmark records: when, where (``gpu``: the device's name, or ``cpu``), which commit;
where its newest result lives (``results/<name>.json``, the run before it moved to ``results/history/``);
a median timer that syncs the device; matplotlib for the plots, where it is installed."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"
_REPO = Path(__file__).resolve().parents[1]


def sessions_folder() -> Path:
    """The real sessions' folder: ``../shared/data/sessions/raw`` beside the repo (the full set) when
    present, else ``tests/data/sessions/raw`` (the licensed subset that ships with the repo)."""
    shared = _REPO.parent / "shared" / "data" / "sessions" / "raw"
    return shared if shared.is_dir() else _REPO / "tests" / "data" / "sessions" / "raw"


def keep_newest(path: Path, sidecars: tuple[str, ...] = ()) -> None:
    """Before a run writes ``path`` (a stable name such as ``read_rate.json``), move the result already
    there, and its ``sidecars`` (suffixes such as ``.png``, ``.trace.jsonl``), to ``history/`` beside it,
    named after the commit that file records; so the stable name always holds the newest run. A text
    result (``pytest_gpu.txt``) records its commit on its first line: ``commit <hash> ...``."""
    if not path.is_file():
        return
    text = path.read_text(encoding="utf-8")
    commit = "unknown"
    if path.suffix == ".json":
        with contextlib.suppress(ValueError, AttributeError):  # not JSON, or not an object
            commit = str(json.loads(text).get("commit", "unknown"))[:7]
    else:
        first = text.split(maxsplit=2)
        if len(first) >= 2 and first[0] == "commit":
            commit = first[1][:7]
    history = path.parent / "history"
    history.mkdir(exist_ok=True)
    stem = path.name.removesuffix(path.suffix)
    for suffix in (path.suffix, *sidecars):
        old = path.parent / f"{stem}{suffix}"
        if old.is_file():
            old.replace(history / f"{stem}_{commit}{suffix}")


def result_path(folder: str | Path, name: str) -> Path:
    """``folder/name``, the folder made if missing: a probe writes its rows as it goes, and a run
    on the device whose ``--out`` folder did not exist lost them at its first write."""
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def environment() -> dict[str, object]:

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
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": device,
        "device": device,
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


def device_ms_per_call(fn: Callable[[], object]) -> float:
    """ms a call on the device: CUDA events around 20 calls back to back (the host's launches hide
    behind the kernels where the kernels are the longer), median of 5 such samples, after one call."""
    fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 20)
    return float(sorted(times)[len(times) // 2])


def captured(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """``fn`` captured as a CUDA graph, after one run on the capture's stream (which compiles its
    kernels and settles the allocator)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        fn()
    return g


def pyplot(path: Path) -> Any:
    """matplotlib's pyplot (drawing to files), or None with a message that no ``path`` is drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot ({path.name}); pip install -e '.[bench]'", file=sys.stderr)
        return None
    return plt
