"""`bench/serve.py --quick` end to end: both servers answer, the swap run fails nothing. Speed is
never asserted here (shared machines); only that every figure is there and nothing failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_serve_bench_measures_both_servers_and_a_swap(tmp_path):
    results, markdown = tmp_path / "serve.json", tmp_path / "serve.md"
    # as a user runs it: no release key or trust root of their own configured (issue 18 item 17:
    # it failed at once with "no signing key"); the bench makes a throwaway one
    env = {k: v for k, v in os.environ.items() if k not in ("ONNXCAST_SIGNING_KEY", "ONNXCAST_TRUST")}
    done = subprocess.run([sys.executable, str(REPO / "bench" / "serve.py"), "--quick", "--duration", "1",
                           "--results", str(results), "--markdown", str(markdown)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(results.read_text())
    assert {(r["server"], r["concurrency"]) for r in report["rows"]} == {
        ("onnxcast", 1), ("onnxcast", 8), ("mlflow-1w", 1), ("mlflow-1w", 8)}
    for row in report["rows"]:
        assert row["ok"] > 0 and row["errors"] == 0 and row["p99_ms"] >= row["p50_ms"] > 0
    swap = report["swap"]
    assert swap["errors"] == 0 and swap["wrong_numbers_or_headers"] == 0
    assert swap["answered_by"]["1"] > 0 and swap["answered_by"]["2"] > 0
    assert "| onnxcast | 8 |" in markdown.read_text()
