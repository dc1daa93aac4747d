"""Rolling origins over every phase, hard baselines, the statistical reference, intervals and
paired tests (onnxcast.pipeline.evaluation)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxcast.pipeline.evaluation import (
    MIN_PAIRED_ORIGINS,
    evaluate_baselines,
    holdout_origins,
    mae_interval,
    paired_test,
)


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


def test_an_interval_covers_the_mean_and_narrows_with_more_origins():
    rng = np.random.default_rng(1)
    few, many = rng.normal(10, 2, 30), rng.normal(10, 2, 600)
    low, high = mae_interval(few, block=3)
    assert low < few.mean() < high
    low2, high2 = mae_interval(many, block=3)
    assert (high2 - low2) < (high - low)


def test_paired_test_separates_a_real_difference_from_noise():
    rng = np.random.default_rng(2)
    shared = 50 + 20 * np.sin(np.arange(120) / 4.0)  # hard and easy stretches both models share
    a = shared + rng.normal(0, 1, 120)
    better = paired_test(a - 2.0, a, block=5)
    assert better["significant"] and better["mean_diff"] < 0 and better["p_value"] < 0.01
    noise = paired_test(shared + rng.normal(0, 5, 120), shared + rng.normal(0, 5, 120), block=5)
    assert not noise["significant"] and noise["p_value"] > 0.05
    same = paired_test(a, a, block=5)
    assert same["p_value"] == 1.0 and not same["significant"]
    short = paired_test(a[:MIN_PAIRED_ORIGINS - 1] - 5, a[:MIN_PAIRED_ORIGINS - 1], block=1)
    assert not short["significant"] and "fewer than" in short["note"]


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
    assert reference["mae"] < result["candidates"]["naive"]["mae"]
    low, high = reference["mae_ci95"]
    assert low <= reference["mae"] <= high
    assert len(result["per_origin_mae"]["reference"]) == len(origins.index) == reference["origins"]


def test_the_models_start_from_the_season_that_was_best_on_training_data():
    from onnxcast.pipeline.evaluation import best_anchor_season

    y = hourly_with_weekly_cycle()
    assert best_anchor_season(y[:1500], (24, 168), horizon=24, lookback=168) == 168
    assert best_anchor_season(y[:1500], (24, 168), horizon=24, lookback=48) == 24  # a week does not fit
    flat_week = (100 + 10 * np.sin(2 * np.pi * np.arange(2000) / 24)).astype(np.float32)
    assert best_anchor_season(flat_week, (24, 168), horizon=24, lookback=168) == 24  # ties: the shorter
