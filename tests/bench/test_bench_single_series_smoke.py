"""`bench/single_series.py`: its simulation and table end to end (the `run` subcommand is
`onnxcast.cli.main` per series, which tests/cli covers), and how it picks and reads series."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("onnxcast_bench_single_series", REPO / "bench" / "single_series.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_simulate_writes_the_false_refusal_table(tmp_path):
    results, markdown = tmp_path / "r.json", tmp_path / "r.md"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "single_series.py"), "--results", str(results),
                           "--markdown", str(markdown), "simulate", "--trials", "3"],
                          check=True, capture_output=True, text=True, timeout=120, env={**os.environ})
    simulation = json.loads(results.read_text())["simulate"]
    assert simulation["windows"] == [2, 4, 10, 20, 30] and len(simulation["rows"]) == 4
    assert all(0 <= r <= 1 for row in simulation["rows"] for r in row["refused"])
    assert "| horizon | AR | 2 windows |" in done.stdout and markdown.read_text() == done.stdout.rstrip("\n") + "\n"


def test_the_sample_holds_only_series_the_split_has_room_for_and_the_summary_counts_what_shipped():
    bench = _bench_module()
    panel = bench.load_panels_module().load_panel("m3-quarterly")
    picked = bench.pick_series(panel, 5)
    assert len(picked) == 5 and picked == bench.pick_series(panel, 5)  # seeded
    lengths = panel.frame.groupby("unique_id").size()
    assert all(bench.rows_needed(int(lengths[i]), 8, 8) for i in picked)
    assert not bench.rows_needed(24, 8, 8)  # the shortest M3 quarterly series
    shipped = {"panel": "p", "exit_code": 0, "seasonal_naive_mae": 10.0, "families": {},
               "shipped": {"mae": 8.0, "intervals": "not_judged"}}
    refused = {"panel": "p", "exit_code": 3, "seasonal_naive_mae": 5.0, "shipped": None,
               "families": {"dlinear": {"beats_baseline": True, "failures": ["fp32 80% interval covers 60.0% ..."]}}}
    summary = bench.summarize([shipped, refused])
    assert (summary["shipped"], summary["refused_on_coverage_alone"]) == (1, 1)
    assert (summary["shipped_mae_total"], summary["shipped_seasonal_naive_mae_total"]) == (8.0, 10.0)
    assert (summary["served_mae_total"], summary["seasonal_naive_mae_total"]) == (13.0, 15.0)
