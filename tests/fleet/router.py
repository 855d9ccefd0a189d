"""A real router in front of several proxies for the fleet's tests: Debian's nginx, hashing the session
header onto its upstreams (``hash $http_x_session_id consistent;``), as a fleet with session affinity runs it.

The process runs in the foreground of its own prefix folder (config, logs, temporary files), on a free
loopback port; a dead upstream is passed over to the next one (``proxy_next_upstream``), as nginx does in
production. Streams are relayed unbuffered, so the proxy's server-sent events reach the client as sent."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx

from .servers import free_port

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


CONF = """\
{user}
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    client_max_body_size 64m;
    upstream shadows {{
        hash $http_x_session_id consistent;
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://shadows;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_request_buffering on;
            proxy_read_timeout 300s;
            proxy_connect_timeout 2s;
            proxy_next_upstream error timeout http_502;
            proxy_next_upstream_tries 2;
        }}
    }}
}}
"""


class Router:
    """nginx on ``port`` over ``upstreams`` (``host:port`` each)."""

    def __init__(self, prefix: Path, upstreams: list[str]) -> None:
        if NGINX is None:
            raise RuntimeError("nginx is not installed (Debian's package nginx; .ci/run installs it)")
        self.prefix = prefix
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        prefix.mkdir(parents=True, exist_ok=True)
        servers = "\n".join(f"        server {u} max_fails=1 fail_timeout=30s;" for u in upstreams)
        user = "user root;" if os.geteuid() == 0 else ""
        self.conf = prefix / "nginx.conf"
        self.conf.write_text(CONF.format(user=user, prefix=prefix, servers=servers, port=self.port))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> None:
        assert NGINX is not None
        self.proc = subprocess.Popen([NGINX, "-p", str(self.prefix), "-c", str(self.conf), "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=open(self.prefix / "stderr.log", "wb"))  # noqa: SIM115
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {(self.prefix / 'stderr.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"nginx did not listen on {self.port} within {timeout_s} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def client(self, timeout_s: float = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout_s)
