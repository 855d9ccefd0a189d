"""The warm start on the GPU (issue 20): the 0.8B shape on the fast path, in a new process with an
empty Triton cache, then in another on the cache the first one filled. After ``warm_up`` no chunk,
question (every captured row count, and one given as text) or fork decode of the first session
takes more than 3 times its steady median (``benchmarks/warm_start.py`` measures; this is the one
place a timing is asserted: a GPU test, never run in CI). With ``SHADOW_WARM_START_JSON`` set, the
figures of both processes (``warm_up`` with a cold and a warm cache, first against median) are
written there, for benchmarks/results/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shadow.backends.qwen35.checkpoint import write_checkpoint
from shadow.backends.qwen35.config import reference_shape
from tests.conftest import REPO

pytestmark = pytest.mark.gpu
BOUND = 3.0


def run(model: Path, out: Path, cache: Path, home: Path) -> dict[str, object]:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-m", "benchmarks.warm_start", "--model", str(model), "--out", str(out),
                           "--home", str(home)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, object] = json.loads(out.read_text())
    return result


def test_after_warm_up_nothing_in_the_first_session_stalls(tmp_path: Path) -> None:
    model = write_checkpoint(tmp_path / "qwen35-0.8b-random", reference_shape("0.8B"), dtype=torch.bfloat16, seed=0)
    cache = tmp_path / "triton-cache"
    cache.mkdir()
    cold = run(model, tmp_path / "cold.json", cache, tmp_path / "home-cold")
    warm = run(model, tmp_path / "warm.json", cache, tmp_path / "home-warm")
    keep = os.environ.get("SHADOW_WARM_START_JSON")
    if keep:
        Path(keep).write_text(json.dumps({"cold_cache": cold, "warm_cache": warm}, indent=1) + "\n")
    for name, got in (("cold cache", cold), ("warm cache", warm)):
        figures: dict[str, dict[str, float]] = got["figures"]  # type: ignore[assignment]
        slow = {k: round(f["ratio"], 2) for k, f in figures.items() if f["ratio"] > BOUND}
        assert slow == {}, f"{name}: first/median above {BOUND}: {slow} (warm_up {got['warm_up_s']:.1f} s)"
    assert warm["warm_up_s"] < cold["warm_up_s"]  # type: ignore[operator]
