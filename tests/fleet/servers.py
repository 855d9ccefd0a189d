"""Real ``redis-server`` processes on free loopback ports, for the fleet tests: one node, or three
nodes made a Redis Cluster with ``redis-cli --cluster create``. No persistence: a node killed and
started again comes back empty (what the store-down tests need)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REDIS = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


def need_redis() -> None:
    if REDIS is None or REDIS_CLI is None:
        pytest.skip("redis-server and redis-cli are not installed (Debian's redis-server package; .ci/run installs it)")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(cluster: bool = False) -> int:
    """A port free on loopback; for a cluster node, one whose bus port (port + 10000) is free too."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not cluster or (port + 10000 <= 65535 and _free(port + 10000)):
            return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisNode:
    """One ``redis-server`` on 127.0.0.1:``port``; ``kill`` is SIGKILL, ``start`` starts it again, empty."""

    def __init__(self, folder: Path, port: int | None = None, cluster: bool = False) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port(cluster)
        self.cluster = cluster
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisNode:
        assert REDIS is not None
        args = [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.folder), "--protected-mode", "no"]
        if self.cluster:
            conf = self.folder / f"nodes-{self.port}.conf"
            conf.unlink(missing_ok=True)
            args += ["--cluster-enabled", "yes", "--cluster-config-file", conf.name]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while self.cli("PING") != "PONG":
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)
        return self

    def cli(self, *args: str) -> str:
        assert REDIS_CLI is not None
        r = subprocess.run([REDIS_CLI, "-p", str(self.port), *args], capture_output=True, text=True, timeout=20)
        return r.stdout.strip()

    def client(self) -> object:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def make_cluster(folder: Path, n: int = 3) -> list[RedisNode]:
    """``n`` masters, no replicas, every slot covered; waits until each node says the cluster is ok."""
    nodes: list[RedisNode] = []
    try:
        for i in range(n):
            nodes.append(RedisNode(folder / f"node{i}", cluster=True).start())
        assert REDIS_CLI is not None
        r = subprocess.run([REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{x.port}" for x in nodes),
                            "--cluster-yes"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {r.stdout[-500:]} {r.stderr[-500:]}")
        deadline = time.monotonic() + 30
        while not all("cluster_state:ok" in x.cli("CLUSTER", "INFO") for x in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster never reached cluster_state:ok")
            time.sleep(0.1)
    except BaseException:
        for x in nodes:
            x.kill()
        raise
    return nodes
