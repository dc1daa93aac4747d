"""Bounded fleet input through the real command (issue 30, items 5 to 10).

Every fleet corpus case (tests/corpus/bad_inputs.py, FLEET_BAD_INPUTS) through
``onnxcast.cli.main(["pipeline", ..., "--series-column", "unique_id"])``: exit 2, one readable
``error:`` line (or the data-check header and its lines), no traceback, no line of a thousand
characters, nothing half-written (no ``.staging``, no report, no model; the quality report only
when the gate ran). In process: each case costs a fraction of a second, the GX import is paid
once. Then, through the console script, what only a process shows: the 100 M-row file refused
in little memory, and a run killed with SIGTERM removing its staging folder.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from corpus.bad_inputs import (
    FLEET_ARGS,
    FLEET_BAD_INPUTS,
    FleetCase,
    fleet_frame,
    hundred_million_rows,
)

from onnxcast import cli

LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING) ")
ONNXCAST = str(Path(sys.executable).with_name("onnxcast"))


def _leftovers(out: Path) -> set[str]:
    return {p.relative_to(out).as_posix() for p in out.rglob("*")} if out.exists() else set()


@pytest.mark.parametrize("case", FLEET_BAD_INPUTS, ids=lambda c: c.name)
def test_a_bad_fleet_exits_2_in_one_line_and_leaves_nothing(case: FleetCase, tmp_path, monkeypatch, capsys,
                                                             caplog):
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    data = case.build(tmp_path)
    out = tmp_path / "out"
    code = cli.main(["pipeline", "--data", str(data), "--out", str(out), *FLEET_ARGS, *case.args])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and not LOG_LINE.match(line)]
    assert lines and lines[0].startswith("error: "), err[-3000:]
    assert case.expect in " ".join(lines), err[-3000:]
    assert all(len(line) < 1000 for line in lines), [len(line) for line in lines]  # ids are clipped
    left = _leftovers(out)
    assert not any(name.startswith((".staging", "data", "models")) or name == "report.json" for name in left), left
    if case.stage == "reading":
        assert not any(name.startswith("quality") for name in left), left
    else:
        assert "quality/summary.html" in left, left
    big = [p for p in out.rglob("*") if p.is_file() and p.stat().st_size > 1_000_000] if out.exists() else []
    assert not big, big  # no id of a megabyte copied into a report
    logged = [record.getMessage() for record in caplog.records]
    for words in case.warnings:
        assert any(words in message for message in logged), (words, logged)


def test_skipped_entries_are_in_the_quality_report(tmp_path, capsys):
    case = next(c for c in FLEET_BAD_INPUTS if c.name == "folder_with_odd_entries")
    out = tmp_path / "out"
    assert cli.main(["pipeline", "--data", str(case.build(tmp_path)), "--out", str(out), *FLEET_ARGS,
                     *case.args]) == 2
    capsys.readouterr()
    page = (out / "quality" / "summary.html").read_text()
    assert "Skipped entries of the data folder" in page
    for name in ("fifo.parquet", "linked-folder", "linked.parquet", "zero.parquet", "README.md"):
        assert name in page, name


def test_the_100m_row_file_is_refused_from_its_footer_in_little_memory(tmp_path):
    """The console script, measured as a process: it reads the footer, never the rows (the
    report's file took 12.9 GB before its error). The child's resident memory is sampled while
    it runs: ``ru_maxrss`` of a child counts the parent's pages at the fork (1.4 GB under a busy
    pytest-xdist worker), not what the command itself used."""
    import psutil

    data = hundred_million_rows(tmp_path)
    process = subprocess.Popen([ONNXCAST, "pipeline", "--data", str(data), "--out", str(tmp_path / "out"),
                                *FLEET_ARGS], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    child, peak = psutil.Process(process.pid), 0
    while process.poll() is None:
        try:
            peak = max(peak, child.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    err = process.stderr.read()
    process.stderr.close()
    process.wait()
    assert process.returncode == 2, err[-2000:]
    assert "100,000,000 rows (by its metadata" in err and "Traceback" not in err
    assert 0 < peak < 700 * 2**20, f"{peak / 2**20:.0f} MB"  # the imports take ~250 MB; decoding took 12.9 GB


def test_a_run_killed_with_sigterm_removes_its_staging_folder(tmp_path):
    """`timeout`, Kubernetes and systemd stop with SIGTERM: the run unwinds as on any failure
    (a killed 1,000,000-series run left 42 MB of .staging behind)."""
    data = tmp_path / "fleet.parquet"
    fleet_frame().to_parquet(data, index=False)
    out = tmp_path / "out"
    process = subprocess.Popen([ONNXCAST, "pipeline", "--data", str(data), "--out", str(out), *FLEET_ARGS,
                                "--max-epochs", "50"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / ".staging").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (out / ".staging").exists(), "the run never started"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "error: terminated (SIGTERM)" in err and "Traceback" not in err
    assert not (out / ".staging").exists()
