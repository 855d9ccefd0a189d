"""``shadow verify`` and ``shadow demo`` pick the device with ``--device``; ``auto`` (the default)
is CUDA when torch sees one, else the CPU."""

from __future__ import annotations

from importlib import resources

import pytest

from shadow.cli import main
from shadow.core.settings import SettingsError

DEMO = resources.files("shadow") / "data" / "demo" / "session.json"


def test_verify_runs_on_the_auto_device(tmp_path, capsys):
    code = main(["verify", str(DEMO), "--turns=:1", "--home", str(tmp_path), "--device", "auto"])
    out = capsys.readouterr().out
    assert code == 0, out
    row = out.splitlines()[2].split()
    assert row[-2:] == ["yes", "0"], out


def test_a_device_that_is_none_is_refused_by_name(tmp_path):
    with pytest.raises(SettingsError, match=r"QWEN38_SHADOW_DEVICE='gpu'.*cuda:N"):
        main(["verify", str(DEMO), "--turns=:1", "--home", str(tmp_path), "--device", "gpu"])
