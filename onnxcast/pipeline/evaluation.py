"""How forecasts are judged: rolling origins over every phase of the season, hard baselines,
a statistical reference, confidence intervals and paired tests.

- **Origins.** Forecasts start at every ``stride`` steps of the holdout, with a stride well
  below the horizon and coprime with each season, so the origins fall at every hour of the
  day and every day of the week instead of at one phase (twelve non-overlapping origins at
  the same time of day once flipped the family choice).
- **Baselines.** The naive forecast and the seasonal-naive forecast for every seasonality the
  frequency implies (``data.seasons_for_freq``); the most accurate on the holdout is THE
  baseline: the gate a model must beat, and the scale of MASE.
- **Reference.** A statistical model on the same origins (statsforecast: MSTL with an AutoETS
  trend for seasonal data, AutoETS otherwise), refitted at each origin on a recent window.
- **Uncertainty.** Each MAE has a moving-block bootstrap interval over origins (overlapping
  windows are correlated), and two forecasters are compared by a Diebold-Mariano test on
  their per-origin errors (Newey-West variance, Harvey-Leybourne-Newbold correction). With
  fewer than ``MIN_PAIRED_ORIGINS`` origins, or p >= ``ALPHA``, a difference is not significant.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from onnxcast.pipeline.metrics import forecast_metrics, mase_scale, seasonal_naive

log = logging.getLogger(__name__)

ALPHA = 0.05  # two-sided significance level of paired comparisons
MIN_PAIRED_ORIGINS = 20  # fewer origins: no difference is called significant
MAX_ORIGINS = 150  # bounds the statistical reference's refits (0.02 s each on weekly data, 0.6 s half-hourly)
BOOTSTRAP_SAMPLES = 1000
REFERENCE_WINDOW_CYCLES = 4  # the reference is refitted on the last 4 cycles of the longest season


@dataclass(frozen=True)
class Origins:
    """Forecast origins in the holdout: ``index`` of each first forecast step, their stride, and
    the block length of correlated neighbours (origins whose windows overlap)."""

    index: np.ndarray
    stride: int
    block: int


def origin_stride(horizon: int, seasons: tuple[int, ...], n_available: int) -> int:
    """The smallest stride of at most a quarter horizon that is coprime with every season and
    keeps at most ``MAX_ORIGINS`` origins; every phase of each season gets visited."""
    stride = max(1, math.ceil(n_available / MAX_ORIGINS))
    while any(s > 1 and math.gcd(stride, s) != 1 for s in seasons):
        stride += 1
    return stride


def holdout_origins(n_rows: int, holdout_start: int, horizon: int, seasons: tuple[int, ...],
                    earliest: int = 0) -> Origins:
    """Origins from ``holdout_start`` (or ``earliest``, whichever is later) to the last full
    horizon. ``earliest`` leaves room for the longest look back of any forecaster."""
    first = max(holdout_start, earliest)
    available = n_rows - horizon - first + 1
    if available < 1:
        return Origins(np.zeros(0, dtype=np.int64), 1, 1)
    stride = origin_stride(horizon, seasons, available)
    index = np.arange(first, n_rows - horizon + 1, stride, dtype=np.int64)
    return Origins(index, stride, max(1, math.ceil(horizon / stride)))


def actuals(target: np.ndarray, origins: Origins, horizon: int) -> np.ndarray:
    return np.stack([target[o:o + horizon] for o in origins.index]).astype(np.float64)


def per_origin_mae(actual: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    return np.mean(np.abs(np.asarray(predicted, np.float64) - actual), axis=1)


def mae_interval(errors: np.ndarray, block: int, level: float = 0.95, seed: int = 0) -> list[float]:
    """Moving-block bootstrap percentile interval of the mean of ``errors`` (per-origin MAEs)."""
    n = len(errors)
    if n < 2:
        return [float("nan"), float("nan")]
    block = max(1, min(block, n))
    rng = np.random.default_rng(seed)
    blocks = math.ceil(n / block)
    starts = rng.integers(0, n - block + 1, size=(BOOTSTRAP_SAMPLES, blocks))
    picks = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(BOOTSTRAP_SAMPLES, -1)[:, :n]
    means = errors[picks].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return [float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))]


def paired_test(errors_a: np.ndarray, errors_b: np.ndarray, block: int) -> dict:
    """Diebold-Mariano test of equal accuracy of A and B on the same origins.

    ``mean_diff`` < 0 means A is more accurate. The variance of the mean difference is the
    Newey-West estimate with ``block - 1`` lags (windows of neighbouring origins overlap);
    the statistic gets the Harvey-Leybourne-Newbold small-sample correction and a t
    distribution with n - 1 degrees of freedom.
    """
    from scipy import stats

    d = np.asarray(errors_a, np.float64) - np.asarray(errors_b, np.float64)
    n = len(d)
    result = {"test": "Diebold-Mariano (Newey-West, HLN)", "origins": n, "mean_diff": float(d.mean()) if n else None,
              "statistic": None, "p_value": None, "significant": False, "min_origins": MIN_PAIRED_ORIGINS,
              "alpha": ALPHA}
    if n < MIN_PAIRED_ORIGINS:
        result["note"] = f"{n} paired origins, fewer than {MIN_PAIRED_ORIGINS}: not significant"
        return result
    lags = max(0, min(block - 1, n - 1))
    centred = d - d.mean()
    variance = float(centred @ centred) / n
    for lag in range(1, lags + 1):
        weight = 1.0 - lag / (lags + 1)
        variance += 2.0 * weight * float(centred[lag:] @ centred[:-lag]) / n
    if variance <= 0:
        identical = bool(np.allclose(d, 0.0))
        result.update(statistic=0.0 if identical else float("inf") * np.sign(d.mean()),
                      p_value=1.0 if identical else 0.0, significant=not identical)
        return result
    dm = d.mean() / math.sqrt(variance / n)
    h = lags + 1
    correction = math.sqrt(max((n + 1 - 2 * h + h * (h - 1) / n) / n, 1e-12))
    statistic = float(dm * correction)
    p_value = float(2.0 * stats.t.sf(abs(statistic), df=n - 1))
    result.update(statistic=statistic, p_value=p_value, significant=p_value < ALPHA)
    return result


def judged(actual: np.ndarray, predicted: np.ndarray, scale: float, origins: Origins,
           seed: int = 0) -> tuple[dict, np.ndarray]:
    """Holdout metrics of one forecaster, with the MAE's interval and its per-origin errors."""
    metrics = forecast_metrics(actual, predicted, scale)
    errors = per_origin_mae(actual, predicted)
    metrics["mae_ci95"] = mae_interval(errors, origins.block, seed=seed)
    metrics["origins"] = int(len(errors))
    return metrics, errors


