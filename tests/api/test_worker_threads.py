"""The server keeps anyio's worker threads once started (``server.keep_worker_threads``): a thread
that ends leaves some memory behind in the libraries under the service, so a pool that ends idle
workers and starts new ones makes the heap grow with time (``benchmarks/probes/thread_churn.py``)."""

from __future__ import annotations

import threading
import time

import anyio
import anyio.to_thread
import pytest

from shadow.api import server


def test_idle_workers_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """anyio ends a worker idle for MAX_IDLE_TIME when another is taken (shortened here to 0.05 s so
    the test sees it); once kept, the same threads serve again."""
    from anyio._backends._asyncio import WorkerThread

    def idents(pause_s: float) -> set[int]:
        seen: set[int] = set()

        def job() -> None:
            seen.add(threading.get_ident())
            time.sleep(0.05)

        async def run() -> None:
            for _ in range(4):
                async with anyio.create_task_group() as tg:  # three at once: three workers
                    for _ in range(3):
                        tg.start_soon(anyio.to_thread.run_sync, job)
                await anyio.sleep(pause_s)

        anyio.run(run)
        return seen

    monkeypatch.setattr(WorkerThread, "MAX_IDLE_TIME", 0.05)
    assert len(idents(0.2)) > 3  # idle ones ended, new ones started
    assert server.keep_worker_threads() == "worker threads kept once started (not ended after 10 s idle)"
    assert len(idents(0.2)) == 3
    assert WorkerThread.MAX_IDLE_TIME >= 10**9
