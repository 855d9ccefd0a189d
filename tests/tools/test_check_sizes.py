"""tools/check_sizes.py on a scratch git repository: a Python file in shadow/ or benchmarks/ over 450 lines
fails (tracked or new), as does a results trace over 100 KB; files elsewhere do not; the project passes."""

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


def test_the_benchmarks_keep_to_the_line_limit_and_their_traces_to_100_kb(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    write(tmp_path, "benchmarks/read_rate/run.py", 450)
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    (tmp_path / "benchmarks/results/ab_cost.trace.jsonl").write_text("{}\n" * (100 * 1024 // 3))  # under 100 KB
    (tmp_path / "benchmarks/results/ab_cost.json").write_text("[" + "1," * 200_000 + "1]")  # a result, not a trace
    assert run("--root", str(tmp_path)).returncode == 0
    write(tmp_path, "benchmarks/read_rate/run.py", 451)
    r = run("--root", str(tmp_path))
    assert r.returncode == 1 and "benchmarks/read_rate/run.py: 451 lines" in r.stderr
    write(tmp_path, "benchmarks/read_rate/run.py", 450)
    (tmp_path / "benchmarks/results/history").mkdir()
    (tmp_path / "benchmarks/results/history/ab_cost_abc.trace.jsonl").write_text("{}\n" * 40_000)
    r = run("--root", str(tmp_path))
    assert r.returncode == 1 and "ab_cost_abc.trace.jsonl: 120,000 bytes, over the 100 KB limit" in r.stderr
