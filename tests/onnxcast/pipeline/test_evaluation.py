"""Rolling origins over every phase, hard baselines and the statistical reference
(onnxcast.pipeline.evaluation; its tests and intervals: test_significance.py)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxcast.pipeline.evaluation import evaluate_baselines, holdout_origins


def hourly_with_weekly_cycle(n: int = 24 * 7 * 12, seed: int = 0) -> np.ndarray:
    """Daily shape that differs on weekends: the weekly naive beats the daily one."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    daily = 10 * np.sin(2 * np.pi * t / 24)
    weekend = np.where((t // 24) % 7 >= 5, -25.0, 0.0)
    return (100 + daily + weekend + rng.normal(0, 1.0, n)).astype(np.float32)


def test_origins_visit_every_hour_of_the_day_and_stay_bounded():
    origins = holdout_origins(n_rows=4000, holdout_start=3400, horizon=24, seasons=(24, 168), earliest=168)
    assert origins.stride < 24 and np.gcd(origins.stride, 24) == 1
    assert set(origins.index % 24) == set(range(24))  # not 12 origins at one time of day
    assert len(origins.index) <= 150 and origins.index[-1] + 24 <= 4000
    assert origins.block == int(np.ceil(24 / origins.stride))


def test_one_series_and_a_fleet_share_one_origins_rule_aligned_at_the_end_as_statsforecast():
    """Issue 31: one origins function for both judgings and the monitor. One series' holdout
    origins are statsforecast's cross_validation cutoffs + 1 (as a fleet's always were), the
    last at the last full horizon, the same steps back as a fleet with that holdout. Before,
    one series' origins started at the holdout's start and could end up to a stride early."""
    import pandas as pd
    from statsforecast import StatsForecast
    from statsforecast.models import Naive

    from onnxcast.pipeline.fleet_eval import steps_back

    n, start, horizon, seasons = 1500, 1100, 24, (24, 168)
    origins = holdout_origins(n, holdout_start=start, horizon=horizon, seasons=seasons, earliest=168)
    assert origins.index[-1] == n - horizon and origins.index[0] >= start
    assert (n - horizon - start) % origins.stride != 0  # a holdout where the two alignments differ
    back, stride = steps_back(n - start, horizon, seasons)
    assert stride == origins.stride and (n - back).tolist() == origins.index.tolist()
    y = hourly_with_weekly_cycle(n).astype(np.float64)
    frame = pd.DataFrame({"unique_id": "s", "ds": np.arange(n), "y": y})
    cv = StatsForecast(models=[Naive()], freq=1).cross_validation(h=horizon, df=frame, n_windows=len(origins.index),
                                                                   step_size=origins.stride)
    assert (np.sort(cv["cutoff"].unique()) + 1).tolist() == origins.index.tolist()


def test_the_best_baseline_is_the_weekly_one_on_weekly_data_and_the_reference_runs():
    y = hourly_with_weekly_cycle()
    origins = holdout_origins(len(y), holdout_start=len(y) - 300, horizon=24, seasons=(24, 168), earliest=168)
    result = evaluate_baselines(y, origins, 24, (24, 168), train_end=len(y) - 600, reference=True)
    names = set(result["candidates"])
    assert names == {"naive", "seasonal_naive_24", "seasonal_naive_168"}
    assert result["best"] == "seasonal_naive_168"
    assert result["seasonal_naive"]["season"] == 168
    assert result["candidates"]["seasonal_naive_168"]["mase"] == pytest.approx(
        result["candidates"]["seasonal_naive_168"]["mae"] / result["mase_scale"])
    reference = result["reference"]
    assert reference["model"].startswith("MSTL(seasons=[24, 168]")
    assert "intervals" not in reference and "intervals" not in result["seasonal_naive"]  # no levels asked for
    assert reference["mae"] < result["candidates"]["naive"]["mae"]
    low, high = reference["mae_ci95"]
    assert low <= reference["mae"] <= high
    assert len(result["per_origin_mae"]["reference"]) == len(origins.index) == reference["origins"]


def test_the_models_start_from_the_season_that_was_best_on_training_data():
    """One series is a fleet of one: the fleet's anchor choice, its own scale cancelling."""
    from onnxcast.pipeline.fleet_data import FleetData, FleetSplit
    from onnxcast.pipeline.fleet_train import anchor_season

    def best(y, lookback):
        one = FleetData.one(y[:, None], np.arange(len(y)).astype("datetime64[h]").astype("datetime64[ns]"),
                            series_id="y", columns=("y",), freq="h", season=24, source="mem", sha256="0")
        n = np.array([len(y)])
        split = FleetSplit(lengths=n, train_end=n, validation_end=n, holdout_steps=0, validation_steps=0)
        return anchor_season(one, split, (24, 168), horizon=24, lookback=lookback)

    y = hourly_with_weekly_cycle()
    assert best(y[:1500], lookback=168) == 168
    assert best(y[:1500], lookback=48) == 24  # a week does not fit
    flat_week = (100 + 10 * np.sin(2 * np.pi * np.arange(2000) / 24)).astype(np.float32)
    assert best(flat_week, lookback=168) == 24  # ties: the shorter


# --- forecast distributions of the baselines and the reference -------------------------------

LEVELS = (0.025, 0.1, 0.5, 0.9, 0.975)


def test_the_numpy_window_scale_is_the_graph_s_interval_scale():
    """The baseline's intervals are scaled like the models': intervals.window_scale must equal
    QuantileOutput.interval_scale, for the LSTM's whole history and a window family's lookback."""
    import torch

    from onnxcast.pipeline.intervals import window_scale
    from onnxcast.pipeline.models import ModelSpec, build_model

    rng = np.random.default_rng(3)
    history = np.cumsum(rng.normal(0, 5, (6, 40, 1)), axis=1) + 1000.0
    history[0] = 7.0  # a constant window: the floor, not zero
    lstm = build_model(ModelSpec(family="lstm", n_features=1, horizon=4, lookback=40, hidden_size=8, num_layers=1,
                                 season=4), np.array([0.0]), np.array([1.0]))
    nhits = build_model(ModelSpec(family="nhits", n_features=1, horizon=4, lookback=24, hidden_size=4, season=4),
                        np.array([0.0]), np.array([1.0]))
    got = lstm.interval_scale(torch.from_numpy(history)).numpy()
    assert lstm.interval_lag == nhits.interval_lag == 4  # the season, shorter than the lookback
    np.testing.assert_allclose(window_scale(history[:, :, 0], 4), got, rtol=1e-12)
    got = nhits.interval_scale(torch.from_numpy(history)).numpy()
    np.testing.assert_allclose(window_scale(history[:, -24:, 0], 4), got, rtol=1e-12)
    assert 0 < window_scale(history[:1, :, 0])[0] < 1e-4


def test_the_best_baseline_gets_intervals_calibrated_on_validation_not_on_holdout():
    """The same noise everywhere: close to nominal. A holdout noisier than the validation split
    the intervals were calibrated on: they under-cover (the window scale follows the noise
    part of the way only)."""
    n, horizon = 24 * 7 * 12, 24
    train_end, validation_end = n - 600, n - 300

    def judged_intervals(holdout_noise: float) -> dict:
        y = hourly_with_weekly_cycle(n).astype(np.float64)
        rng = np.random.default_rng(5)
        y[validation_end:] += rng.normal(0, holdout_noise, n - validation_end)
        origins = holdout_origins(n, holdout_start=validation_end, horizon=horizon, seasons=(24, 168), earliest=168)
        result = evaluate_baselines(y, origins, horizon, (24, 168), train_end=train_end, reference=False,
                                    levels=LEVELS, lookback=168, validation_end=validation_end)
        assert result["best"] == "seasonal_naive_168"
        assert result["candidates"]["seasonal_naive_168"]["intervals"] == result["seasonal_naive"]["intervals"]
        assert "intervals" not in result["candidates"]["naive"]  # the best baseline only
        return result["seasonal_naive"]["intervals"]

    same = judged_intervals(0.0)
    assert same["levels"] == list(LEVELS) and same["windows"] == 600 - 300 - horizon + 1 - 0
    assert abs(same["coverage_80"] - 0.80) < 0.1 and abs(same["coverage_95"] - 0.95) < 0.06
    assert same["crossing"] == 0.0 and same["msis_95"] > same["width_95"] > same["width_80"] > 0
    noisier = judged_intervals(4.0)  # the holdout's noise about 4x the validation's
    assert noisier["coverage_95"] < 0.95 - 0.1 and noisier["msis_95"] > 1.5 * same["msis_95"]


def test_the_reference_reports_its_own_intervals_on_a_tiny_series():
    from onnxcast.pipeline.evaluation import Origins, reference_forecasts, reference_model

    rng = np.random.default_rng(4)
    y = 50 + np.cumsum(rng.normal(0, 1, 120))
    origins = Origins(np.arange(90, 116, 5), 5, 1)
    ref = reference_forecasts(y, origins, 4, (1,), LEVELS)
    assert ref.name == "AutoETS" and ref.quantiles.shape == (len(origins.index), 4, 5)
    _, model, window = reference_model((1,), 90)
    direct = model.forecast(y=y[max(0, 90 - window):90], h=4, level=[80, 95])
    np.testing.assert_allclose(ref.quantiles[0], np.stack([direct["lo-95"], direct["lo-80"], direct["mean"],
                                                           direct["hi-80"], direct["hi-95"]], axis=-1))
    result = evaluate_baselines(y, origins, 4, (1,), train_end=60, reference=True, levels=LEVELS, lookback=20,
                                validation_end=90)
    intervals = result["reference"]["intervals"]
    assert intervals["method"] == "statsforecast level=[80, 95]" and intervals["crossing"] == 0.0
    assert 0 <= intervals["coverage_80"] <= intervals["coverage_95"] <= 1
    assert intervals["msis_95"] >= intervals["width_95"] > intervals["width_80"] > 0
    assert reference_forecasts(y, origins, 4, (1,)).quantiles is None  # no levels: no intervals
