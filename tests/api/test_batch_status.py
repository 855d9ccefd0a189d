"""A batch size the warm-up check refuses is said by the service's status (``GET /status`` and
``shadow status``), not only by the log and the reader's report (issue 18)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadow.api.app import create_app
from shadow.api.client import ShadowClient
from shadow.api.server import BackgroundServer
from shadow.api.terminal import status_table
from shadow.backends.qwen35.fast.forward import FastForward
from tests.conftest import make_container, make_settings, wait_until


def test_a_refused_batch_size_shows_in_the_status(checkpoint: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself (a size whose passes differ is refused and logged) is
    ``tests/backends/test_fast.py``'s; under Triton's interpreter it takes minutes on this model, so
    here the warm-up refuses size 4 as the check does (``Graphs.refused``), and the status must say so.
    The status names the attention kernel too: the one the container resolved (``ATTENTION``)."""
    why = "session 1 of 4 (depth 64) differs from its chunk read alone; 1 of 4 differ"

    def warm_up_refusing_four(self: FastForward) -> float:
        self.graphs.refused[4] = why
        self.graphs.check_s = 0.5  # the check ran: the sizes it let through are "ok"
        return self.graphs.check_s

    monkeypatch.setattr(FastForward, "warm_up", warm_up_refusing_four)
    c = make_container(make_settings(checkpoint, tmp_path, fast="on", idle_poll_s=0.05))
    assert c.service().status().slot.batches == {} and c.service().status().slot.max_batch == 1  # not loaded
    with BackgroundServer(create_app(c)) as server, ShadowClient(server.url) as host:
        wait_until(lambda: host.status().slot.state == "loaded", "the model to load")
        st = host.status()  # through GET /status
    assert st.slot.batches == {"1": "ok", "2": "ok", "4": why}
    assert st.slot.max_batch == 2 == c.shadow().reader.max_batch
    assert st.slot.attention == "triton" == c.shadow().reader.attention  # auto, on the CPU
    lines = status_table(st).splitlines()
    assert f"batches: up to 2 sessions a pass (sizes 1, 2); size 4 not used: {why}" in lines
