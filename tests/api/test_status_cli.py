"""``shadow status``: a running service's status as a table in the terminal, the token taken from
the settings; a service that cannot be reached or refuses is said so, with exit status 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadow.adapters.transcripts import demo_transcript, render_turns
from shadow.api.app import create_app
from shadow.api.client import ShadowClient
from shadow.api.server import BackgroundServer
from shadow.cli import main
from tests.conftest import GRID, make_container, make_settings, wait_until


def test_status_prints_the_running_services_sessions(checkpoint: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    turn = render_turns(demo_transcript())[0]
    c = make_container(make_settings(checkpoint, tmp_path, token="s3cret", idle_poll_s=0.05))
    monkeypatch.chdir(tmp_path)  # no serve.env of the working folder
    with BackgroundServer(create_app(c)) as server, ShadowClient(server.url, token="s3cret") as host:
        wait_until(lambda: host.status().slot.state == "loaded", "the model to load")
        host.feed_prompt("demo", turn.prompt_ids)
        host.feed_output("demo", turn.output_ids)
        wait_until(lambda: host.status().sessions["demo"].backlog < GRID, "the idle window to read it")
        st = host.status().sessions["demo"]

        assert main(["status", "--url", server.url]) == 1  # no token in the settings: refused
        assert "answered 401" in capsys.readouterr().err
        monkeypatch.setenv("QWEN38_SHADOW_TOKEN", "s3cret")
        assert main(["status", "--url", server.url]) == 0
        out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"shadow at {server.url}" and lines[1].startswith("model: loaded, ")
    header = next(i for i, line in enumerate(lines) if line.startswith("session "))
    assert lines[header].split() == ["session", "where", "ids", "read", "behind", "fresh", "rollbacks", "MiB",
                                     "resident", "MiB", "on", "disk", "profile"]
    row = lines[header + 2].split()
    assert row[:7] == ["demo", "resident", str(st.ids), str(st.committed), str(st.backlog), "yes", "0"]
    assert row[-1] == "default"


def test_status_says_when_nothing_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["status", "--url", "http://127.0.0.1:9"]) == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err
