"""`bench/training.py`: its --quick mode end to end, and the function bench/run.py calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("onnxcast_bench_training", REPO / "bench" / "training.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_quick_mode_prints_and_writes_a_row_per_family_and_variant(tmp_path):
    results = tmp_path / "training.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(REPO / "bench" / "training.py"), "--quick", "--families", "dlinear",
                           "--results", str(results)], check=True, capture_output=True, text=True, timeout=120,
                          env=env)
    assert "| dlinear | series 168/24 | before |" in done.stdout and "| dlinear | series 168/24 | after |" in done.stdout
    rows = json.loads(results.read_text())["rows"]
    assert {r["variant"] for r in rows} >= {"before", "after"}
    before = next(r for r in rows if r["variant"] == "before")
    assert before["ratio"] == 1.0 and before["copied_window_bytes"] > 0  # data.windows' copies
    for row in rows:
        assert row["windows_per_s"] > 0 and row["ratio"] > 0 and row["threads"] == 1
        assert len(row["load_average_before"]) == 3 and len(row["round_windows_per_s"]) == 2
        if row["variant"] != "before":
            assert row["copied_window_bytes"] == 0  # views of the series


def test_training_throughput_measures_the_fleet_path_at_the_given_shapes():
    bench = _bench_module()
    rows = bench.training_throughput(["dlinear"], lookback=36, horizon=18, n_features=2, batch_size=16, threads=1,
                                     seconds_per_candidate=0.2, rounds=2, fleet=True, fleet_series=50, warmup_steps=1)
    variants = [r["variant"] for r in rows]
    assert variants[:2] == ["before", "after"] and len(variants) == len(set(variants))
    for row in rows:
        assert row["family"] == "dlinear" and row["data"] == "fleet"
        assert (row["lookback"], row["horizon"], row["n_features"], row["batch_size"]) == (36, 18, 2, 16)
        assert row["windows_per_s"] > 0
