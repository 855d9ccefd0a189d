"""docs/settings.md is what tools/settings_doc.py writes from the settings model: it fails when the page
and the model's fields (their names, types, defaults, descriptions) part, and the tool's --check says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shadow.core.settings import PREFIX, ShadowSettings

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "settings_doc.py"
sys.path.insert(0, str(ROOT / "tools"))
import settings_doc  # noqa: E402


def test_the_page_is_what_the_model_writes() -> None:
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert page == settings_doc.render(), "docs/settings.md drifted: run python tools/settings_doc.py --write"


def test_every_setting_is_on_the_page_with_its_default_and_description() -> None:
    page = settings_doc.render()
    rows = {line.split(" | ")[0].strip("| `"): line for line in page.splitlines() if line.startswith("| `")}
    assert set(rows) == {name.upper() for name in ShadowSettings.model_fields}
    for name, info in ShadowSettings.model_fields.items():
        assert info.description and " ".join(info.description.split()) in rows[name.upper()], name
    assert "| `GRID` | integer | `512` |" in page and "| `RATION_GATHER` | integer | `8` |" in page
    assert "(at least 1)" in rows["RATION_GATHER"] and "`device` \\| `turn`" in rows["RATION_SCOPE"]
    assert f"`{PREFIX}GRID`" in page


def test_check_fails_on_a_page_that_drifted(tmp_path: Path) -> None:
    page = tmp_path / "settings.md"
    page.write_text(settings_doc.render(), encoding="utf-8")
    check = [sys.executable, str(TOOL), "--check", "--doc", str(page)]
    assert subprocess.run(check, capture_output=True, timeout=120).returncode == 0
    page.write_text(settings_doc.render().replace("rows per chunk", "rows in a chunk"), encoding="utf-8")
    r = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "differs from the settings model" in r.stderr
