"""Compile the chunk attention kernels for a Hopper (sm_90) on a machine without a GPU and print a
digest of each compiled kernel's PTX and cubin: run it at two commits to show that a change to the
kernels' code (a move, a shared function) left the compiled kernels as they were.

Triton compiles for a target it is told (a stand-in driver answers for the missing GPU; nothing is
launched: each launch stops, after its compile, where it would load the binary). Line info is off,
so the digests do not depend on file names or line numbers.

    python tools/kernel_digest.py            # one line a compiled kernel: module, name, PTX and cubin digests
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="kernel_digest-"))

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver


class _Hopper:
    """What Triton asks the driver before it compiles: the device, its stream and its target."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def _compile(launch: Callable[[], Any]) -> None:
    with contextlib.suppress(AttributeError):  # the stand-in driver cannot load the binary: compiled, not run
        launch()


def main() -> int:
    driver.set_active(_Hopper())  # type: ignore[arg-type]
    from shadow.backends.qwen35.attention import gluon_wg, gluon_ws, table
    from shadow.backends.qwen35.attention import triton as tri

    bf16 = torch.bfloat16
    q, keys = torch.zeros(512, 8, 256, dtype=bf16), torch.zeros(4096, 2, 256, dtype=bf16)
    q2, entries = torch.zeros(1024, 8, 256, dtype=bf16), torch.zeros(2, table.FIELDS, dtype=torch.long)
    out, out2 = torch.zeros_like(q), torch.zeros_like(q2)
    for launch in (lambda: gluon_wg.attend(q, keys, keys, 1024, out, 128, 3, 2),
                   lambda: gluon_wg.attend(q, keys, keys, 0, out, 128, 3, 2),
                   lambda: gluon_wg.attend_table(q2, entries, keys, out2, 128, 3, 2),
                   lambda: gluon_ws.attend_table(q2, entries, keys, out2, 3, 2),
                   lambda: tri.attend(q, keys, keys, 0, out),
                   lambda: tri.attend(q, keys, keys, 3584, out),
                   lambda: tri.attend_table(q2, entries, keys, out2),
                   lambda: tri.merge(torch.zeros(16384, 256), torch.zeros(16384), out, 512, 4, 2, 2048, 4, 256)):
        _compile(launch)
    for module, fn in (("gluon_wg", gluon_wg._attn_wg_kernel), ("gluon_ws", gluon_ws._attn_ws_kernel),
                       ("triton", tri._attn_kernel), ("triton", tri._merge_kernel)):
        for caches in fn.device_caches.values():
            for compiled in sorted(caches[0].values(), key=lambda k: k.asm["ptx"]):
                ptx = "\n".join(line for line in compiled.asm["ptx"].splitlines() if not line.startswith("//"))
                print(module, compiled.name, "ptx", hashlib.sha256(ptx.encode()).hexdigest()[:16],
                      "cubin", hashlib.sha256(compiled.asm["cubin"]).hexdigest()[:16])
    return 0


if __name__ == "__main__":
    sys.exit(main())
