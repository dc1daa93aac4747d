"""Every corpus input through the real CLI: exit 2, readable stderr, no traceback, nothing left behind.

Every case fails before training, but a case that reaches the quality checks spends ~4 s of
CPU importing Great Expectations in its own process: all but a few of those are marked slow
(``make test`` runs them, ``make test-fast`` does not). The module fixture starts the selected
cases together, a few at a time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from corpus.bad_inputs import BAD_INPUTS, Case

FAST_QUALITY_CASES = {"target_renamed", "duplicate_timestamps", "gap_without_repair", "token_lines", "no_header"}
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING) ")
FAILED = re.compile(r"(\d+) data check\(s\) failed")


@dataclass
class CliRun:
    case: Case
    out: Path
    returncode: int
    stderr: str


def params(cases: list[Case]) -> list:
    return [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.stage == "quality"
                         and c.name not in FAST_QUALITY_CASES else []) for c in cases]


@pytest.fixture(scope="module")
def cli_runs(request, example_csv, tmp_path_factory) -> dict[str, CliRun]:
    selected = {item.callspec.params["case"].name for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    base = Path(example_csv).read_bytes()
    root = tmp_path_factory.mktemp("cli-corpus")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(case: Case) -> CliRun:
        path = case.write(root, base)
        out = root / "out" / case.name
        command = [str(Path(sys.executable).with_name("onnxcast")), "pipeline", "--data", str(path), "--out", str(out),
                   "--models", "lstm", "--max-epochs", "1", *case.cli_args()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        return CliRun(case, out, done.returncode, done.stderr)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return {r.case.name: r for r in pool.map(run, [c for c in BAD_INPUTS if c.name in selected])}


@pytest.mark.parametrize("case", params(BAD_INPUTS))
def test_bad_input_exits_2_with_a_readable_error_and_leaves_nothing(case, cli_runs):
    run = cli_runs[case.name]
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip() and not LOG_LINE.match(line)]
    assert lines and lines[0].startswith("error: ")
    assert case.expect in run.stderr
    assert all(len(line) < 2000 for line in lines)

    leftovers = {p.relative_to(run.out).as_posix() for p in run.out.rglob("*")} if run.out.exists() else set()
    assert not any(name == "report.json" or name.startswith(("models", ".staging")) or name.endswith(".onnx")
                   for name in leftovers), leftovers
    if case.stage == "quality":  # the GX report stays for the user to open
        assert {"quality/quality_report.html", "quality/validation_result.json"} <= leftovers
    else:
        assert not any(name.startswith("quality") for name in leftovers)
    reports = [p.read_bytes() for p in run.out.rglob("*") if p.is_file()] if run.out.exists() else []
    for secret in case.hidden:  # in no message, no GX page, no validation_result.json
        assert secret not in run.stderr, secret
        assert all(secret.encode() not in data for data in reports), secret


@pytest.mark.parametrize("case", params([c for c in BAD_INPUTS if c.stage == "quality"]))
def test_each_failed_check_has_its_own_line(case, cli_runs):
    stderr = cli_runs[case.name].stderr
    count = int(FAILED.search(stderr).group(1))
    lines = [line for line in stderr.splitlines() if line.strip() and not LOG_LINE.match(line)]
    assert len(lines) == count + 1  # the header, then one line per failed check
    report = re.search(r"report: (\S+(?:quality_report|summary)\.html)\)", lines[0])
    assert report and Path(report.group(1)).exists(), lines[0]
