"""`bench/accuracy.py --quick`: the accuracy benchmark end to end on one real series (sunspots)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_accuracy_bench_reads_every_figure_from_the_pipeline(tmp_path):
    results, markdown = tmp_path / "acc.json", tmp_path / "acc.md"
    subprocess.run([sys.executable, str(REPO / "bench" / "accuracy.py"), "--quick", "--models", "lstm",
                    "--results", str(results), "--markdown", str(markdown)],
                   check=True, capture_output=True, text=True, timeout=600)
    row = json.loads(results.read_text())["datasets"][0]
    assert row["dataset"] == "sunspots" and row["rows"] == 309
    assert row["origins"]["count"] >= 20 and set(row["baselines"]) == {"naive"}
    assert row["reference"]["model"] and row["reference"]["mae"] > 0
    family = row["families"][0]
    assert family["family"] == "lstm"
    assert family["vs_best_naive"] == family["mae"] / row["best_naive"]["mae"]
    if row["edge"]:  # promoted only when it beat the best naive
        assert row["edge_mae"] < row["best_naive"]["mae"] and row["goal_beats_best_naive"]
    assert "| sunspots | 309 |" in markdown.read_text()
