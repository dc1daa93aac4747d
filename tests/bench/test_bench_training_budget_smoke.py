"""bench/training_budget.py end to end on a 12-series sample of M1 monthly at two tiny budgets:
the fleet bench's pipeline and statsforecast side really run; every point has the families'
accuracy and training record and the references, a point run again replaces its entry, and the
Markdown shows the budgets side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def budget(tmp_path: Path, minutes: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "bench" / "training_budget.py"), "--panels", "m1-monthly", "--limit", "12",
               "--minutes", minutes, "--families", "dlinear,base", "--statsforecast-cache", str(tmp_path / "sf"),
               "--work", str(tmp_path / "work"), "--results", str(tmp_path / "r.json"),
               "--markdown", str(tmp_path / "r.md"), "--settings", '{"max_epochs": 2}']
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)


@pytest.mark.slow
def test_a_grid_of_budgets_is_recorded_point_by_point(tmp_path):
    done = budget(tmp_path, "0.02,0.05")
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "r.json").read_text())
    assert [(p["panel"], p["minutes"]) for p in results["points"]] == [("m1-monthly", 0.02), ("m1-monthly", 0.05)]
    point = results["points"][0]
    assert point["status"] == "passed" and point["settings"]["base_finetune_minutes"] == 0.02
    assert set(point["families"]) == {"dlinear", "base"} and set(point["references"]) >= {"AutoETS", "SeasonalNaive"}
    dlinear = point["families"]["dlinear"]
    assert dlinear["series"] == point["judged_series"] and dlinear["mase_mean"] > 0
    assert 1 <= dlinear["epochs"] <= 2 and dlinear["stopped"] in ("early_stopping", "max_epochs", "max_minutes")
    assert len(dlinear["validation_loss"]) == dlinear["epochs"]
    markdown = (tmp_path / "r.md").read_text()
    assert "| forecaster | 0.02 min | 0.05 min |" in markdown and "| AutoETS |" in markdown
    again = budget(tmp_path, "0.02")  # the statsforecast side is read from the cache this time
    assert again.returncode == 0, again.stderr[-2000:]
    assert len(json.loads((tmp_path / "r.json").read_text())["points"]) == 2
