"""benchmarks/ as its users meet it: at the top only what a user runs (a script, or a package whose
``run.py`` is the script and whose other modules are its parts), each saying how to run it; one-off
probes under probes/, still importable; results/ holding the newest run of each benchmark under a
stable name with its date, commit and GPU, older runs in results/history/."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

from benchmarks.common import keep_newest, result_path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
# what a user runs: packages (``python -m benchmarks.NAME`` runs NAME/run.py) and single scripts
PACKAGES = ("read_rate", "freshness", "ab_cost", "concurrency", "soak", "scale_out")
SCRIPTS = ("warm_start", "arithmetic_check")
SHARED = ("common",)  # the helpers every benchmark uses: what it records, where results go


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


@pytest.mark.parametrize("name", PACKAGES + SCRIPTS)
def test_each_user_script_says_how_to_run_it(name: str) -> None:
    script = BENCH / name / "run.py" if name in PACKAGES else BENCH / f"{name}.py"
    assert f"python -m benchmarks.{name}" in _docstring(script)


@pytest.mark.parametrize("name", PACKAGES)
def test_a_package_runs_as_a_module_and_says_what_it_holds(name: str) -> None:
    assert (BENCH / name / "__main__.py").read_text(encoding="utf-8").count(f"benchmarks.{name}.run import main") == 1
    assert f"python -m benchmarks.{name}" in _docstring(BENCH / name / "__init__.py")


@pytest.mark.parametrize("path", sorted((BENCH / "probes").glob("*.py")), ids=lambda p: p.stem)
def test_each_probe_imports_and_says_how_to_run_it(path: Path) -> None:
    if path.stem != "__init__":
        assert f"python -m benchmarks.probes.{path.stem}" in _docstring(path)
    try:
        importlib.import_module(f"benchmarks.probes.{path.stem}" if path.stem != "__init__" else "benchmarks.probes")
    except ModuleNotFoundError as e:  # an optional GPU extra (fla, triton) absent here
        if e.name is None or e.name.split(".")[0] not in {"fla", "triton"}:
            raise
        pytest.skip(f"{path.stem} needs {e.name}, absent here")


def test_the_top_holds_only_what_a_user_runs() -> None:
    modules = {p.stem for p in BENCH.glob("*.py")} - {"__init__"}
    packages = {p.name for p in BENCH.iterdir() if (p / "__init__.py").is_file()} - {"probes"}
    assert modules == set(SCRIPTS) | set(SHARED)
    assert packages == set(PACKAGES)


def test_every_newest_result_records_date_commit_and_gpu() -> None:
    results = sorted((BENCH / "results").glob("*.json"))
    names = {p.name for p in results}
    assert {"read_rate.json", "freshness.json", "ab_cost.json", "ab_cost-overlap.json"} <= names
    for path in results:
        doc = json.loads(path.read_text(encoding="utf-8"))
        missing = {"date", "commit", "gpu"} - set(doc)
        assert not missing, f"{path.name} lacks {sorted(missing)}"
        assert not path.stem[:4].isdigit(), f"{path.name}: a stable name carries no date"


def test_the_readme_cites_only_files_that_exist() -> None:
    import re

    for doc in (BENCH / "README.md", BENCH / "freshness" / "README.md"):
        text = doc.read_text(encoding="utf-8")
        for cited in re.findall(r"`results/([^`*]+?)`", text):
            assert (BENCH / "results" / cited).exists(), f"{doc.name} cites results/{cited}"
        for cited in re.findall(r"(?<![\w/])history/([\w-][\w.-]*\.(?:json|jsonl|txt|png))", text):
            assert (BENCH / "results" / "history" / cited).exists(), f"{doc.name} cites history/{cited}"


def test_a_new_run_moves_the_one_before_to_history(tmp_path: Path) -> None:
    (tmp_path / "freshness.json").write_text(json.dumps({"commit": "abcdef0123", "date": "d", "gpu": "g"}))
    (tmp_path / "freshness.png").write_bytes(b"png")
    keep_newest(tmp_path / "freshness.json", (".png",))
    assert not (tmp_path / "freshness.json").exists() and not (tmp_path / "freshness.png").exists()
    assert json.loads((tmp_path / "history" / "freshness_abcdef0.json").read_text())["commit"] == "abcdef0123"
    assert (tmp_path / "history" / "freshness_abcdef0.png").read_bytes() == b"png"
    keep_newest(tmp_path / "freshness.json")  # nothing there: nothing moves


def test_a_result_path_makes_its_folder(tmp_path: Path) -> None:
    path = result_path(tmp_path / "out" / "probe", "probe.json")
    assert path == tmp_path / "out" / "probe" / "probe.json" and path.parent.is_dir()
    assert result_path(tmp_path / "out" / "probe", "other.json").parent == path.parent  # an existing folder is fine


@pytest.mark.parametrize("path", sorted((BENCH / "probes").glob("*.py")), ids=lambda p: p.stem)
def test_each_probe_writes_through_result_path(path: Path) -> None:
    """A device run's ``$OUT/name`` folder does not exist until a probe makes it."""
    assert "Path(args.out) /" not in path.read_text(encoding="utf-8")


def test_a_text_result_moves_to_history_under_its_first_lines_commit(tmp_path: Path) -> None:
    (tmp_path / "pytest_gpu.txt").write_text("commit 7c1981abcd (what ran), 2026-12-02, NVIDIA H200\n14 passed\n")
    keep_newest(tmp_path / "pytest_gpu.txt")
    assert not (tmp_path / "pytest_gpu.txt").exists()
    assert (tmp_path / "history" / "pytest_gpu_7c1981a.txt").read_text().endswith("14 passed\n")
