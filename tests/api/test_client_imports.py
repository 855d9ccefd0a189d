"""The HTTP client loads records, not the server: ``import shadow.api.client`` in a fresh interpreter
loads neither Litestar nor the service (nor the narrator, the router or torch), only the records it
decodes, the paths it calls and the API's own two answers."""

from __future__ import annotations

import json
import subprocess
import sys

CLIENT_SET = {
    "shadow", "shadow.api", "shadow.api.client", "shadow.api.paths", "shadow.api.responses",
    "shadow.adapters", "shadow.adapters.records",
    "shadow.core", "shadow.core.errors", "shadow.core.profiles", "shadow.core.records",
}


def _loaded(code: str) -> list[str]:
    probe = f"import sys, json; {code}; print(json.dumps(sorted(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    loaded: list[str] = json.loads(r.stdout)
    return loaded


def test_the_client_loads_neither_litestar_nor_the_service() -> None:
    loaded = _loaded("import shadow.api.client")
    roots = {m.split(".")[0] for m in loaded}
    assert not roots & {"litestar", "torch", "triton", "fla", "pydantic_settings", "uvicorn"}, roots
    assert {m for m in loaded if m.split(".")[0] == "shadow"} == CLIENT_SET


def test_the_probe_sees_what_the_server_loads() -> None:
    """The same probe on the app: Litestar and the service are there (the probe can fail)."""
    loaded = set(_loaded("import shadow.api.app"))
    assert {"litestar", "shadow.adapters.service", "shadow.adapters.narrator"} <= loaded
