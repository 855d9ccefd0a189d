"""docs/operations.md's own commands, run as written by tools/doc_commands.py: the proxy and the
service started with a token file, their probes, a Prometheus configuration checked by promtool and
a scrape with a bearer token, `shadow status --url` against both."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PORTS = (8001, 8011)  # the docs' own


@pytest.mark.slow
def test_the_operations_docs_commands_run_as_written(checkpoint: Path) -> None:
    for tool in ("curl", "promtool"):
        if shutil.which(tool) is None:
            package = "curl" if tool == "curl" else "prometheus"
            pytest.skip(f"no {tool} on this machine (Debian: apt-get install {package}; .ci/run installs it)")
    for port in PORTS:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                pytest.skip(f"port {port}, which the docs' commands use, is taken on this machine")
    env = {**os.environ, "QWEN38_SHADOW_DEVICE": "cpu", "QWEN38_SHADOW_DTYPE": "float32", "QWEN38_SHADOW_GRID": "64"}
    command = [sys.executable, str(REPO / "tools" / "doc_commands.py"), str(REPO / "docs" / "operations.md"),
               "--model", str(checkpoint), "--timeout", "400"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "blocks, exit 0" in out and "SUCCESS: prometheus.yml is valid" in out
    assert out.count("model: loaded") == 2  # `shadow status --url` against the proxy and the service
