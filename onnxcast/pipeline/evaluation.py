"""How forecasts are judged: rolling origins over every phase of the season, hard baselines,
a statistical reference, confidence intervals and paired tests.

- **Origins.** Forecasts start at every ``stride`` steps of the holdout, with a stride well
  below the horizon and coprime with each season, so the origins fall at every hour of the
  day and every day of the week instead of at one phase (twelve non-overlapping origins at
  the same time of day once flipped the family choice). They are aligned at each series' end
  (:func:`holdout_origins`, one rule for one series, for many and for the monitor), as
  statsforecast's ``cross_validation`` lays out its windows.
- **Baselines.** The naive forecast and the seasonal-naive forecast for every seasonality the
  frequency implies (``seasons.seasons_for_freq``); the most accurate on the holdout is THE
  baseline: the gate a model must beat, and the scale of MASE.
- **Reference.** A statistical model on the same origins (statsforecast: MSTL with an AutoETS
  trend for seasonal data, AutoETS otherwise) on a recent window: its parameters are
  estimated again once per horizon of origins and applied to each origin's own history in
  between (statsforecast's ``forward``, as its ``cross_validation(refit=...)``).
- **Uncertainty.** Each MAE has a moving-block bootstrap interval over origins (overlapping
  windows are correlated), and two forecasters are compared by a Diebold-Mariano test on
  their per-origin errors (onnxcast.pipeline.significance: the tests, intervals and their
  minimums, for one series and across series).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from onnxcast.pipeline.intervals import (
    conformal_quantiles,
    independent_windows,
    interval_lag,
    interval_metrics,
    quantiles_from_levels,
    reference_levels,
)
from onnxcast.pipeline.metrics import forecast_metrics, mase_scale, seasonal_naive
from onnxcast.pipeline.significance import block_bootstrap_interval, bootstrap_interval, paired_test

log = logging.getLogger(__name__)

MAX_ORIGINS = 150  # bounds the statistical reference's refits (0.02 s each on weekly data, 0.6 s half-hourly)
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
    """The holdout origins of a series of ``n_rows``, every ``stride`` steps from ``holdout_start``
    (or ``earliest``, whichever is later: room for the longest look back of any forecaster) to
    the last full horizon, ALIGNED AT THE SERIES' END: the last origin is ``n_rows - horizon``.

    The one origins rule of every judging (one series over its origins, many across series) and
    of the monitor. Aligned at the end, origin ``k`` is ``n_rows - back[k]`` with ``back`` a
    function of the holdout's length only, so series of any length with the same holdout get
    the same count, stride and steps back, exactly statsforecast's ``cross_validation(h=horizon,
    n_windows=count, step_size=stride)`` on integer ``ds`` (its cutoffs are ``origin - 1``): the
    models and the statistical reference forecast the same points however it is run. Empty when
    the holdout holds no full horizon."""
    first = max(holdout_start, earliest)
    available = n_rows - horizon - first + 1
    if available < 1:
        return Origins(np.zeros(0, dtype=np.int64), 1, 1)
    stride = origin_stride(horizon, seasons, available)
    count = (available - 1) // stride + 1
    index = n_rows - horizon - stride * np.arange(count - 1, -1, -1, dtype=np.int64)
    return Origins(index, stride, max(1, math.ceil(horizon / stride)))


def actuals(target: np.ndarray, origins: Origins, horizon: int) -> np.ndarray:
    return np.stack([target[o:o + horizon] for o in origins.index]).astype(np.float64)


def per_origin_mae(actual: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    return np.mean(np.abs(np.asarray(predicted, np.float64) - actual), axis=1)


def judged(actual: np.ndarray, predicted: np.ndarray, scale: float, origins: Origins,
           seed: int = 0) -> tuple[dict, np.ndarray]:
    """Holdout metrics of one forecaster, with the MAE's interval and its per-origin errors."""
    metrics = forecast_metrics(actual, predicted, scale)
    errors = per_origin_mae(actual, predicted)
    metrics["mae_ci95"] = block_bootstrap_interval(errors, origins.block, seed=seed)
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


