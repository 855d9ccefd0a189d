"""tools/check_sizes.py on a scratch git repository: a Python file in shadow/ over 450 lines fails
(tracked or new), the named exception and files elsewhere do not; and the project passes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "check_sizes.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=60)


def write(root: Path, name: str, lines: int) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x = 1\n" * lines, encoding="utf-8")


def test_a_python_file_in_the_package_over_450_lines_fails(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    write(tmp_path, "shadow/ok.py", 450)
    write(tmp_path, "tests/long_test.py", 900)  # the rule is the package's
    assert run("--root", str(tmp_path)).returncode == 0
    write(tmp_path, "shadow/core/big.py", 451)  # new, not yet committed: caught before the commit
    r = run("--root", str(tmp_path))
    assert r.returncode == 1 and "shadow/core/big.py: 451 lines, over the 450-line limit" in r.stderr
    assert "ok.py" not in r.stderr and "long_test" not in r.stderr
    write(tmp_path, "shadow/core/big.py", 450)
    write(tmp_path, "shadow/backends/qwen35/fast.py", 451)  # once the one exception; none is left
    r = run("--root", str(tmp_path))
    assert r.returncode == 1 and "shadow/backends/qwen35/fast.py: 451 lines" in r.stderr


def test_the_project_passes() -> None:
    r = run()
    assert r.returncode == 0, r.stderr
