"""Facades over a tiny float32 checkpoint with a disk store, for the store tests and the processes
they start (a module of its own: test modules do not import each other)."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from dependency_injector import providers

from shadow import ShadowSettings
from shadow.backends.stores import DiskStore
from shadow.container import build_container
from shadow.core.plan import ReadPlan
from tests.conftest import FakeClock

VOCAB = 248320
MIB = 2**20
T0 = 1_000_000.0  # the stores' wall clock at the start of a test


def make(ckpt: Path, disk: Path | None, cap_mib: float = 64, clock: FakeClock | None = None,
         disk_mib: float = 1024, grid: int = 64, fast: str = "off"):
    s = ShadowSettings(_env_file=None, model=str(ckpt), device="cpu", dtype="float32", grid=grid,
                       gb=cap_mib / 1024, disk=str(disk) if disk else "off", disk_gb=disk_mib / 1024, fast=fast)
    c = build_container(s)
    if disk is not None:
        reader = c.reader()
        c.disk.override(providers.Singleton(DiskStore, disk, reader, reader.weights_hash,
                                            max_bytes=int(disk_mib * MIB), clock=clock or FakeClock(T0)))
    return c.shadow()


def ids_for(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(VOCAB) for _ in range(n)]


def assert_exact(sh, name: str) -> None:
    """Restore (a parked file refused on opening is found here, not after the read), read what is
    pending, then every tensor must equal a fresh prefill of the session's ids."""
    sh.restore(name)
    sh.read(ReadPlan(name))
    got, want = sh.export_state(name), sh.fresh_state(sh.session_ids(name))
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), f"{name}: {k} differs from a fresh prefill"
