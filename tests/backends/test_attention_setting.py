"""The ``ATTENTION`` setting, resolved once by the container: the reader's fast path reads through
the backend it names, the reader says which (the status's ``slot.attention``), and a backend that
cannot run on the device is a clear error at start, not a silent fallback to other bits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_container, make_settings


@pytest.mark.parametrize(("fast", "attention", "named"), [("on", "auto", "triton"), ("on", "triton", "triton"),
                                                          ("off", "gluon-ws", "torch")])
def test_the_container_resolves_the_setting_once(checkpoint: Path, tmp_path: Path, fast: str, attention: str,
                                                 named: str) -> None:
    """On the CPU ``auto`` is the Triton kernel (the only one the interpreter runs); with the fast
    path off the torch forward reads, whatever the setting."""
    reader = make_container(make_settings(checkpoint, tmp_path, fast=fast, attention=attention)).reader()
    assert reader.attention == named
    if fast == "on":
        assert reader.fast is not None and reader.fast.attention.name == named
        assert reader.fast_report()["attention"] == named


def test_a_backend_that_cannot_run_here_fails_at_start(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="attention 'gluon-ws' cannot run on cpu: Gluon's kernels run on a CUDA GPU"):
        make_container(make_settings(checkpoint, tmp_path, fast="on", attention="gluon-ws")).reader()
