"""Every `make` target the documentation shows, as a user runs it: from a fresh `git clone`,
through make, in its cheap form (the make variable that shortens it). A target that is too long
for that names the test that runs what it runs; one that cannot run here says why. A documented
target in none of the three tables fails, and so does an entry that no document shows.

The clone reuses the environment running the tests (VENV=<it>, its install stamp taken as up to
date with `make -o`), so nothing is installed. Only committed files are in a clone: a target
that needs a file git does not track fails here, as it would for a user.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import test_documented_commands as documented

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)

DOCUMENTED = sorted({c.argv[1] for c in documented.COMMANDS if c.argv[0] == "make" and len(c.argv) > 1})

# Run here from a clone: target -> make variables (``{out}``: a folder of the test).
RUN: dict[str, list[str]] = {
    "bench-serve": ["BENCH_SERVE_ARGS=--quick --duration 0.5 --max-requests 200 "
                    "--results {out}/serve-results.json --markdown {out}/serve-results.md"],
    "lint": [],
    "stack-down": [],  # no stack in a fresh ONNXCAST_HOME: stops nothing, says so
}
# Too long to run here: the test that runs what the target runs (file::name).
COVERED: dict[str, str] = {
    "demo": "tests/scripts/test_demo.py::test_demo_succeeds_with_a_compact_output",  # scripts/demo.py --quick
    "airflow": "tests/scripts/test_airflow_standalone.py::TestStandaloneOnAnotherPort",  # keeps running
    "bench": "tests/bench/test_bench_smoke.py::test_quick_bench_writes_rows_for_every_candidate",
    "bench-accuracy": "tests/bench/test_bench_accuracy_smoke.py::test_quick_accuracy_bench_reads_every_figure_from_the_pipeline",
    "bench-fleet": "tests/bench/test_bench_fleet_smoke.py::test_statsforecast_side_scores_every_series_on_its_official_test",
    "bench-fleet-scale": "tests/bench/test_bench_fleet_smoke.py::test_a_step_runs_in_a_spawn_child_that_reports_wall_time_and_peak_memory",
    "stack": "tests/stack/conftest.py::stack",  # scripts/stack.py up, once per test session
    "test": "tests/docs/test_make_targets.py::test_every_documented_make_target_is_run_or_covered",  # this suite
    "test-fast": "tests/docs/test_make_targets.py::test_every_documented_make_target_is_run_or_covered",
    # apt-get and the Arm sysroot's downloads; the test builds the sysroot the same way (scripts/arm_sysroot.py)
    "arm-tools": "tests/onnxcast/targets/test_target_runs.py::test_aarch64_onnx_runtime_under_qemu_matches_x86_and_pytorch",
}
# Cannot run here at all, and why.
NOT_HERE: dict[str, str] = {
    "lock": "re-resolves the pins from the package registry and rewrites requirements/constraints.txt",
    "bench-serve-kserve": "builds KServe's own environment from the package registry; then it is bench-serve "
                          "with --kserve-python",
}


def test_every_documented_make_target_is_run_or_covered():
    assert DOCUMENTED, "no make target found in the documents"
    tables = {"RUN": RUN, "COVERED": COVERED, "NOT_HERE": NOT_HERE}
    unhandled = [t for t in DOCUMENTED if not any(t in table for table in tables.values())]
    assert not unhandled, f"documented make targets neither run, covered nor excused: {unhandled}"
    twice = [t for t in DOCUMENTED if sum(t in table for table in tables.values()) > 1]
    assert not twice, f"make targets in more than one table: {twice}"
    stale = [f"{name}: {t}" for name, table in tables.items() for t in table if t not in DOCUMENTED]
    assert not stale, f"entries for make targets no document shows: {stale}"


@pytest.mark.parametrize("target", sorted(COVERED))
def test_the_covering_test_exists(target):
    path, name = COVERED[target].split("::")
    source = (REPO / path).read_text()
    assert re.search(rf"^\s*(def|class) {re.escape(name)}\b", source, re.MULTILINE), COVERED[target]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("clone") / "onnxcast"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(folder)], check=True, capture_output=True,
                   timeout=120)
    return folder


def make(clone: Path, target: str, variables: list[str], home: Path, out: Path,
         timeout: float) -> subprocess.CompletedProcess:
    # a user's shell: none of this test session's Airflow, onnxcast or MLflow settings
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "ONNXCAST", "MLFLOW_TRACKING"))}
    env["ONNXCAST_HOME"] = str(home)
    command = ["make", "--no-print-directory", "-o", str(VENV / ".installed"), f"VENV={VENV}", target,
               *(v.format(out=out) for v in variables)]
    return subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)


def _run(clone: Path, tmp_path: Path, target: str, timeout: float) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    out.mkdir()
    done = make(clone, target, RUN[target], tmp_path / "home", out, timeout)
    assert done.returncode == 0, f"make {target}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stdout + done.stderr
    return done


def test_make_lint(clone, tmp_path):
    _run(clone, tmp_path, "lint", 120)


def test_make_stack_down_without_a_stack(clone, tmp_path):
    done = _run(clone, tmp_path, "stack-down", 120)
    assert "was running" in done.stdout


@pytest.mark.slow
def test_make_bench_serve(clone, tmp_path):
    """Issue 18 item 17: it failed at once with a ConfigError traceback ("no signing key")."""
    _run(clone, tmp_path, "bench-serve", 400)
    assert "| onnxcast | 8 |" in (tmp_path / "out" / "serve-results.md").read_text()
