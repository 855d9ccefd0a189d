"""Which chunk attention kernel a process reads with, and the split rule's unit that follows it.

"triton" (the default): ``attention.py``'s kernel, everywhere. "wg": ``attention_wg`` (Gluon for
Hopper, 128 rows a program, two warpgroups sharing each key and value tile), which
``attention.attend`` and ``attend_table`` then hand bf16 chunks of head dim 256 on the GPU to. "auto":
"wg" where the GPU is a Hopper and this Triton has Gluon's Hopper module, else "triton".

"wg" is a lead, not the default: it reads 7 to 11 % faster at depth on the H200, but the GPU tests
at c974d7e failed with it (a real session re-read after a rollback differed from its fresh prefill,
and the warm-up check refused spans of 8 and 16 chunks; mixed batches of sessions passed). Both
failures are where a session's rows above a chunk hold data when the chunk is read; the cause is
not known yet.

Set ``KERNEL`` once, before the first read: the split rule (and so a session's bits) follows the
kernel's row blocks (``block_rows``), so a process reads with one kernel throughout.
"""

from __future__ import annotations

import functools
import os

import torch

KERNEL = "triton"
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
        from . import attention_wg  # noqa: F401
    except Exception:  # a Triton without Gluon's Hopper module
        return "triton"
    return "wg"


def kernel_in_use() -> str:
    """``KERNEL`` resolved on this process's GPU: "triton" or "wg"."""
    return _resolve(KERNEL)


def block_rows() -> int:
    """The packed query rows of one program of the kernel in use: the split rule's unit (asked for
    every chunk of a read's table, so looked up once per setting)."""
    return _block_rows(KERNEL)


@functools.cache
def _block_rows(kernel: str) -> int:
    from . import attention  # which imports this module

    return WG_BM if _resolve(kernel) == "wg" else attention.BM


def use_wg(q: torch.Tensor) -> bool:
    """Whether ``attention_wg`` serves this chunk's queries."""
    return q.is_cuda and q.dtype == torch.bfloat16 and q.shape[2] == 256 and kernel_in_use() == "wg"