# --- baselines and the statistical reference --------------------------------------------------

def baseline_forecasts(target: np.ndarray, origins: Origins, horizon: int,
                       seasons: tuple[int, ...]) -> dict[str, tuple[int, np.ndarray]]:
    """``{name: (season, forecast)}``: naive and seasonal naive for each season the data allows."""
    out = {"naive": (1, seasonal_naive(target, origins.index, horizon, 1))}
    first = int(origins.index.min()) if len(origins.index) else 0
    for season in sorted(set(seasons)):
        if season <= 1:
            continue
        if first - season * math.ceil(horizon / season) < 0:
            log.info("seasonal naive %d skipped: the holdout starts %d rows in", season, first)
            continue
        out[f"seasonal_naive_{season}"] = (season, seasonal_naive(target, origins.index, horizon, season))
    return out


def best_anchor_season(train_target: np.ndarray, seasons: tuple[int, ...], horizon: int, lookback: int) -> int:
    """The season whose seasonal-naive forecast was most accurate on the training segment,
    among those the model's history holds (``season <= lookback``): what the models start
    from. Weekly beats daily on most hourly demand; only training data is looked at."""
    candidates = sorted({s for s in seasons if 1 <= s <= lookback} or {1})
    steps = np.arange(horizon)
    best, best_mae = candidates[0], float("inf")
    for season in candidates:
        lags = season * (steps // season + 1)
        first = int(lags.max())
        origins = np.arange(first, len(train_target) - horizon + 1)
        if len(origins) == 0:
            continue
        forecast = seasonal_naive(train_target, origins, horizon, season)
        actual = np.stack([train_target[o:o + horizon] for o in origins[:: max(1, len(origins) // 2000)]])
        mae = float(np.mean(np.abs(forecast[:: max(1, len(origins) // 2000)] - actual)))
        if mae < best_mae:
            best, best_mae = season, mae
    return best


def reference_model(seasons: tuple[int, ...], n_history: int):
    """The statistical reference that fits the data: ``(description, statsforecast model, window)``.

    MSTL (every season with at least two cycles in the window) with an AutoETS trend, else a
    non-seasonal AutoETS. Refitted per origin on the last ``window`` rows.
    """
    from statsforecast.models import MSTL, AutoETS

    longest = max(seasons)
    window = min(n_history, max(REFERENCE_WINDOW_CYCLES * longest, 200))
    usable = [s for s in sorted(set(seasons)) if s > 1 and 2 * s <= window]
    if usable:
        model = MSTL(season_length=usable if len(usable) > 1 else usable[0],
                     trend_forecaster=AutoETS(model="ZZN"))
        return f"MSTL(seasons={usable}, trend=AutoETS)", model, window
    return "AutoETS", AutoETS(model="ZZN"), window


def reference_forecasts(target: np.ndarray, origins: Origins, horizon: int,
                        seasons: tuple[int, ...]) -> tuple[str, np.ndarray, float]:
    """Forecasts of the statistical reference at every origin; (description, forecasts, seconds)."""
    import warnings

    started = time.monotonic()
    first = int(origins.index.min())
    name, model, window = reference_model(seasons, first)
    forecasts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for origin in origins.index:
            history = target[max(0, origin - window):origin].astype(np.float64)
            forecasts.append(np.asarray(model.forecast(y=history, h=horizon)["mean"], np.float64))
    return name, np.stack(forecasts), time.monotonic() - started


def evaluate_baselines(target: np.ndarray, origins: Origins, horizon: int, seasons: tuple[int, ...],
                       train_end: int, reference: bool = True) -> dict:
    """Every baseline and the reference on ``origins``; the best baseline is THE baseline.

    Returns the ``baselines`` entry of report.json plus ``per_origin_mae`` arrays (by name) for
    paired tests, and the MASE scale (in-sample MAE of the best baseline's rule on training).
    """
    actual = actuals(target, origins, horizon)
    rows, errors = {}, {}
    for name, (season, forecast) in baseline_forecasts(target, origins, horizon, seasons).items():
        metrics = forecast_metrics(actual, forecast, 1.0)
        rows[name] = {"season": season, **metrics}
    best = min(rows, key=lambda k: rows[k]["mae"])
    scale = mase_scale(target[:train_end], rows[best]["season"])
    for name, (season, forecast) in baseline_forecasts(target, origins, horizon, seasons).items():
        rows[name], errors[name] = judged(actual, forecast, scale, origins)
        rows[name]["season"] = season
    out = {"best": best, "mase_scale": scale, "candidates": rows,
           "seasonal_naive": {**rows[best], "name": best},
           "origins": {"count": int(len(origins.index)), "stride": origins.stride, "block": origins.block,
                       "first": int(origins.index[0]), "last": int(origins.index[-1])}}
    if reference:
        name, forecast, seconds = reference_forecasts(target, origins, horizon, seasons)
        metrics, errors["reference"] = judged(actual, forecast, scale, origins)
        out["reference"] = {"model": name, "seconds": round(seconds, 2), **metrics,
                            "vs_best_baseline": paired_test(errors["reference"], errors[best], origins.block)}
        log.info("reference %s: MAE %.4g (best baseline %s %.4g) in %.1fs", name, metrics["mae"], best,
                 rows[best]["mae"], seconds)
    out["per_origin_mae"] = {k: v.tolist() for k, v in errors.items()}
    return out
