"""Shared fixtures: the shared data folder beside the repo, CUDA-only tests, the torch RNG.

``shared_data`` is the one place the tests look outside the repo: ``../shared/data`` (real agent
sessions, the chat template's source copy), or the folder ``SHADOW_SHARED_DATA`` names. A test
that needs it takes the fixture and is skipped, saying why, when the folder is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

_SHARED_DATA = Path(os.environ.get("SHADOW_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: no GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not _SHARED_DATA.is_dir():
        pytest.skip(f"{_SHARED_DATA} is absent: the real sessions live beside the repo (../shared/data, or "
                    "the folder SHADOW_SHARED_DATA names), not inside it")
    return _SHARED_DATA


@pytest.fixture(autouse=True)
def _restore_rng():
    state = torch.random.get_rng_state()
    yield
    torch.random.set_rng_state(state)
