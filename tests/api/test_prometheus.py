"""A real Prometheus (Debian's 2.42, as an operator has it: it sends a bearer token and no custom
header) scrapes `shadow serve` and `shadow proxy`, both with a token, for about 20 s; PromQL through
its HTTP API then answers, and every expression of the dashboard evaluates. On 1392d56 the proxy
refused the bearer token on its own paths, so its target stayed down."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from shadow.api.app import create_app
from shadow.api.server import BackgroundServer
from shadow.proxy import create_proxy_app
from tests.conftest import REPO, make_container, make_settings, wait_until
from tests.proxy.upstream import ScriptedUpstream

TOKEN = "s3cret-scrape"
SCRAPE_S = 20.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(prom + "/api/v1/query", params={"query": expr}, timeout=30.0)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _config(tmp: Path, serve: str, proxy: str) -> Path:
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    # the scrape config docs/operations.md gives, one job each
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [
                  {"job_name": "shadow-serve", "metrics_path": "/metrics",
                   "authorization": {"type": "Bearer", "credentials_file": str(token)},
                   "static_configs": [{"targets": [serve]}]},
                  {"job_name": "shadow-proxy", "metrics_path": "/v1/conductor/shadow/metrics",
                   "authorization": {"type": "Bearer", "credentials_file": str(token)},
                   "static_configs": [{"targets": [proxy]}]}]}
    path = tmp / "prometheus.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@pytest.mark.slow
def test_prometheus_scrapes_serve_and_proxy_with_a_bearer_token(checkpoint: Path, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary on this machine (Debian: apt-get install prometheus; .ci/run installs it)")
    serve_app = create_app(make_container(make_settings(checkpoint, tmp_path / "serve", token=TOKEN,
                                                        idle_poll_s=0.05)))
    upstream = ScriptedUpstream({})
    with BackgroundServer(serve_app) as serve, BackgroundServer(upstream, lifespan="off") as up:
        proxy_app = create_proxy_app(up.url, make_container(make_settings(checkpoint, tmp_path / "proxy", token=TOKEN,
                                                                          idle_poll_s=0.05)),
                                     timeout_s=30.0, engine="transformers")
        with BackgroundServer(proxy_app) as proxy:
            targets = {"shadow-serve": serve.url.removeprefix("http://"),
                       "shadow-proxy": proxy.url.removeprefix("http://")}
            config = _config(tmp_path, targets["shadow-serve"], targets["shadow-proxy"])
            promtool = shutil.which("promtool")
            if promtool is not None:
                check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
                assert check.returncode == 0, check.stdout + check.stderr
            port = _port()
            prom = f"http://127.0.0.1:{port}"
            log = (tmp_path / "prometheus.log").open("wb")
            proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
            try:
                def ready() -> bool:
                    try:
                        return httpx.get(prom + "/-/ready").status_code == 200
                    except httpx.HTTPError:
                        return proc.poll() is not None  # exited: the assertion below says so
                wait_until(ready, "prometheus to start", 60.0)
                assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
                time.sleep(SCRAPE_S)
                up_now = {r["metric"]["job"]: r["value"][1] for r in _query(prom, "up")}
                assert up_now == {"shadow-serve": "1", "shadow-proxy": "1"}, httpx.get(prom + "/api/v1/targets").text
                # one query an operator would ask: is each one's model loaded, per instance
                loaded = {r["metric"]["instance"]: r["value"][1] for r in _query(prom, "shadow_model_loaded")}
                assert set(loaded) == set(targets.values())
                info = _query(prom, "shadow_model_info")
                assert {r["metric"]["kernel"] for r in info} <= {"torch", ""} and len(info) == 2
                samples = _query(prom, "count_over_time(up[1m])")
                assert all(int(r["value"][1]) >= 10 for r in samples), samples  # scraped all along
                # every dashboard expression evaluates (Grafana's variables as Grafana would fill them)
                dashboard = json.loads((REPO / "docs" / "grafana-shadow.json").read_text(encoding="utf-8"))
                for panel in dashboard["panels"]:
                    for target in panel["targets"]:
                        expr = (target["expr"].replace("$__rate_interval", "10s").replace("$__range", "1m")
                                .replace("$instance", ".*"))
                        _query(prom, expr)
                # the proxy's own counters are there, every reason at 0
                nf = _query(prom, 'shadow_proxy_not_followed_total{job="shadow-proxy"}')
                assert len(nf) >= 6 and all(r["value"][1] == "0" for r in nf)
            finally:
                proc.terminate()
                proc.wait(30)
                log.close()
