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
    # forecast distributions: the reference's own intervals, the best naive's and the model's conformal ones
    for intervals in (row["reference"]["intervals"], row["best_naive"]["intervals"], family["intervals"]):
        assert set(intervals) == {"coverage_80", "coverage_95", "msis_95", "pinball"}
        assert 0 <= intervals["coverage_80"] <= intervals["coverage_95"] <= 1 and intervals["msis_95"] > 0
    assert f"| sunspots | lstm fp32 | {family['intervals']['coverage_80']:.3f} |" in markdown.read_text()
