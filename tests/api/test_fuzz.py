"""schemathesis against the OpenAPI schema the real server serves: generated requests (valid and
not) to every operation; no 5xx, every answer as documented (status, content type, body schema);
and nothing lost: a session fed before the fuzzing is intact after it, and the service still reads
and answers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from shadow.api.app import create_app
from shadow.api.client import ShadowClient
from shadow.api.server import BackgroundServer
from tests.conftest import GRID, ids, make_container, make_settings, wait_until

CONTROL = "control-9f1c27d3"  # a name the fuzzer will not guess
QUESTION = "Did the agent finish? A: yes, B: no. Answer with the letter."


@pytest.fixture(scope="module")
def served(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("fuzz")
    settings = make_settings(checkpoint, home, max_body_kb=64, idle_poll_s=0.05, idle_window_s=0.5)
    with BackgroundServer(create_app(make_container(settings))) as server, ShadowClient(server.url) as host:
        wait_until(lambda: host.status().slot.state == "loaded", "the model to load")
        prompt, output = ids(5 * GRID + 11, 21), ids(40, 22)
        host.feed_prompt(CONTROL, prompt)
        host.feed_output(CONTROL, output)
        yield {"server": server, "host": host, "ids": prompt + output}


@pytest.fixture(scope="module")
def api_schema(served: dict[str, Any]) -> Any:
    return schemathesis.openapi.from_url(served["server"].url + "/schema/openapi.json")


def not_a_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text}"
    return None


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def fuzz(op: Any, mode: GenerationMode, seen: list[int]) -> Callable[[], None]:
    """A Hypothesis test of one operation: schemathesis makes the requests, the checks judge the answers."""

    @hsettings(max_examples=20, deadline=None, derandomize=True, database=None,
               suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        seen.append(case.call_and_validate(checks=CHECKS).status_code)

    return run  # type: ignore[no-any-return]


def test_the_served_openapi_document_validates(api_schema: Any) -> None:
    api_schema.validate()  # against the OpenAPI meta-schema of its version (schemathesis' validator)
    assert api_schema.raw_schema["openapi"].startswith("3.1")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_5xx_and_answers_as_documented(api_schema: Any, mode: GenerationMode) -> None:
    # (schemathesis' own pytest plugin does not run under pytest 9: its strategies, driven here)
    operations = [r.ok() for r in api_schema.get_all_operations()]
    assert len(operations) == 23  # 14, and the operators' (metrics, health, ready, page: at / and under the
    # prefix), and the page's fragment
    for op in operations:
        if op.path.endswith("/narration"):
            continue  # an event stream never ends, so no answer to judge; tests/api/test_narrator.py reads it
        if mode is GenerationMode.NEGATIVE and op.method.upper() == "GET":
            continue  # GET /status takes no input: nothing to make invalid
        seen: list[int] = []
        try:
            fuzz(op, mode, seen)()
        except Unsatisfiable:  # a lone string path parameter (a hold's id, a session): every value is valid
            assert mode is GenerationMode.NEGATIVE and op.method.upper() == "DELETE", op.label
            continue
        if mode is GenerationMode.NEGATIVE:
            assert seen and all(400 <= c < 500 for c in seen), (op.label, seen)
        else:
            assert len(seen) >= (1 if op.method.upper() == "GET" else 5), (op.label, seen)
            if op.path.endswith(("/status", "/feed/prompt", "/host/arrived", "/host/started", "/host/holds")):
                assert any(c < 300 for c in seen), (op.label, seen)  # valid input is taken, not only refused


def test_nothing_lost(served: dict[str, Any]) -> None:
    host: ShadowClient = served["host"]
    for hold in host.status().host.hold_ids:  # holds the fuzzer left: the idle window reads again
        host.release_hold(hold)
    status = host.status()
    assert status.errors == []
    assert status.sessions[CONTROL].ids == len(served["ids"])
    wait_until(lambda: host.status().sessions[CONTROL].backlog < GRID, "the idle window to read the control",
               poll_s=0.05)
    assert host.status().sessions[CONTROL].committed == len(served["ids"]) // GRID * GRID
    answer = host.ask(CONTROL, QUESTION, ["A", "B"])
    assert answer.behind == len(served["ids"]) % GRID
