"""The chunk attention backends on the GPU: each one this GPU runs passes its self-check (the naive
reference within bf16 rounding, its bits again on a second call, and a table launch equal to each
chunk's own call, at the 0.8B's shape), and ``auto`` resolves as the registry says. On a Hopper the
Gluon backends run too (``gluon-ws``'s self-check compares its table kernel with ``gluon-wg``'s
call: the two must give the same bits)."""

from __future__ import annotations

import pytest
import torch

from shadow.backends.qwen35.attention import SETTINGS, backend_class, choose, why_unavailable

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


@pytest.mark.parametrize("name", SETTINGS[1:])
def test_each_backend_this_gpu_runs_passes_its_self_check(name: str) -> None:
    why = why_unavailable(name, CUDA)
    if why:
        pytest.skip(f"{name}: {why}")
    backend = choose(name, CUDA)
    assert backend.name == name and backend.available(CUDA)
    backend.self_check(CUDA)


def test_auto_takes_the_available_backend_of_the_highest_priority() -> None:
    usable = [name for name in SETTINGS[1:] if not why_unavailable(name, CUDA)]
    assert "triton" in usable  # every CUDA GPU runs the Triton kernel
    best = max(usable, key=lambda name: backend_class(name).priority)
    assert choose("auto", CUDA).name == best
    if torch.cuda.get_device_capability()[0] == 9 and "gluon-ws" in usable:
        assert best == "gluon-ws"  # the shipped choice on a Hopper
