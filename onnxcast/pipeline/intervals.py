"""Forecast distributions: split-conformal quantiles folded into the ONNX graph, and the
measures they are judged by on holdout.

**How the quantiles are made** (docs/intervals.md). After training, the model forecasts the
validation windows; each error is divided by its window's scale (the mean absolute seasonal
change of the target over the window, :meth:`onnxcast.pipeline.models.QuantileOutput.interval_scale`),
and the split-conformal quantile of those scaled errors at every level and horizon step
becomes the constant ``offsets[horizon, Q]`` of the graph: ``quantiles = forecast + scale *
offsets``. Scaling per window is what lets one calibration serve every series of a fleet.
With fewer than :data:`MIN_WINDOWS_PER_STEP` validation windows the steps share one shape
(errors divided by each step's mean absolute scaled error, pooled, then scaled back), so a
short validation split does not give the 97.5% quantile of 20 numbers. Nothing outside ONNX
Runtime is needed on a device: the offsets are an initializer, the scale four ops.

**How they are judged.** :func:`interval_metrics`: the coverage and mean width of every
central interval the levels hold (0.025/0.975 is the 95% interval), MSIS (the M4
competition's mean scaled interval score) of each, and the scaled pinball loss averaged over
the levels (a discrete CRPS estimate), all scaled like MASE.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from onnxcast.base.contract import central_intervals
from onnxcast.pipeline.significance import block_bootstrap_interval

log = logging.getLogger(__name__)

MIN_WINDOWS_PER_STEP = 200  # fewer validation windows: the horizon steps share one error shape
# A coverage is judged (its confidence interval may refuse anything) only on at least this many
# independent holdout windows: non-overlapping windows of the horizon, counted over a fleet's
# series. Fewer: reported with the count, not judged. Measured (bench/single_series.py simulate,
# 300 trials each: a perfectly calibrated 80% interval, forecast errors sharing an AR(1) shock
# across origins, the gate of 5 points off nominal and outside the moving-block bootstrap
# interval): it refused that interval in 43% of trials on 2 independent windows of a 24-step
# horizon (the monthly series: 25 origins), 20% on 4, 5% on 10, and 2-11% on 20
# (horizons 8-24, AR 0.5-0.8; 17% with errors as persistent as AR 0.9). Below about 20 blocks the
# bootstrap has too few to resample; 30 would halve the rate again but judge fewer series, and a
# miss now recalibrates rather than refuses unless strict_intervals is set.
MIN_INDEPENDENT_WINDOWS = 20
# The interval scale of a window: its mean absolute change over ``interval_lag`` steps plus a
# floor relative to its level, so a constant window gets a tiny, not a zero, scale and the scale
# of c * x is c times the scale of x. Shared by the graph (models.QuantileOutput.interval_scale)
# and window_scale.
SCALE_EPS_RELATIVE = 1e-6
SCALE_FLOOR = 1e-30


def interval_lag(season: int, lookback: int) -> int:
    """The lag of the interval scale: the season when the window holds more than one season
    (every history is at least ``lookback`` steps), else 1. A function of the model's spec, so a
    model built again from its model.json gets the lag it was calibrated with. The one-step
    change counted a regular seasonal swing, which the forecast follows, as uncertainty: on M3
    quarterly it gave MSIS (95%) 14.0-14.4 against 10.2-10.5 with the same forecasts."""
    return int(season) if 1 < int(season) < int(lookback) else 1


def moving_windows(windows: np.ndarray, lag: int = 1) -> np.ndarray:
    """``[N]`` bool: the windows ``[N, steps]`` whose change at ``lag`` (the scale's) is more
    than the scale's level-relative floor, ten times over. The others (a constant window, or one
    that repeats exactly with the season) would have a scale of ~1e-6 x their level and scaled
    errors of a million: calibration leaves them out."""
    windows = np.asarray(windows, np.float64)
    change = np.abs(windows[:, lag:] - windows[:, :-lag]).mean(axis=1)
    return change > 10 * SCALE_EPS_RELATIVE * np.abs(windows).mean(axis=1)


def calibration_windows(windows: np.ndarray, lag: int) -> np.ndarray:
    """The windows calibration uses: those that move at the scale's ``lag``
    (:func:`moving_windows`). When none does (a perfectly periodic series: every window has
    the floor for scale, consistently, so the errors scale back to their size), every window
    that moves at all; ValueError when every window is constant."""
    moving = moving_windows(windows, lag)
    if moving.any():
        return moving
    moving = np.abs(np.diff(np.asarray(windows, np.float64), axis=1)).mean(axis=1) > 0
    if not moving.any():
        raise ValueError(f"no validation window to calibrate the intervals on: all {len(windows)} are constant")
    log.warning("intervals: every validation window repeats with the season (lag %d): calibrated on their "
                "floor scale", lag)
    return moving


def conformal_quantile(sorted_values: np.ndarray, level: float) -> float:
    """The split-conformal quantile of ``level`` of ``n`` sorted scores: the
    ``ceil((n + 1) * level)``-th smallest for an upper level, the ``floor((n + 1) * level)``-th
    for a lower one, so each tail holds at most its share; clipped to the sample when ``n`` is
    too small for the level (:func:`tails_beyond_sample`: the tail then holds ``1 / (n + 1)``)."""
    n = len(sorted_values)
    if level >= 0.5:
        k = math.ceil((n + 1) * level)
    else:
        k = math.floor((n + 1) * level)
    return float(sorted_values[min(max(k, 1), n) - 1])


def tails_beyond_sample(n: int, levels: tuple[float, ...]) -> list[float]:
    """The levels whose conformal quantile falls outside ``n`` scores (``(n + 1) * level > n``
    or ``< 1``): clipped to the sample's extreme, their tail holds ``1 / (n + 1)``, more than
    its share."""
    return [q for q in levels if math.ceil((n + 1) * q) > n or (q < 0.5 and math.floor((n + 1) * q) < 1)]


def offsets_from_errors(scaled: np.ndarray, levels: tuple[float, ...]) -> tuple[np.ndarray, str]:
    """``offsets [horizon, Q]`` from scaled errors ``[n, horizon]`` (actual - forecast over the
    window scale), ascending along Q, and how they were made (``"per_step"`` or ``"pooled"``)."""
    scaled = np.asarray(scaled, np.float64)
    n, horizon = scaled.shape
    offsets = np.zeros((horizon, len(levels)))
    if n >= MIN_WINDOWS_PER_STEP:
        method = "per_step"
        for h in range(horizon):
            column = np.sort(scaled[:, h])
            offsets[h] = [conformal_quantile(column, q) for q in levels]
    else:
        method = "pooled"
        size = np.mean(np.abs(scaled), axis=0)
        size = np.where(size > 0, size, 1.0)
        pooled = np.sort((scaled / size).ravel())
        shape = np.array([conformal_quantile(pooled, q) for q in levels])
        offsets = size[:, None] * shape[None, :]
    return np.maximum.accumulate(offsets, axis=1), method


def calibrate(model, x: np.ndarray, y: np.ndarray, levels: tuple[float, ...], batch_size: int = 1024) -> dict:
    """Set ``model``'s quantile offsets from the validation windows ``x [n, time, F]``,
    ``y [n, horizon]`` (raw units); returns what was done, for model.json and the report.

    Windows whose target did not move (scale at its floor) are left out: their scaled error is
    meaningless. ValueError when no window is left."""
    import torch

    model.eval()
    if not model.has_quantiles:
        model.add_quantiles(y.shape[1], len(levels))
    elif tuple(model.quantile_offsets.shape) != (y.shape[1], len(levels)):
        model.add_quantiles(y.shape[1], len(levels))
    forecasts, scales = [], []
    with torch.inference_mode():
        for start in range(0, len(x), batch_size):
            part = torch.from_numpy(np.ascontiguousarray(x[start:start + batch_size], dtype=np.float32))
            forecasts.append(model(part).double().numpy())
            scales.append(model.interval_scale(part).double().numpy())
    forecast, scale = np.concatenate(forecasts), np.concatenate(scales)
    window = x[:, -getattr(model, "interval_lookback", x.shape[1]):, 0].astype(np.float64)
    moving = calibration_windows(window, getattr(model, "interval_lag", 1))
    errors = (y.astype(np.float64) - forecast)[moving] / scale[moving, None]
    offsets, method = offsets_from_errors(errors, levels)
    short = tails_beyond_sample(len(errors) * (errors.shape[1] if method == "pooled" else 1), levels)
    if short:
        log.warning("intervals: %d scaled errors per quantile are too few for the levels %s: their quantile is the "
                    "sample's extreme, and the interval covers less than nominal", len(errors), short)
    with torch.no_grad():
        model.quantile_offsets.copy_(torch.from_numpy(offsets.astype(np.float32)))
    covered = {interval_key(nominal): float(np.mean((errors >= offsets[None, :, lo]) & (errors <= offsets[None, :, hi])))
               for lo, hi, nominal in central_intervals(levels)}
    log.info("intervals calibrated on %d windows (%s): in-sample coverage %s", int(moving.sum()), method,
             ", ".join(f"{k}%: {v:.3f}" for k, v in covered.items()))
    return {"method": "split-conformal, scaled per window", "shape": method, "windows": int(moving.sum()),
            "constant_windows_left_out": int((~moving).sum()), "levels": list(levels),
            "validation_coverage": covered}


def window_scale(windows: np.ndarray, lag: int = 1) -> np.ndarray:
    """``[N]``: the interval scale of each target window ``[N, steps]`` at ``lag``, the numpy
    twin of :meth:`onnxcast.pipeline.models.QuantileOutput.interval_scale`, for forecasters
    outside the graph (the seasonal-naive baseline) calibrated the same way as the models."""
    windows = np.asarray(windows, np.float64)
    change = np.abs(windows[:, lag:] - windows[:, :-lag]).mean(axis=1)
    return change + SCALE_EPS_RELATIVE * np.abs(windows).mean(axis=1) + SCALE_FLOOR


def conformal_quantiles(calibration: tuple[np.ndarray, np.ndarray, np.ndarray],
                        target: tuple[np.ndarray, np.ndarray], levels: tuple[float, ...],
                        lag: int = 1) -> tuple[np.ndarray, dict]:
    """Split-conformal ``quantiles [N, horizon, Q]`` for a forecaster outside the graph, made
    as :func:`calibrate` makes the models': ``calibration`` is ``(forecast [n, horizon],
    actual [n, horizon], windows [n, steps])`` on the validation windows, ``target`` is
    ``(forecast [N, horizon], windows [N, steps])`` where the quantiles are wanted; windows
    are the target steps the scale reads (at ``lag``, :func:`interval_lag`). Constant
    calibration windows are left out; ValueError when none is left. Returns the quantiles and
    what was done."""
    forecast, actual, windows = (np.asarray(a, np.float64) for a in calibration)
    moving = calibration_windows(windows, lag)
    errors = (actual - forecast)[moving] / window_scale(windows[moving], lag)[:, None]
    offsets, method = offsets_from_errors(errors, levels)
    point, where = (np.asarray(a, np.float64) for a in target)
    quantiles = point[..., None] + window_scale(where, lag)[:, None, None] * offsets[None]
    return quantiles, {"method": "split-conformal, scaled per window", "shape": method,
                       "windows": int(moving.sum()), "constant_windows_left_out": int((~moving).sum())}


# --- judging ------------------------------------------------------------------------------

def independent_windows(origins: np.ndarray, horizon: int) -> int:
    """How many of the windows of ``horizon`` steps starting at ``origins`` (one series) do not
    overlap, taken greedily from the first: the independent samples a coverage rests on
    (25 origins one step apart of a 24-step horizon are 2, not 25)."""
    count, free = 0, None
    for origin in np.sort(np.asarray(origins, np.int64)):
        if free is None or origin >= free:
            count, free = count + 1, int(origin) + int(horizon)
    return count


def judged(independent: int | None) -> bool:
    """Whether a sample of ``independent`` windows supports judging a coverage (None: not
    counted, a caller from before the count: judged as before)."""
    return independent is None or independent >= MIN_INDEPENDENT_WINDOWS


def not_judged_note(independent: int) -> str:
    return (f"not judged: {independent} independent holdout window(s), fewer than the "
            f"{MIN_INDEPENDENT_WINDOWS} a coverage needs to refuse anything")


def pinball(actual: np.ndarray, quantiles: np.ndarray, levels: tuple[float, ...]) -> np.ndarray:
    """Pinball (quantile) loss ``[..., Q]`` of ``quantiles [..., Q]`` against ``actual [...]``."""
    diff = np.asarray(actual, np.float64)[..., None] - np.asarray(quantiles, np.float64)
    tau = np.asarray(levels, np.float64)
    return np.maximum(tau * diff, (tau - 1.0) * diff)


def interval_score(actual: np.ndarray, low: np.ndarray, high: np.ndarray, alpha: float) -> np.ndarray:
    """The interval score (Gneiting and Raftery 2007) of the central ``1 - alpha`` interval:
    width plus ``2 / alpha`` times how far the actual falls outside; the M4's MSIS is its mean
    over the horizon divided by the in-sample seasonal-naive MAE."""
    actual, low, high = (np.asarray(a, np.float64) for a in (actual, low, high))
    return (high - low) + (2.0 / alpha) * (np.maximum(low - actual, 0.0) + np.maximum(actual - high, 0.0))


def interval_key(nominal: float) -> str:
    """How an interval is named in the figures: ``80`` for 0.8, ``97.5`` for 0.975 (distinct
    for every pair of levels a and 1 - a)."""
    return format(round(100 * nominal, 6), "g")


def interval_metrics(actual: np.ndarray, quantiles: np.ndarray, levels: tuple[float, ...],
                     scale: float | np.ndarray, block: int | None = None, seed: int = 0,
                     independent: int | None = None) -> dict:
    """The interval measures of ``quantiles [N, horizon, Q]`` against ``actual [N, horizon]``;
    ``scale`` (a number, or one per row) is the MASE scale.

    ``coverage_<p>``: the share of actuals inside the central p% interval; ``width_<p>``: its
    mean scaled width; ``msis_<p>``: its mean scaled interval score; ``pinball``: the mean
    scaled pinball loss over levels, steps and rows (a discrete estimate of half the CRPS when
    the levels spread over (0, 1)); ``crossing``: the share of (row, step) whose quantiles cross
    (0 by construction for onnxcast models; other sources are measured as they are).

    With ``block`` (rows are rolling origins whose windows overlap ``block`` neighbours), each
    coverage also gets ``coverage_<p>_ci95``: the moving-block bootstrap interval of the mean of
    the per-origin coverages (significance.block_bootstrap_interval), the sampling error the gate allows for,
    unless ``independent`` (the rows' non-overlapping windows, :func:`independent_windows`,
    recorded as ``independent_windows``) is below :data:`MIN_INDEPENDENT_WINDOWS`: a bootstrap of
    two blocks gave a 0.4-point interval, a certainty the sample does not have."""
    actual = np.asarray(actual, np.float64)
    q = np.asarray(quantiles, np.float64)
    scale = np.asarray(scale, np.float64)
    per_row = scale.reshape(-1, 1) if scale.ndim else scale
    out: dict = {} if independent is None else {"independent_windows": int(independent)}
    for lo, hi, nominal in central_intervals(levels):
        key = interval_key(nominal)
        low, high = q[..., lo], q[..., hi]
        inside = (actual >= low) & (actual <= high)
        out[f"coverage_{key}"] = float(np.mean(inside))
        if block is not None and judged(independent):
            out[f"coverage_{key}_ci95"] = block_bootstrap_interval(inside.mean(axis=1).astype(np.float64), block, seed=seed)
        out[f"width_{key}"] = float(np.mean((high - low) / per_row))
        out[f"msis_{key}"] = float(np.mean(interval_score(actual, low, high, 1.0 - nominal) / per_row))
    out["pinball"] = float(np.mean(pinball(actual, q, levels) / np.asarray(per_row)[..., None]))
    out["crossing"] = float(np.mean(np.any(np.diff(q, axis=-1) < 0, axis=-1))) if q.shape[-1] > 1 else 0.0
    return out


def row_interval_metrics(actual: np.ndarray, quantiles: np.ndarray, levels: tuple[float, ...],
                         scale: np.ndarray) -> dict[str, np.ndarray]:
    """Per row of ``[N, horizon]`` (a fleet's series): ``coverage_<p>`` and ``msis_<p>`` of each
    central interval and ``pinball``, each ``[N]``; the fleet's aggregates are their means."""
    actual = np.asarray(actual, np.float64)
    q = np.asarray(quantiles, np.float64)
    per_row = np.asarray(scale, np.float64).reshape(-1, 1)
    out: dict[str, np.ndarray] = {}
    for lo, hi, nominal in central_intervals(levels):
        key = interval_key(nominal)
        low, high = q[..., lo], q[..., hi]
        out[f"coverage_{key}"] = np.mean((actual >= low) & (actual <= high), axis=1)
        out[f"msis_{key}"] = np.mean(interval_score(actual, low, high, 1.0 - nominal) / per_row, axis=1)
    out["pinball"] = np.mean(pinball(actual, q, levels) / per_row[..., None], axis=(1, 2))
    return out


def coverage_keys(metrics: dict) -> list[str]:
    """The central intervals the figures hold (``"80"``, ``"95"``, ...): the ``coverage_<p>`` keys."""
    return [k.removeprefix("coverage_") for k in metrics
            if k.startswith("coverage_") and not k.endswith("_ci95")]


def coverage_failures(metrics: dict, tolerance: float, nominals: tuple[str, ...] | None = None) -> list[str]:
    """Gate phrases for each central interval (``nominals``, default every one the figures
    hold: 80% and 95% with the default levels) whose coverage misses nominal by more
    than ``tolerance`` AND by more than its sampling error: when the figures hold the coverage's
    95% interval (``coverage_<p>_ci95``: block bootstrap over origins, or bootstrap over series),
    a coverage whose interval holds nominal is not a miss. A single series has few independent
    holdout windows (100 overlapping origins of a 24-step horizon, stride 5, are about 20), so
    its coverage of a perfectly calibrated 80% interval wanders by 8 points and more; a fixed
    tolerance alone would fail it by chance. A fleet's interval over hundreds of series is
    narrow, and the tolerance decides. A coverage that is not a number fails.

    Nothing fails when the figures count fewer ``independent_windows`` than
    :data:`MIN_INDEPENDENT_WINDOWS` (the coverage is reported, not judged)."""
    if not judged(metrics.get("independent_windows")):
        return []
    failures = []
    for nominal in (coverage_keys(metrics) if nominals is None else [str(n) for n in nominals]):
        got = metrics.get(f"coverage_{nominal}")
        if got is None:
            continue
        target = float(nominal) / 100
        if abs(got - target) <= tolerance:
            continue
        ci = metrics.get(f"coverage_{nominal}_ci95")
        known = ci is not None and len(ci) == 2 and all(isinstance(v, int | float) and math.isfinite(v) for v in ci)
        if known and ci[0] <= target <= ci[1]:
            continue
        where = f" and outside its 95% interval [{ci[0]:.1%}, {ci[1]:.1%}]" if known else ""
        failures.append(f"{nominal}% interval covers {got:.1%} of holdout points, more than "
                        f"{tolerance:.1%} from nominal{where}")
    return failures


def quantiles_from_levels(lo: dict[int, np.ndarray], hi: dict[int, np.ndarray], mean: np.ndarray,
                          levels: tuple[float, ...]) -> np.ndarray | None:
    """A statsforecast model's intervals (``lo[80]``, ``hi[95]``... ``[N, horizon]``) as
    ``quantiles [N, horizon, Q]`` at ``levels``: the 0.5 level is the mean (statsforecast's
    intervals are symmetric about it), a level ``a < 0.5`` is ``lo[100 (1 - 2a)]``; None when
    some level has no interval."""
    columns = []
    for level in levels:
        if abs(level - 0.5) < 1e-9:
            columns.append(mean)
            continue
        width = round(100 * abs(1.0 - 2.0 * level), 6)
        width = int(width) if float(width).is_integer() else width
        source = lo if level < 0.5 else hi
        if width not in source:
            return None
        columns.append(source[width])
    return np.stack(columns, axis=-1)


def reference_levels(levels: tuple[float, ...]) -> list[int | float]:
    """The statsforecast ``level=`` list that gives every level of ``levels`` (0.5 aside)."""
    widths = sorted({round(100 * abs(1.0 - 2.0 * q), 6) for q in levels if abs(q - 0.5) > 1e-9})
    return [int(w) if float(w).is_integer() else w for w in widths]
