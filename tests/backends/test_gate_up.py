"""The fused gate/up GEMM with SiLU (``gate_up.py``) under Triton's interpreter on the CPU (fp32
products): against its torch form, a session's rows the same alone and inside a larger call, and
refusals. Its bits against cuBLAS's are a device's property, checked at warm-up and in the GPU tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from shadow.backends.qwen35.fast import gate_up

SMALL = (32, 32, 32, 4, 1)  # tiles for the small widths here; the shipped shape needs 128 columns
HIDDEN, INTER = 64, 96


def _inputs(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, HIDDEN, generator=gen).to(torch.bfloat16)
    w = (torch.randn(2 * INTER, HIDDEN, generator=gen) * HIDDEN ** -0.5).to(torch.bfloat16)
    return x, w


def _torch_form(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    gu = F.linear(x.float(), w.float()).to(x.dtype).float()  # rounded where cuBLAS stores its output
    return (F.silu(gu[:, :INTER]) * gu[:, INTER:]).to(x.dtype)


@pytest.mark.parametrize("rows", [64, 100], ids=["whole-tiles", "ragged-rows"])
def test_matches_its_torch_form(rows):
    x, w = _inputs(rows, seed=rows)
    out = torch.empty(rows, INTER, dtype=x.dtype)
    gate_up.gate_up_silu(x, w, out, SMALL)
    torch.testing.assert_close(out.float(), _torch_form(x, w).float(), rtol=2e-2, atol=2e-2)
    assert out.abs().sum() > 0


def test_a_sessions_rows_are_the_same_alone_and_inside_a_larger_call():
    x, w = _inputs(3 * 64, seed=3)
    together = torch.empty(3 * 64, INTER, dtype=x.dtype)
    gate_up.gate_up_silu(x, w, together, SMALL)
    for s in range(3):
        rows = slice(s * 64, (s + 1) * 64)
        alone = torch.empty(64, INTER, dtype=x.dtype)
        gate_up.gate_up_silu(x[rows].clone(), w, alone, SMALL)
        assert torch.equal(alone, together[rows]), f"session {s}"


def test_refuses_widths_its_tiles_do_not_divide():
    x, w = _inputs(64, seed=1)
    with pytest.raises(ValueError, match="does not fit tiles"):
        gate_up.gate_up_silu(x, w, torch.empty(64, INTER, dtype=x.dtype))  # 96 columns, tiles of 128
    with pytest.raises(ValueError, match="does not fit tiles"):
        gate_up.gate_up_silu(x, w[:INTER], torch.empty(64, INTER, dtype=x.dtype), SMALL)
    assert gate_up.fits(1024, 3584) and not gate_up.fits(1024, 3500)


def test_a_kernel_that_fails_to_build_leaves_cublas_serving(monkeypatch):
    """A GPU or Triton the kernel does not compile for must not stop warm-up: the row count keeps
    cuBLAS's form, and the reason names the failure."""
    def no_tma(*args, **kwargs):
        raise RuntimeError("TMA descriptors need sm_90")

    monkeypatch.setattr(gate_up, "gate_up_silu", no_tma)
    x, w = _inputs(64, seed=2)
    layers = [SimpleNamespace(gate_up=w)]
    assert gate_up.choose_at(layers, x) == "kernel failed: RuntimeError: TMA descriptors need sm_90"
