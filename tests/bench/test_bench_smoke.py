"""`bench/run.py --quick` end to end: trains for seconds, measures every candidate, writes both files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_bench_writes_rows_for_every_candidate(tmp_path):
    results, markdown = tmp_path / "results.json", tmp_path / "results.md"
    subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--threads", "1",
                    "--out-dir", str(tmp_path / "run"), "--results", str(results), "--markdown", str(markdown)],
                   check=True, capture_output=True, text=True, timeout=240)
    report = json.loads(results.read_text())
    cells = {(r["family"], r["variant"], r["batch"]) for r in report["rows"]}
    for family in ("lstm", "transformer"):
        for variant in ("torch", "fp32", "fp32-opt", "int8", "fp16"):
            assert {(family, variant, 1), (family, variant, 64)} <= cells
    for row in report["rows"]:
        assert row["p50_ms"] > 0 and row["p95_ms"] >= row["p50_ms"] and row["throughput_per_s"] > 0
        assert 0 < row["gflops_fraction"] < 2 and row["size_bytes"] > 0 and row["holdout_mae"] > 0
    assert report["gemm_peak_gflops"] > 0 and report["machine"]
    assert set(report["selected"]) in ({"edge", "cloud"}, set())
    assert "| family | variant |" in markdown.read_text()
