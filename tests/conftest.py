"""Shared fixtures: tiny random Qwen3.5 checkpoints in the Hugging Face format, the shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # The fast path's Triton kernels run on the CPU under Triton's interpreter, which must be chosen
    # before anything (transformers, for one) imports triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: no GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent: the real sessions live beside the repo, not inside it")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _restore_rng():
    state = torch.random.get_rng_state()
    yield
    torch.random.set_rng_state(state)
