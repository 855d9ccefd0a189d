"""Issue 55 on `shadow serve`: each defect an operator met, as a test that fails on 1392d56's behaviour.

- the page's token: a form POST that sets an HttpOnly, SameSite=Strict cookie, which counts on the
  page's own reads only; the page's security headers;
- `shadow status` escapes the control characters of a session's name;
- a failed load: ERROR in the log, `shadow serve` exits 1, `--stay-up` keeps it up with /health 503;
- probes and scrapes stay out of the access log unless `--access-log all`;
- `--token-file` and `--ssl-keyfile/--ssl-certfile` (a real TLS handshake on loopback).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from shadow.api.app import create_app
from shadow.api.client import ShadowClient
from shadow.api.launch import server_config
from shadow.api.paths import BASE
from shadow.api.server import BackgroundServer
from shadow.api.terminal import printable
from shadow.cli import main
from tests.conftest import REPO, make_container, make_settings, wait_until

TOKEN = "s3cret-token"
CPU = {"QWEN38_SHADOW_DEVICE": "cpu", "QWEN38_SHADOW_DTYPE": "float32", "QWEN38_SHADOW_GRID": "64"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_pages_token_is_an_httponly_cookie_the_server_sets_for_the_pages_reads_only(
        checkpoint: Path, tmp_path: Path) -> None:
    c = make_container(make_settings(checkpoint, tmp_path, token=TOKEN))
    with BackgroundServer(create_app(c)) as server, httpx.Client(base_url=server.url) as http:
        form = {"content-type": "application/x-www-form-urlencoded", "origin": server.url}
        r = http.post(BASE + "/token", content=f"token={TOKEN}&next=/", headers=form)
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("shadow_token=")
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        assert "Path=/v1/conductor" in cookie
        # a wrong token: back to the page, which says so, and no cookie
        r = http.post(BASE + "/token", content="token=wrong&next=/", headers=form)
        assert r.status_code == 303 and r.headers["location"] == "/?token=wrong" and "set-cookie" not in r.headers
        # never a redirect off the page, and never a form from another site
        r = http.post(BASE + "/token", content=f"token={TOKEN}&next=https://evil.example/", headers=form)
        assert r.headers["location"] == BASE
        r = http.post(BASE + "/token", content=f"token={TOKEN}",
                      headers={**form, "origin": "https://evil.example"})
        assert r.status_code in (401, 403) and "set-cookie" not in r.headers
        jar = {"cookie": f"shadow_token={TOKEN}"}
        for path in (BASE + "/status", BASE + "/live"):  # the page's own reads
            assert http.get(path, headers=jar).status_code == 200, path
        # not a question, not a feed, not the metrics: a cookie any page of the host may carry is not a key
        assert http.get("/metrics", headers=jar).status_code == 401
        assert http.post(BASE + "/feed/prompt", json={"session": "s", "prompt": [1]}, headers=jar).status_code == 401
        # the page: its headers forbid framing, sniffing, referrers and any script but its own
        page = http.get("/")
        assert page.status_code == 200
        h = page.headers
        assert (h["x-frame-options"], h["referrer-policy"], h["x-content-type-options"]) == \
            ("DENY", "no-referrer", "nosniff")
        assert "script-src 'self'" in h["content-security-policy"] and "frame-ancestors 'none'" in \
            h["content-security-policy"]
        assert "<script>" not in page.text and "document.cookie" not in page.text
        for asset in ("page.js", "page.css"):
            assert http.get(f"{BASE}/{asset}").status_code == 200  # they hold no data: no token


def test_status_prints_names_with_control_characters_escaped(checkpoint: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    nasty = "a\x1b]0;owned\x07b\x1b]52;c;aGk=\x07\x1b[2J"  # title, clipboard (OSC 52), clear screen
    assert printable(nasty) == "a\\x1b]0;owned\\x07b\\x1b]52;c;aGk=\\x07\\x1b[2J"
    c = make_container(make_settings(checkpoint, tmp_path))
    with BackgroundServer(create_app(c)) as server, ShadowClient(server.url) as host:
        wait_until(lambda: host.status().slot.state == "loaded", "the model to load")
        host.feed_prompt(nasty, [1, 2, 3])
        env = tmp_path / "serve.env"
        env.write_text("")
        assert main(["status", "--url", server.url, "--env-file", str(env)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "a\\x1b]0;owned" in out


def _serve(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    (tmp_path / "serve.env").write_text(f"QWEN38_SHADOW_DIR={tmp_path / 'home'}\nQWEN38_SHADOW_DISK=off\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("QWEN38_SHADOW_")}
    return subprocess.Popen([sys.executable, "-c", "from shadow.cli import main; raise SystemExit(main())",
                             "serve", *flags], cwd=tmp_path, env={**clean, "PYTHONPATH": str(REPO), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_failed_load_is_logged_and_exits_1_unless_stay_up(tmp_path: Path) -> None:
    proc = _serve(tmp_path, "--model", str(tmp_path / "nonexistent"), "--port", "0")
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1, out  # on 1392d56: up for good, /health 200, nothing logged
    assert "INFO shadow.model: loading the model" in out
    assert "ERROR shadow.model: the model failed to load" in out and "no config.json" in out
    port = free_port()
    proc = _serve(tmp_path, "--model", str(tmp_path / "nonexistent"), "--port", str(port), "--stay-up")
    try:
        url = f"http://127.0.0.1:{port}"

        def failed() -> bool:
            try:
                return httpx.get(url + "/health").status_code == 503
            except httpx.HTTPError:
                return False
        wait_until(failed, "/health to say the load failed", 240.0)
        body = httpx.get(url + "/health").json()
        assert body["status"] == "failed" and "no config.json" in body["reason"]
        assert proc.poll() is None  # still up
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: a planned stop
        out, _ = proc.communicate(timeout=60)
    assert "ERROR shadow.model" in out


def _access_lines(tmp_path: Path, checkpoint: Path, *flags: str) -> list[str]:
    port = free_port()
    proc = _serve(tmp_path, "--model", str(checkpoint), "--port", str(port), *flags, env=CPU)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(url + "/ready").status_code == 200
            except httpx.HTTPError:
                return False
        wait_until(up, "the service to be ready", 240.0)
        for path in ("/health", "/metrics", BASE + "/ready", BASE + "/status"):
            httpx.get(url + path)
        time.sleep(0.5)  # the access lines are written as the responses go
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: a planned stop
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "INFO shadow.model: model loaded in" in out and "warm-up done" in out and "narrator: off" in out
    assert "INFO shadow.serve: stopped" in out
    return [line for line in out.splitlines() if '"GET ' in line]


def test_probes_and_scrapes_stay_out_of_the_access_log_unless_asked(checkpoint: Path, tmp_path: Path) -> None:
    lines = _access_lines(tmp_path, checkpoint)
    assert any("/status" in line for line in lines)
    assert not any(p in line for line in lines for p in ("/health", "/metrics", "/ready")), lines
    lines = _access_lines(tmp_path, checkpoint, "--access-log", "all")
    assert any("/health" in line for line in lines) and any("/metrics" in line for line in lines)
    off = argparse.Namespace(log_level="info", access_log="off", ssl_keyfile=None, ssl_certfile=None)
    assert server_config(off)["access_log"] is False  # uvicorn's own switch: no access line at all


def test_token_file_and_tls(checkpoint: Path, tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl on this machine to make a certificate (Debian: apt-get install openssl)")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    port = free_port()
    proc = _serve(tmp_path, "--model", str(checkpoint), "--port", str(port), "--token-file", str(token),
                  "--ssl-keyfile", str(key), "--ssl-certfile", str(cert), "--host", "0.0.0.0",
                  env=CPU)
    try:
        url = f"https://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(url + "/health", verify=str(cert)).status_code in (200, 401)
            except httpx.HTTPError:
                return False
        wait_until(up, "the service over TLS", 240.0)
        assert httpx.get(url + "/health", verify=str(cert)).status_code == 401  # the token file's token
        r = httpx.get(url + "/health", verify=str(cert), headers={"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: a planned stop
        proc.communicate(timeout=60)
    # a lone TLS flag, or an empty token file: refused at start
    assert main(["serve", "--ssl-keyfile", str(key), "--env-file", str(tmp_path / "serve.env")]) == 2
    token.write_text("\n")
    assert main(["serve", "--token-file", str(token), "--env-file", str(tmp_path / "serve.env")]) == 2
