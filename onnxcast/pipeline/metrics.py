"""Forecast accuracy: MAE, RMSE, sMAPE, MASE, and the seasonal-naive baseline."""

from __future__ import annotations

import numpy as np


def seasonal_naive(series: np.ndarray, origins: np.ndarray, horizon: int, season: int) -> np.ndarray:
    """Forecast ``y[o + h] = y[o + h - season * (h // season + 1)]`` for each origin ``o``.

    ``series`` is the 1-D target; returns ``[len(origins), horizon]``.
    """
    steps = np.arange(horizon)
    lags = season * (steps // season + 1)
    index = origins[:, None] + steps[None, :] - lags[None, :]
    if index.min() < 0:
        raise ValueError(f"seasonal naive needs {int(-index.min())} more rows before the first origin")
    return series[index]


def mase_scale(train_target: np.ndarray, season: int) -> float:
    """Mean absolute seasonal difference on the training segment (the MASE denominator)."""
    if len(train_target) <= season:
        season = 1
    diffs = np.abs(train_target[season:] - train_target[:-season])
    scale = float(diffs.mean()) if len(diffs) else 0.0
    return scale if scale > 0 else 1.0


def forecast_metrics(actual: np.ndarray, predicted: np.ndarray, scale: float) -> dict[str, float]:
    """MAE, RMSE, sMAPE (percent, 0..200) and MASE over all forecast steps."""
    actual = np.asarray(actual, dtype=np.float64)
    predicted = np.asarray(predicted, dtype=np.float64)
    error = predicted - actual
    denom = np.abs(actual) + np.abs(predicted)
    with np.errstate(divide="ignore", invalid="ignore"):
        smape_terms = np.where(denom > 0, 200.0 * np.abs(error) / denom, 0.0)
    mae = float(np.mean(np.abs(error)))
    return {
        "mae": mae,
        "rmse": float(np.sqrt(np.mean(error**2))),
        "smape": float(np.mean(smape_terms)),
        "mase": mae / scale,
    }
