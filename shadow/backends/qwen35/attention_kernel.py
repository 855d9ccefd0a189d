"""Which chunk attention kernel a process reads with, and the split rule's unit that follows it.

"auto" (the default): "ws" where the GPU is a Hopper and this Triton has Gluon's Hopper module,
else "triton". "triton": ``attention.py``'s kernel, everywhere. "wg": ``attention_wg`` (Gluon for
Hopper, 128 rows a program, two warpgroups sharing each key and value tile). "ws": ``attention_ws``,
the same programs warp-specialised (each warpgroup a consumer partition, a warp fetching keys and
one values), the same bits as "wg" (``benchmarks/results/attention_triton-ws.json``) and faster in a
read's pass. ``attention.attend`` and ``attend_table`` hand a Gluon kernel bf16 chunks of head dim
256 on the GPU (with "ws", a single call still takes "wg"'s launch: ``gluon_attend``); every other
chunk stays on the Triton kernel.

The GPU tests at c974d7e failed with "wg" because the split rule's unit did not follow the kernel
that served the chunk: a table built for the tests' head dim 32 carried the 128-row rule into the
Triton kernel, which had too few split programs for it. The unit is now asked per kind of chunk
(``block_rows(device_type, dtype, head_dim)``), as ``use_wg`` decides.

Set ``KERNEL`` once, before the first read: the split rule (and so a session's bits) follows the
kernel's row blocks, so a process reads with one kernel throughout.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

KERNEL = "auto"
# the Gluon kernels, at 128 rows a program each (one split rule, one set of bits)
GLUON = ("wg", "ws")
WG_BM, WG_STAGES, WG_V_STAGES = 128, 3, 2


@functools.cache
def _resolve(kernel: str) -> str:
    if kernel != "auto":
        return kernel
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return "triton"
    if torch.cuda.get_device_capability()[0] != 9:  # wgmma is Hopper's alone
        return "triton"
    try:
        from . import attention_ws  # noqa: F401
    except Exception:  # a Triton without Gluon's Hopper module
        return "triton"
    return "ws"


def kernel_in_use() -> str:
    """``KERNEL`` resolved on this process's GPU: "triton", "wg" or "ws"."""
    return _resolve(KERNEL)


def serves_wg(device_type: str, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether a Gluon kernel reads chunks of this kind: bf16, head dim 256, on the GPU, with "wg" or
    "ws" in use."""
    return device_type == "cuda" and dtype == torch.bfloat16 and head_dim == 256 and kernel_in_use() in GLUON


def gluon_attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, out: torch.Tensor) -> Any:
    """``attention.attend`` through a Gluon kernel (``use_wg`` holds): ``attention_wg``'s, whichever is
    in use. "ws" gives its bits, but its call stages a one-entry table from the host, which cost the
    300-id question at 32k 4.92 ms against 3.88 on the H200 (``results/history/read_rate_af52d82.json``
    and ``results/history/read_rate_5d8828d.json``); a read's pass, which brings its table, takes "ws"."""
    from . import attention_wg

    return attention_wg.attend(q, keys, values, start, out, WG_BM, WG_STAGES, WG_V_STAGES)


def gluon_attend_table(q: torch.Tensor, table: torch.Tensor, like: torch.Tensor, out: torch.Tensor) -> None:
    """``attention.attend_table`` through the Gluon kernel in use (``use_wg`` holds)."""
    if kernel_in_use() == "ws":
        from . import attention_ws

        attention_ws.attend_table(q, table, like, out, WG_STAGES, WG_V_STAGES)
        return
    from . import attention_wg

    attention_wg.attend_table(q, table, like, out, WG_BM, WG_STAGES, WG_V_STAGES)


def use_wg(q: torch.Tensor) -> bool:
    """Whether a Gluon kernel serves this chunk's queries."""
    return serves_wg(q.device.type, q.dtype, q.shape[2])


def block_rows(device_type: str, dtype: torch.dtype, head_dim: int) -> int:
    """The packed query rows of one program of the kernel that reads chunks of this kind: the split
    rule's unit. A table's rows and the launch that reads them must agree on it."""
    from . import attention  # which imports this module

    return WG_BM if serves_wg(device_type, dtype, head_dim) else attention.BM