def reference_model(seasons: tuple[int, ...], n_history: int):
    """The statistical reference that fits the data: ``(description, statsforecast model, window)``.

    MSTL (every season with at least two cycles in the window) with an AutoETS trend, else a
    non-seasonal AutoETS, on the last ``window`` rows of each origin (:func:`reference_forecasts`).
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


class ReferenceForecasts(NamedTuple):
    """The statistical reference at every origin: its mean forecasts ``[origins, horizon]``, its
    own intervals as ``quantiles [origins, horizon, Q]`` (None when no levels were asked for
    or some level has no interval) and the seconds it took."""

    name: str
    mean: np.ndarray
    quantiles: np.ndarray | None
    seconds: float


def reference_forecasts(target: np.ndarray, origins: Origins, horizon: int, seasons: tuple[int, ...],
                        levels: tuple[float, ...] = ()) -> ReferenceForecasts:
    """Forecasts of the statistical reference at every origin, with statsforecast's own
    intervals (``level=[80, 95]`` for the default levels) at ``levels``.

    The parameters are estimated (``fit``) at the first origin and again whenever the origin
    has moved a whole horizon since the last estimate, and applied in between to each origin's
    own window (``forward``: the MSTL decomposition and the ETS states are recomputed, the ETS
    parameters kept). Estimating at every origin cost 1.3 s of AutoETS optimisation per origin
    on a tiny run's 133 origins (175 of its 226 s on a loaded machine); once per horizon, the
    reference is still re-estimated in every independent window of the holdout and never sees
    data past its origin."""
    import warnings

    started = time.monotonic()
    first = int(origins.index.min())
    name, model, window = reference_model(seasons, first)
    widths = reference_levels(levels) if levels else []
    forecasts, lows, highs = [], {w: [] for w in widths}, {w: [] for w in widths}
    fitted_at = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for origin in origins.index:
            history = target[max(0, origin - window):origin].astype(np.float64)
            kwargs = {"h": horizon, "level": widths} if widths else {"h": horizon}
            if fitted_at is None or origin - fitted_at >= horizon:
                out = model.fit(y=history).predict(**kwargs)  # predict reuses the fit's decomposition
                fitted_at = origin
            else:
                out = model.forward(y=history, **kwargs)
            forecasts.append(np.asarray(out["mean"], np.float64))
            for w in widths:
                lows[w].append(np.asarray(out[f"lo-{w}"], np.float64))
                highs[w].append(np.asarray(out[f"hi-{w}"], np.float64))
    mean = np.stack(forecasts)
    quantiles = None
    if widths:
        quantiles = quantiles_from_levels({w: np.stack(v) for w, v in lows.items()},
                                          {w: np.stack(v) for w, v in highs.items()}, mean, levels)
    return ReferenceForecasts(name, mean, quantiles, time.monotonic() - started)


def evaluate_baselines(target: np.ndarray, origins: Origins, horizon: int, seasons: tuple[int, ...],
                       train_end: int, reference: bool = True, *, levels: tuple[float, ...] = (),
                       lookback: int | None = None, validation_end: int | None = None) -> dict:
    """Every baseline and the reference on ``origins``; the best baseline is THE baseline.

    Returns the ``baselines`` entry of report.json plus ``per_origin_mae`` arrays (by name) for
    paired tests, and the MASE scale (in-sample MAE of the best baseline's rule on training).
    With ``levels``, the best baseline gets split-conformal intervals calibrated on the
    validation windows ``[train_end, validation_end)`` with the models' window scale over the
    last ``lookback`` steps (:func:`baseline_intervals`), and the reference its own intervals,
    each judged by ``intervals.interval_metrics`` under ``"intervals"``.
    """
    actual = actuals(target, origins, horizon)
    rows, errors = {}, {}
    forecasts = baseline_forecasts(target, origins, horizon, seasons)
    for name, (season, forecast) in forecasts.items():
        metrics = forecast_metrics(actual, forecast, 1.0)
        rows[name] = {"season": season, **metrics}
    best = min(rows, key=lambda k: rows[k]["mae"])
    scale = mase_scale(target[:train_end], rows[best]["season"])
    for name, (season, forecast) in forecasts.items():
        rows[name], errors[name] = judged(actual, forecast, scale, origins)
        rows[name]["season"] = season
    if levels and validation_end is not None:
        rows[best]["intervals"] = baseline_intervals(target, origins, horizon, rows[best]["season"], scale,
                                                     levels, lookback or rows[best]["season"], train_end,
                                                     validation_end)
    out = {"best": best, "mase_scale": scale, "candidates": rows,
           "seasonal_naive": {**rows[best], "name": best},
           "origins": {"count": int(len(origins.index)), "stride": origins.stride, "block": origins.block,
                       "first": int(origins.index[0]), "last": int(origins.index[-1])}}
    if reference:
        ref = reference_forecasts(target, origins, horizon, seasons, levels)
        metrics, errors["reference"] = judged(actual, ref.mean, scale, origins)
        out["reference"] = {"model": ref.name, "seconds": round(ref.seconds, 2), **metrics,
                            "vs_best_baseline": paired_test(errors["reference"], errors[best], origins.block)}
        if levels:
            out["reference"]["intervals"] = reference_intervals(actual, ref, levels, scale)
        log.info("reference %s: MAE %.4g (best baseline %s %.4g) in %.1fs", ref.name, metrics["mae"], best,
                 rows[best]["mae"], ref.seconds)
    out["per_origin_mae"] = {k: v.tolist() for k, v in errors.items()}
    return out


def baseline_intervals(target: np.ndarray, origins: Origins, horizon: int, season: int, scale: float,
                       levels: tuple[float, ...], lookback: int, train_end: int, validation_end: int) -> dict | None:
    """The seasonal-naive baseline's split-conformal intervals on the holdout ``origins``,
    calibrated as the models' are (onnxcast.pipeline.run.calibrate_family): its errors on
    every validation window (forecast steps in ``[train_end, validation_end)``, stride 1),
    scaled by the mean absolute seasonal change of the last ``lookback`` target steps
    (``intervals.window_scale`` at ``interval_lag(season, lookback)``, as the models'), give the offsets; judged by ``interval_metrics`` with the MASE
    ``scale``. None, with a log line, when the validation split holds no usable window."""
    lag = season * math.ceil(horizon / season)
    calibration = np.arange(max(train_end, lookback, lag), validation_end - horizon + 1, dtype=np.int64)
    if len(calibration) == 0 or int(origins.index.min()) < lookback:
        log.info("seasonal naive %d: no validation window to calibrate intervals on", season)
        return None
    cal_forecast = seasonal_naive(target, calibration, horizon, season)
    cal_actual = np.stack([target[o:o + horizon] for o in calibration])
    cal_windows = np.stack([target[o - lookback:o] for o in calibration])
    holdout_windows = np.stack([target[o - lookback:o] for o in origins.index])
    try:
        quantiles, info = conformal_quantiles((cal_forecast, cal_actual, cal_windows),
                                              (seasonal_naive(target, origins.index, horizon, season),
                                               holdout_windows), levels, lag=interval_lag(season, lookback))
    except ValueError as exc:
        log.info("seasonal naive %d: %s", season, exc)
        return None
    return {**interval_metrics(actuals(target, origins, horizon), quantiles, levels, scale, block=origins.block,
                               independent=independent_windows(origins.index, horizon)),
            "levels": list(levels),
            **info, "lookback": int(lookback)}


def reference_intervals(actual: np.ndarray, ref: ReferenceForecasts, levels: tuple[float, ...],
                        scale: float) -> dict | None:
    """The reference's own intervals judged like the models' (None when statsforecast gave no
    interval for some level)."""
    if ref.quantiles is None:
        return None
    return {**interval_metrics(actual, ref.quantiles, levels, scale), "levels": list(levels),
            "method": f"statsforecast level={reference_levels(levels)}"}


# --- fleets: many series judged per series and in aggregate (docs/design/fleet.md section 4) -----

def series_metrics(actual: np.ndarray, predicted: np.ndarray, scale: np.ndarray) -> dict[str, np.ndarray]:
    """Per-series MAE, RMSE, sMAPE (0..200), MAPE (percent; NaN for a series with a zero
    actual) and MASE (MAE over the series' own ``scale``), each over the series' origins and
    steps. ``actual``/``predicted``: ``[series, origins, horizon]``; ``scale``: ``[series]``.
    A series whose forecast is NaN (the forecaster did not run there) gets NaN everywhere."""
    actual = np.asarray(actual, np.float64)
    predicted = np.asarray(predicted, np.float64)
    error = predicted - actual
    denom = np.abs(actual) + np.abs(predicted)
    with np.errstate(divide="ignore", invalid="ignore"):
        smape = np.where(denom > 0, 200.0 * np.abs(error) / denom, 0.0)
        ape = 100.0 * np.abs(error) / np.abs(actual)
    axes = (1, 2)
    mae = np.mean(np.abs(error), axis=axes)
    zero = np.any(actual == 0, axis=axes)
    mape = np.where(zero, np.nan, np.mean(np.where(actual == 0, 0.0, ape), axis=axes))
    smape_mean = np.where(np.isnan(mae), np.nan, np.mean(smape, axis=axes))
    return {"mae": mae, "rmse": np.sqrt(np.mean(error**2, axis=axes)), "smape": smape_mean, "mape": mape,
            "mase": mae / np.asarray(scale, np.float64)}


def fleet_aggregate(table, forecaster: str, *, losers: int = 20, seed: int = 0) -> dict:
    """The aggregate of one forecaster over the series of a per-series table (columns
    ``<forecaster>.<metric>``; ``best_naive.mase`` for the share of series lost to it).

    Means over series of MASE and sMAPE with bootstrap intervals, the median MASE, the mean
    MAPE over the series without a zero actual (``mape_series`` of them), the mean per-series
    MAE and RMSE (in each series' own unit: informational only), and the series where the
    forecaster is worse than that series' best naive (``losers``: the worst by MASE ratio).
    """
    mase = table[f"{forecaster}.mase"].to_numpy(np.float64)
    ran = np.isfinite(mase)
    out = {"forecaster": forecaster, "series": int(ran.sum())}
    if not ran.any():
        return {**out, "mase_mean": None, "mase_ci95": [None, None], "mase_median": None, "smape_mean": None,
                "smape_ci95": [None, None], "mape_mean": None, "mape_series": 0, "mae_mean": None,
                "rmse_mean": None, "loses_share": None, "losers_count": 0, "losers": []}
    smape = table[f"{forecaster}.smape"].to_numpy(np.float64)[ran]
    mape = table[f"{forecaster}.mape"].to_numpy(np.float64)[ran]
    out.update(mase_mean=float(mase[ran].mean()), mase_ci95=bootstrap_interval(mase[ran], seed=seed),
               mase_median=float(np.median(mase[ran])), smape_mean=float(smape.mean()),
               smape_ci95=bootstrap_interval(smape, seed=seed),
               mape_mean=float(np.nanmean(mape)) if np.isfinite(mape).any() else None,
               mape_series=int(np.isfinite(mape).sum()),
               mae_mean=float(table[f"{forecaster}.mae"].to_numpy(np.float64)[ran].mean()),
               rmse_mean=float(table[f"{forecaster}.rmse"].to_numpy(np.float64)[ran].mean()))
    if "best_naive.mase" in table.columns:
        bar = table["best_naive.mase"].to_numpy(np.float64)
        both = ran & np.isfinite(bar)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(bar > 0, mase / bar, np.where(mase > 0, np.inf, 1.0))
        lost = both & (mase > bar)
        order = np.argsort(-np.where(lost, ratio, -np.inf), kind="stable")[: min(losers, int(lost.sum()))]
        ids = table["series"].to_numpy()
        out.update(loses_share=float(lost.sum() / both.sum()) if both.any() else None,
                   losers_count=int(lost.sum()),
                   losers=[{"series": str(ids[i]), "mase": float(mase[i]), "best_naive_mase": float(bar[i]),
                            "mase_ratio": float(ratio[i])} for i in order])
    return out
