"""Fixtures of the fleet tests: a real Redis on loopback, a tiny checkpoint, instances built on them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint

from .servers import RedisNode, need_redis


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("fleet") / "model", demo_text_config(), dtype=torch.float32)


@pytest.fixture
def redis_node(tmp_path: Path) -> Iterator[RedisNode]:
    need_redis()
    node = RedisNode(tmp_path / "redis").start()
    try:
        yield node
    finally:
        node.kill()
