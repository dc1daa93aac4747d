"""A fleet judged per series and in aggregate.

- :func:`reference_shard` (one mapped task per shard): the baselines (naive, seasonal naive
  of every season, the series' best naive) on every series of the shard, and the statistical
  reference (statsforecast AutoETS / AutoTheta / MSTL as the frequency fits) on the shard's
  series that are in the reference sample, at end-aligned origins ->
  ``data/reference/shards/<k>.parquet``.
- :func:`evaluate_shard` (one mapped task per shard): every ONNX variant of every family on
  the shard's series, at the same origins -> ``models/<family>/shards/<k>.parquet``.
- :class:`AcrossSeries` (the validate task of each family, ``validate.validate_family_variants``):
  the merge of the family's shards (``models/<family>/per_series.parquet``), the aggregates
  (mean MASE, sMAPE, MAPE with intervals over series, the share of series lost to the best
  naive), the gates, paired tests across series -> ``validation.json``.
- :func:`fleet_baselines`: the merged reference (``data/reference/per_series.parquet``) and
  its aggregates, in the shape of ``data/baselines.json``.

Per-series tables (Parquet) have one row per series, column ``series`` (the id) first, then
``<forecaster>.<metric>`` for metric in mae, rmse, smape, mape, mase (averaged over the
series' origins and steps; MASE on the series' in-sample seasonal-naive scale).

Design: docs/design/fleet.md section 4.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxcast.base.contract import (
    METADATA_PREFIX,
    QUANTILE_METADATA,
    QUANTILES_NAME,
    parse_quantile_levels,
)
from onnxcast.base.errors import DataError
from onnxcast.base.files import json_safe, read_json, replacing
from onnxcast.base.untrusted import quote
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.data import utc_iso
from onnxcast.pipeline.evaluation import fleet_aggregate, holdout_origins, series_metrics
from onnxcast.pipeline.fleet_data import FleetData, fleet_steps, split_fleet
from onnxcast.pipeline.intervals import (
    independent_windows,
    interval_lag,
    judged,
    moving_windows,
    offsets_from_errors,
    quantiles_from_levels,
    reference_levels,
    row_interval_metrics,
    window_scale,
)
from onnxcast.pipeline.metrics import mase_scale
from onnxcast.pipeline.report import compare_families
from onnxcast.pipeline.seasons import evaluation_seasons
from onnxcast.pipeline.sessions import onnx_session
from onnxcast.pipeline.significance import bootstrap_interval, paired_across_series
from onnxcast.pipeline.validate import (
    figure_text,
    gate,
    interval_verdict,
    parity_shapes,
)

log = logging.getLogger(__name__)

METRICS = ("mae", "rmse", "smape", "mape", "mase")
BATCH = 1024  # histories per ORT call: one session per variant, the fleet in batches
LOSERS = 20  # worst series (by MASE ratio to their best naive) named per variant
REF_MASE = "ref_mase"  # a model's MASE on the reference's origins only (the last reference_max_origins)
BEST_NAIVE = "best_naive"  # each series' own best naive on its holdout: the bar of loses_share
FLEET_NAIVE = "fleet_naive"  # the naive method best over the whole fleet: the bar of the gates


# --- what every step agrees on: shards, origins, scales, the reference sample ---------------

def read_shards(cfg: PipelineConfig) -> list[list[str]]:
    """The series ids of every shard, from ``data/shards.json``
    (``{"n_shards": k, "shards": [[series id, ...], ...]}``; other keys are ignored)."""
    path = cfg.layout.shards
    try:
        doc = read_json(path)
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: cannot be read ({error})") from None
    shards = doc.get("shards") if isinstance(doc, dict) else None
    if not isinstance(shards, list) or doc.get("n_shards") != len(shards) or not shards:
        raise DataError(f"{path}: expected {{'n_shards': k, 'shards': [[series ids], ...]}} with k lists")
    for k, ids in enumerate(shards):
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise DataError(f"{path}: shard {k} is not a list of series ids (strings)")
    return shards


@dataclass(frozen=True)
class Plan:
    """The origins and scales of a fleet's evaluation, the same for every step and shard."""

    horizon: int
    holdout_steps: int
    back: np.ndarray  # steps back from each series' end of every origin, earliest first
    stride: int
    seasons: tuple[int, ...]  # every season of the frequency, and the fleet's
    season: int  # the fleet's season: the MASE scale's lag (Hyndman's "frequency")
    reference_origins: int  # the last this many origins are the reference's

    @property
    def origins(self) -> int:
        return len(self.back)


def plan_for(cfg: PipelineConfig, fleet: FleetData) -> Plan:
    holdout, _ = fleet_steps(cfg)
    seasons = evaluation_seasons(fleet.freq, fleet.season)
    back, stride = steps_back(holdout, cfg.horizon, seasons)
    return Plan(cfg.horizon, holdout, back, stride, seasons, fleet.season,
                min(len(back), cfg.reference_max_origins))


def steps_back(holdout_steps: int, horizon: int, seasons: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """(steps back from each series' end of every holdout origin, earliest first; the stride):
    ``evaluation.holdout_origins`` of a holdout of ``holdout_steps``, the same for every series
    whatever its length, since the origins are aligned at the series' end."""
    if holdout_steps < horizon:
        raise ValueError(f"a holdout of {holdout_steps} steps holds no forecast of {horizon} steps")
    origins = holdout_origins(holdout_steps, 0, horizon, seasons)
    return holdout_steps - origins.index, origins.stride


def mase_scales(fleet: FleetData, plan: Plan) -> np.ndarray:
    """Each series' MASE denominator: the in-sample MAE of the seasonal naive (lag = the
    fleet's season, 1 when the series is too short) on everything before its holdout, which
    with one holdout horizon is exactly M3's in-sample ``x`` (Hyndman and Koehler 2006)."""
    ends = fleet.lengths - plan.holdout_steps
    return np.array([mase_scale(np.asarray(fleet.target(i), np.float64)[: ends[i]], plan.season)
                     for i in range(fleet.n_series)], dtype=np.float64)


def reference_sample(ids, max_series: int, seed: int) -> set[str]:
    """The series of the statistical reference: all when ``max_series`` is 0 or not fewer than
    the series, else the ``max_series`` ids with the lowest seeded hash. A function of the ids
    alone, so every shard draws the same sample from the fleet's id list."""
    import hashlib

    ids = [str(i) for i in ids]
    if max_series == 0 or max_series >= len(ids):
        return set(ids)
    key = {i: hashlib.sha256(f"{seed}:{i}".encode()).digest() for i in ids}
    return set(sorted(ids, key=key.__getitem__)[:max_series])


def _fleet_ids(cfg: PipelineConfig, shard_fleet: FleetData) -> list[str]:
    """Every series id of the fleet (shards.json; the shard's own when it is the only one)."""
    if cfg.layout.shards.exists():
        return [sid for ids in read_shards(cfg) for sid in ids]
    return list(shard_fleet.ids)


def _load_shard(cfg: PipelineConfig, shard: int) -> FleetData:
    return FleetData.load(cfg.layout.shard(shard))


def _load_fleet(cfg: PipelineConfig) -> FleetData:
    """Every kept series: ``data/fleet/``, else the shards merged."""
    layout = cfg.layout
    if (layout.fleet / "fleet.json").exists():
        return FleetData.load(layout.fleet)
    return FleetData.concat([_load_shard(cfg, k) for k in range(len(read_shards(cfg)))])


def plan_actuals(fleet: FleetData, plan: Plan) -> np.ndarray:
    """``[series, origins, horizon]`` float64 actuals at every origin."""
    return _actuals_at(fleet, plan.back, plan.horizon)


def histories(fleet: FleetData, series: np.ndarray, ends: np.ndarray, steps: int) -> np.ndarray:
    """``[len(series), steps, F]`` float32 histories ending before position ``ends`` of each
    series, edge-padded with the series' first row where the series is shorter (as training
    pads; the ONNX contract has no mask)."""
    first = fleet.offsets[series]
    rows = (first + ends)[:, None] - steps + np.arange(steps)[None, :]
    rows = np.maximum(rows, first[:, None])
    return np.asarray(fleet.values[rows], np.float32)


def predict_fleet(run, fleet: FleetData, plan: Plan, lookback: int, batch: int = BATCH):
    """``run(history)`` at every origin of every series, in batches of ``batch`` histories:
    ``[series, origins, horizon]`` float64, or, when ``run`` returns several outputs (forecast
    and quantiles), a tuple of them, each ``[series, origins, *its trailing axes]``."""
    n, k = fleet.n_series, plan.origins
    series = np.repeat(np.arange(n), k)
    ends = (fleet.lengths[:, None] - plan.back[None, :]).reshape(-1)
    outs: list[np.ndarray] | None = None
    several = False
    for start in range(0, n * k, batch):
        part = slice(start, start + batch)
        got = run(histories(fleet, series[part], ends[part], lookback))
        several = isinstance(got, tuple | list)
        got = list(got) if several else [got]
        if outs is None:
            outs = [np.empty((n * k, *np.shape(g)[1:]), np.float64) for g in got]
        for out, g in zip(outs, got, strict=True):
            out[part] = g
    shaped = [out.reshape(n, k, *out.shape[1:]) for out in outs or [np.empty((0, plan.horizon))]]
    return tuple(shaped) if several else shaped[0]


def naive_forecasts(fleet: FleetData, plan: Plan, back: np.ndarray | None = None) -> dict[str, tuple[int, np.ndarray]]:
    """``{name: (season, forecasts [series, origins, horizon])}``: naive, and the seasonal
    naive of every season, at the origins ``back`` steps before each series' end (default: the
    evaluation's); NaN for a series whose history before its first origin is too short for
    that season (shorter than one season before its first origin)."""
    back = plan.back if back is None else np.asarray(back, np.int64)
    steps = np.arange(plan.horizon)
    origin = fleet.lengths[:, None] - back[None, :]  # [series, origins], relative
    out = {}
    for season in (1, *(s for s in plan.seasons if s > 1)):
        lags = season * (steps // season + 1)
        relative = origin[:, :, None] + steps[None, None, :] - lags[None, None, :]
        allowed = origin[:, 0] >= season  # every step's lag lies in the history: index >= origin - season
        rows = fleet.offsets[:-1, None, None] + np.maximum(relative, 0)
        forecast = np.asarray(fleet.values[rows, 0], np.float64)
        forecast[~allowed] = np.nan
        out["naive" if season == 1 else f"seasonal_naive_{season}"] = (season, forecast)
    return out


def _metric_columns(table: dict, name: str, actual: np.ndarray, forecast: np.ndarray, scale: np.ndarray) -> None:
    for metric, values in series_metrics(actual, forecast, scale).items():
        table[f"{name}.{metric}"] = values


def _write_table(table: dict, path: Path) -> Path:
    import pandas as pd

    with replacing(path) as tmp:
        pd.DataFrame(table).to_parquet(tmp, index=False)
    return path


# --- forecast intervals: per-series columns, the naives' intervals, aggregates and gates --------

def _interval_columns(table: dict, name: str, actual: np.ndarray, quantiles: np.ndarray,
                      levels: tuple[float, ...], scale: np.ndarray) -> None:
    """``<name>.coverage_80`` ... ``<name>.pinball`` per series (intervals.row_interval_metrics
    over the series' origins and steps, scaled by its MASE scale) from ``actual [series,
    origins, horizon]`` and ``quantiles [series, origins, horizon, Q]``; NaN for a series with
    a non-finite quantile (the forecaster did not run there)."""
    n = actual.shape[0]
    flat_actual = actual.reshape(n, -1)
    flat = np.asarray(quantiles, np.float64).reshape(n, -1, quantiles.shape[-1])
    ran = np.isfinite(flat).all(axis=(1, 2)) & np.isfinite(flat_actual).all(axis=1)
    safe = np.where(ran[:, None, None], flat, 0.0)
    for metric, values in row_interval_metrics(flat_actual, safe, levels, scale).items():
        table[f"{name}.{metric}"] = np.where(ran, values, np.nan)


def interval_names(columns, forecaster: str) -> list[str]:
    """The interval metrics a per-series table holds for ``forecaster`` (``coverage_<p>``,
    ``msis_<p>``, ``pinball``), in table order; empty for a model without quantiles."""
    prefix = f"{forecaster}."
    names = [c[len(prefix):] for c in columns if c.startswith(prefix)]
    return [n for n in names if n == "pinball" or n.startswith(("coverage_", "msis_"))]


def interval_aggregate(table, forecaster: str, levels, *, seed: int = 0,
                       windows_per_series: int | None = None) -> dict | None:
    """The fleet's interval figures of ``forecaster``: the mean over series of each per-series
    column (every series has the same origins and steps, so the mean coverage is the pooled
    coverage), a bootstrap interval over series of the mean MSIS of the 95% interval
    (``msis_95_ci95``), the series it ran on and the levels; None when the table has none.

    With ``windows_per_series`` (the non-overlapping holdout windows of one series,
    :func:`plan_windows`), ``independent_windows`` is the series it ran on times that, and each
    coverage gets its bootstrap interval (``coverage_<p>_ci95``, what the gate allows for) only
    where they reach intervals.MIN_INDEPENDENT_WINDOWS: the same rule as one series'."""
    names = interval_names(table.columns, forecaster)
    if not names:
        return None
    values = {n: table[f"{forecaster}.{n}"].to_numpy(np.float64) for n in names}
    ran = np.all([np.isfinite(v) for v in values.values()], axis=0)
    out: dict = {"series": int(ran.sum()), "levels": [float(q) for q in levels]}
    independent = None if windows_per_series is None else int(ran.sum()) * int(windows_per_series)
    if independent is not None:
        out["independent_windows"] = independent
    for name, column in values.items():
        out[name] = float(column[ran].mean()) if ran.any() else None
    if "msis_95" in values:
        out["msis_95_ci95"] = bootstrap_interval(values["msis_95"][ran], seed=seed)
    if judged(independent):
        for name in [n for n in values if n.startswith("coverage_")]:  # the gate's sampling error
            out[f"{name}_ci95"] = bootstrap_interval(values[name][ran], seed=seed)
    return out


def plan_windows(plan: Plan) -> int:
    """The non-overlapping holdout windows of one series under ``plan`` (its origins, ``back``
    steps from the end, and horizon): intervals.independent_windows."""
    return independent_windows(-np.asarray(plan.back, np.int64), plan.horizon)


def naive_quantiles(fleet: FleetData, plan: Plan, naive: dict, lookback: int, levels: tuple[float, ...],
                    shard: int | None = None) -> dict[str, np.ndarray]:
    """Split-conformal intervals for every naive method, calibrated as the models' are
    (intervals.calibrate): the method's errors at each series' validation window (the horizon
    just before the holdout), scaled by the window's interval scale (the mean absolute change
    over the fleet's season, models.interval_lag) over the ``lookback`` steps before its
    origin, give ``offsets [horizon, Q]``
    (intervals.offsets_from_errors); at every holdout origin ``quantiles = forecast + scale *
    offsets``. ``{name: [series, origins, horizon, Q]}``.

    Calibrated on the shard's own series (a shard task sees only its shard): a valid split
    either way, and with shards of fewer than intervals.MIN_WINDOWS_PER_STEP series the steps
    share one error shape, as for a model with few validation windows. Chosen over
    statsforecast's SeasonalNaive(level=...) (normal errors from in-sample residuals) so the
    bar the models are held to is calibrated exactly as they are."""
    val_back = np.array([plan.holdout_steps + plan.horizon], np.int64)
    at_validation = naive_forecasts(fleet, plan, val_back)
    target = _actuals_at(fleet, val_back, plan.horizon)[:, 0]
    val_scale = _window_scales(fleet, val_back, lookback)[:, 0]
    scales = _window_scales(fleet, plan.back, lookback)
    out = {}
    for name, (_, forecast) in naive.items():
        val_forecast = at_validation[name][1][:, 0]
        usable = np.isfinite(val_forecast).all(axis=1) & (val_scale > 0) & _moving(fleet, val_back[0], lookback)
        if not usable.any():
            log.warning("shard %s: no validation window to calibrate the %s intervals on", shard, name)
            continue
        errors = (target[usable] - val_forecast[usable]) / val_scale[usable, None]
        offsets, how = offsets_from_errors(errors, levels)
        out[name] = forecast[..., None] + scales[..., None, None] * offsets[None, None]
        log.info("shard %s: %s intervals calibrated on %d validation windows (%s)", shard, name, int(usable.sum()), how)
    return out


def _actuals_at(fleet: FleetData, back: np.ndarray, horizon: int) -> np.ndarray:
    """``[series, len(back), horizon]`` float64 actuals from origins ``back`` steps before each end."""
    origin = fleet.offsets[:-1, None] + fleet.lengths[:, None] - back[None, :]
    rows = np.maximum(origin[:, :, None] + np.arange(horizon)[None, None, :], fleet.offsets[:-1, None, None])
    return np.asarray(fleet.values[rows, 0], np.float64)


def _window_scales(fleet: FleetData, back: np.ndarray, lookback: int) -> np.ndarray:
    """``[series, len(back)]``: the models' interval scale (QuantileOutput.interval_scale) of the
    ``lookback`` steps (edge-padded) before each origin, in numpy."""
    n, k = fleet.n_series, len(back)
    series = np.repeat(np.arange(n), k)
    ends = (fleet.lengths[:, None] - back[None, :]).reshape(-1)
    window = histories(fleet, series, np.maximum(ends, 1), lookback)[:, :, 0].astype(np.float64)
    return window_scale(window, interval_lag(fleet.season, lookback)).reshape(n, k)


def _moving(fleet: FleetData, back: int, lookback: int) -> np.ndarray:
    """Series whose ``lookback`` steps before the origin ``back`` from the end moved at the scale's lag
    (intervals.calibrate leaves out windows that did not: their scaled error means nothing)."""
    ends = np.maximum(fleet.lengths - back, 1)
    window = histories(fleet, np.arange(fleet.n_series), ends, lookback)[:, :, 0].astype(np.float64)
    return moving_windows(window, interval_lag(fleet.season, lookback))


# --- the steps -------------------------------------------------------------------------------

def reference_models(freq: str, season: int, seasons: tuple[int, ...], min_history: int | None = None) -> list:
    """The statistical reference for the frequency: AutoETS and AutoTheta on the season (they
    drop the season themselves on a series too short for it), MSTL first when several seasons
    have two cycles in the shortest history (sub-daily data)."""
    from statsforecast.models import MSTL, AutoETS, AutoTheta

    del freq  # the seasons say it all; kept in the signature for the reader
    fits = [s for s in sorted(set(seasons)) if s > 1 and (min_history is None or 2 * s <= min_history)]
    primary = max(1, season)
    models = []
    if len(fits) > 1:
        models.append(MSTL(season_length=fits, trend_forecaster=AutoETS(model="ZZN")))
    return models + [AutoETS(season_length=primary), AutoTheta(season_length=primary)]


def reference_shard(cfg: PipelineConfig, shard: int) -> Path:
    """Baselines on every series of the shard; statsforecast on the shard's sampled series."""
    fleet = _load_shard(cfg, shard)
    plan = plan_for(cfg, fleet)
    scale = mase_scales(fleet, plan)
    actual = plan_actuals(fleet, plan)
    sample = reference_sample(_fleet_ids(cfg, fleet), cfg.reference_max_series, cfg.seed)
    table: dict = {"series": list(fleet.ids), "shard": np.full(fleet.n_series, shard, np.int16),
                   "rows": fleet.lengths.astype(np.int64), "origins": np.full(fleet.n_series, plan.origins)}
    naive = naive_forecasts(fleet, plan)
    for name, (_, forecast) in naive.items():
        _metric_columns(table, name, actual, forecast, scale)
    names = list(naive)
    mae = np.stack([table[f"{n}.mae"] for n in names], axis=1)
    best = np.argmin(np.where(np.isnan(mae), np.inf, mae), axis=1)  # naive always runs
    table[BEST_NAIVE] = [names[b] for b in best]
    for metric in METRICS:
        table[f"{BEST_NAIVE}.{metric}"] = np.stack([table[f"{n}.{metric}"] for n in names], axis=1)[
            np.arange(fleet.n_series), best]
    table["mase_scale"] = scale
    for name, quantiles in naive_quantiles(fleet, plan, naive, cfg.lookback, cfg.levels, shard).items():
        _interval_columns(table, name, actual, quantiles, cfg.levels, scale)
    in_sample = np.array([sid in sample for sid in fleet.ids], dtype=bool)
    table["in_reference_sample"] = in_sample
    if in_sample.any():
        k_ref = plan.reference_origins
        index = np.flatnonzero(in_sample)
        started = time.monotonic()
        forecasts = statsforecast_forecasts(fleet.subset(index), plan, cfg.threads, levels=cfg.levels)
        log.info("shard %d: statistical reference on %d series x %d origins in %.1fs", shard, len(index), k_ref,
                 time.monotonic() - started)
        for name, (forecast, quantiles) in forecasts.items():
            full = np.full((fleet.n_series, k_ref, plan.horizon), np.nan)
            full[index] = forecast
            _metric_columns(table, name, actual[:, -k_ref:], full, scale)
            if quantiles is not None:
                every = np.full((fleet.n_series, k_ref, plan.horizon, quantiles.shape[-1]), np.nan)
                every[index] = quantiles
                _interval_columns(table, name, actual[:, -k_ref:], every, cfg.levels, scale)
    path = _write_table(table, cfg.layout.reference_shard(shard))
    log.info("shard %d: baselines on %d series (%d origins, stride %d) -> %s", shard, fleet.n_series, plan.origins,
             plan.stride, path)
    return path


def statsforecast_forecasts(fleet: FleetData, plan: Plan, threads: int,
                            levels: tuple[float, ...] = ()) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """``{model alias: (forecast [series, reference origins, horizon], quantiles [..., Q] or
    None)}`` from statsforecast's cross_validation on integer ``ds`` (windows aligned at each
    series' end: its cutoff + 1 is our origin, checked), refitted at each origin on the whole
    history before it. With ``levels``, the models' own prediction intervals
    (``level=reference_levels(levels)``, columns ``<alias>-lo-95`` ...) as quantiles at
    ``levels`` (intervals.quantiles_from_levels: the median is the point forecast)."""
    import warnings

    import pandas as pd
    from statsforecast import StatsForecast
    from statsforecast.models import Naive, SeasonalNaive

    k_ref = plan.reference_origins
    lengths = fleet.lengths
    models = reference_models(fleet.freq, plan.season, plan.seasons,
                              min_history=int((lengths - plan.back[-k_ref]).min()))
    expected = fleet.n_series * k_ref * plan.horizon
    frame = pd.DataFrame({"unique_id": np.repeat(np.arange(fleet.n_series), lengths),
                          "ds": np.concatenate([np.arange(n) for n in lengths]),
                          "y": np.asarray(fleet.values[:, 0], np.float64)})
    shortest = int((lengths - plan.back[-k_ref]).min())
    fallback = SeasonalNaive(season_length=plan.season) if shortest >= plan.season else Naive()
    sf = StatsForecast(models=models, freq=1, n_jobs=threads, fallback_model=fallback)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        widths = reference_levels(levels) if levels else None
        cv = sf.cross_validation(h=plan.horizon, df=frame, n_windows=k_ref, step_size=plan.stride, level=widths)
    if len(cv) != expected:
        raise RuntimeError(f"statsforecast returned {len(cv)} forecasts, expected {expected}")
    series = cv["unique_id"].to_numpy(np.int64)
    origin = cv["cutoff"].to_numpy(np.int64) + 1
    back = lengths[series] - origin
    ascending = plan.back[-k_ref:][::-1]  # the reference's origins, latest first
    found = np.clip(np.searchsorted(ascending, back), 0, k_ref - 1)
    if np.any(ascending[found] != back):
        raise RuntimeError("statsforecast's cross-validation origins are not the evaluation's end-aligned origins")
    window = k_ref - 1 - found
    step = cv["ds"].to_numpy(np.int64) - origin
    def placed(column: str) -> np.ndarray:
        values = np.full((fleet.n_series, k_ref, plan.horizon), np.nan)
        values[series, window, step] = cv[column].to_numpy(np.float64)
        return values

    out = {}
    for model in models:
        alias = str(model)
        forecast, quantiles = placed(alias), None
        if widths and all(f"{alias}-{side}-{w}" in cv.columns for w in widths for side in ("lo", "hi")):
            quantiles = quantiles_from_levels({w: placed(f"{alias}-lo-{w}") for w in widths},
                                              {w: placed(f"{alias}-hi-{w}") for w in widths}, forecast, levels)
        out[alias] = (forecast, quantiles)
    return out


def evaluate_shard(cfg: PipelineConfig, shard: int, families: list[str] | None = None) -> list[Path]:
    """Every variant of every family on the shard's series at the evaluation's origins."""
    layout = cfg.layout
    fleet = _load_shard(cfg, shard)
    plan = plan_for(cfg, fleet)
    scale = mase_scales(fleet, plan)
    actual = plan_actuals(fleet, plan)
    written = []
    for family in families or cfg.models:
        lookback = int(read_json(layout.model_json(family))["spec"]["lookback"])
        first_origin = fleet.lengths - plan.back[0]
        table: dict = {"series": list(fleet.ids), "shard": np.full(fleet.n_series, shard, np.int16),
                       "rows": fleet.lengths.astype(np.int64),
                       "padded_steps": np.maximum(0, lookback - first_origin).astype(np.int64),
                       "origins": np.full(fleet.n_series, plan.origins), "mase_scale": scale}
        for spec in read_json(layout.variants(family)):
            name = spec["name"]
            started = time.monotonic()
            levels, quantiles = None, None
            try:
                session = onnx_session(layout.onnx_dir(family) / spec["path"], cfg.threads)
                levels = session_levels(session)
                outputs = ["forecast", "quantiles"] if levels else ["forecast"]
                got = predict_fleet(lambda x, s=session, o=outputs: tuple(s.run(o, {"history": x})), fleet, plan,
                                    lookback)
                forecast, quantiles = (got[0], got[1]) if levels else (got[0], None)
            except Exception as exc:  # noqa: BLE001 - ORT raises its own types; validate's runs_on_cpu gate says why
                log.warning("%s %s did not run on shard %d: %s", family, name, shard, str(exc).splitlines()[0][:200])
                forecast = np.full_like(actual, np.nan)
                if levels:
                    quantiles = np.full((*actual.shape, len(levels)), np.nan)
            _metric_columns(table, name, actual, forecast, scale)
            if levels:  # a model exported before forecast distributions has no quantiles: no such columns
                _interval_columns(table, name, actual, quantiles, levels, scale)
            k_ref = plan.reference_origins
            table[f"{name}.{REF_MASE}"] = (np.mean(np.abs(forecast[:, -k_ref:] - actual[:, -k_ref:]), axis=(1, 2))
                                           / scale)
            log.info("shard %d: %s %s on %d series x %d origins in %.2fs", shard, family, name, fleet.n_series,
                     plan.origins, time.monotonic() - started)
        written.append(_write_table(table, layout.family_shard(family, shard)))
    return written


def session_levels(session) -> tuple[float, ...] | None:
    """The quantile levels of an ONNX session with a ``quantiles`` output (its metadata
    ``onnxcast.quantile_levels``), None for a model without one."""
    if QUANTILES_NAME not in [o.name for o in session.get_outputs()]:
        return None
    key = METADATA_PREFIX + QUANTILE_METADATA
    return parse_quantile_levels(session.get_modelmeta().custom_metadata_map.get(key, ""), key)


class AcrossSeries:
    """A family judged across series (``judging.judging_for``), for
    ``validate.validate_family_variants``: the merge of the family's shards
    (``models/<family>/per_series.parquet``), the aggregates per variant (mean MASE, sMAPE, MAPE
    with intervals over series, the share of series lost to the best naive), the gates on mean
    MASE and paired tests across series. Parity and latency on histories sampled across series
    (``spec``: the family's ModelSpec, ``variants``: its variants.json)."""

    quantile_parity = False  # parity on the forecast only

    def __init__(self, cfg: PipelineConfig, family: str, spec, variants: list[dict]):
        self.cfg, self.lookback = cfg, spec.lookback
        self.table, self.reference = _per_series_table(cfg, family)
        self.fleet = _load_fleet(cfg)
        self.plan = plan_for(cfg, self.fleet)
        self.windows = plan_windows(self.plan)
        levels = spec.quantile_levels or cfg.levels
        self.aggregates = {v["name"]: _with_intervals(fleet_aggregate(self.table, v["name"], losers=LOSERS,
                                                                      seed=cfg.seed),
                                                      self.table, v["name"], levels, cfg.seed, self.windows)
                           for v in variants}

    def histories(self) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
        """Latency inputs (batch 1 and 64), then the parity histories (``parity_shapes``), from
        random series at random ends, one generator seeded with ``cfg.seed``."""
        rng = np.random.default_rng(self.cfg.seed)
        latency_inputs = {b: _sampled_histories(self.fleet, b, self.lookback, rng) for b in (1, 64)}
        return latency_inputs, [_sampled_histories(self.fleet, b, t, rng)
                                for b, t in parity_shapes(self.lookback, self.fleet.season)]

    def torch_holdout(self, references: dict) -> dict:
        """The eager model's ``holdout``: its aggregates over the whole fleet."""
        torch_table = _torch_table(references[False], self.fleet, self.plan, self.lookback, self.table)
        return {"holdout": _holdout(fleet_aggregate(torch_table, "torch"), torch_table, "torch", self.plan)}

    def variant_holdout(self, references: dict):
        """``holdout_of`` for ``validate.variant_entry``: the variant's aggregates over the
        per-series table (the shards evaluated it) and the ``finite_on_every_series`` gate."""
        del references
        table, plan, aggregates = self.table, self.plan, self.aggregates

        def holdout_of(entry: dict, session, levels, note: str) -> None:
            del session, levels, note
            aggregate = aggregates[entry["name"]]
            entry["holdout"] = _holdout(aggregate, table, entry["name"], plan)
            # a variant that forecast NaN or infinity on some series (fp16 overflows on large levels)
            # would be averaged over the others only: it is judged on every series or not at all
            failed = int(len(table) - aggregate["series"])
            entry["gates"]["finite_on_every_series"] = gate(failed == 0, failed, 0)

        return holdout_of

    def family_entry(self, family: str, entries: list[dict], torch_entry: dict, judge) -> dict:
        cfg, table, reference, aggregates = self.cfg, self.table, self.reference, self.aggregates
        baseline = _with_intervals(fleet_aggregate(table, FLEET_NAIVE, seed=cfg.seed), table, FLEET_NAIVE,
                                   cfg.levels, cfg.seed, self.windows)
        naive_name = str(reference[FLEET_NAIVE].iloc[0]).replace("_", " ")
        vs_best_naive, vs_reference = _fleet_tests(table, reference)
        # the interval gates (coverage, and msis/pinball within the budget of fp32's) are decided
        # there too, from each variant's holdout["intervals"]: the means over series
        failures = judge(baseline_mae=baseline["mase_mean"], baseline_name=f"the best naive in aggregate, {naive_name}",
                         baseline_test=vs_best_naive, metric="mean MASE")
        # a fleet's intervals that miss are shipped marked "uncalibrated", not recalibrated: that would
        # evaluate every series of every shard again (one series: run.recalibrate_family)
        verdict = interval_verdict(entries)
        fp32 = aggregates.get("fp32") or {}
        entry = {"family": family, "torch": torch_entry, "variants": entries,
                 "fp32_holdout_mae": fp32.get("mase_mean"), "fp32_holdout_mase": fp32.get("mase_mean"),
                 "fp32_vs": {BEST_NAIVE: vs_best_naive, **vs_reference}, "gates_passed": not failures,
                 "failures": failures, "intervals": verdict,
                 "fleet": {"metric": "mase", "series": int(len(table)), "origins": self.plan.origins,
                           "stride": self.plan.stride, "variants": aggregates, "best_naive": baseline,
                           "vs_best_naive": vs_best_naive, "vs_reference": vs_reference}}
        _log_variants(family, entries, aggregates, baseline)
        return json_safe(entry)


def _per_series_table(cfg: PipelineConfig, family: str):
    """``(table, reference)``: the family's merged per-series errors joined with the baselines
    and the reference of each series, the stored part written to ``per_series(family)``."""
    layout = cfg.layout
    own = _merged_family(cfg, family)
    reference = _reference_frame(cfg)
    missing = sorted(set(own["series"]) - set(reference["series"]))
    if missing:
        raise DataError(f"{layout.reference}: no baselines for {len(missing)} series of {family} (e.g. {quote(missing[0])})")
    wanted = ["series", BEST_NAIVE, *(f"{BEST_NAIVE}.{m}" for m in METRICS), *(f"{FLEET_NAIVE}.{m}" for m in METRICS),
              *(f"{n}.mase" for n in _reference_forecasters(reference)), "in_reference_sample",
              *(f"{FLEET_NAIVE}.{n}" for n in interval_names(reference.columns, FLEET_NAIVE))]
    table = own.merge(reference[wanted], on="series", how="left")
    if "fp32.mase" in table.columns:
        table["loses_to_best_naive"] = table["fp32.mase"] > table[f"{BEST_NAIVE}.mase"]
    stored = [*own.columns, BEST_NAIVE, f"{BEST_NAIVE}.mase", "in_reference_sample",
              *(["loses_to_best_naive"] if "loses_to_best_naive" in table.columns else [])]
    _write_table({c: table[c].to_numpy() for c in stored}, layout.per_series(family))
    return table, reference


def _log_variants(family: str, entries: list[dict], aggregates: dict, baseline: dict) -> None:
    for v in entries:
        share = aggregates[v["name"]].get("loses_share")
        log.info("%s %-8s mean MASE %s (best naive in aggregate %s) on %d series, worse than each series' own "
                 "best naive on %s of them: %s",
                 family, v["name"], figure_text((v.get("holdout") or {}).get("mase")), figure_text(baseline["mase_mean"]),
                 aggregates[v["name"]]["series"], "n/a" if share is None else f"{100 * share:.0f}%",
                 "eligible" if v["eligible"] else "; ".join(v["reasons"]))


def _with_intervals(aggregate: dict, table, forecaster: str, levels, seed: int,
                    windows_per_series: int | None = None) -> dict:
    """``aggregate`` with ``intervals`` (interval_aggregate) when the table has the columns."""
    found = interval_aggregate(table, forecaster, levels, seed=seed, windows_per_series=windows_per_series)
    return {**aggregate, "intervals": found} if found else aggregate


def _merged_family(cfg: PipelineConfig, family: str):
    """The family's per-series rows of every shard, sorted by series id."""
    import pandas as pd

    paths = [cfg.layout.family_shard(family, k) for k in range(len(read_shards(cfg)))]
    absent = [p for p in paths if not p.exists()]
    if absent:
        raise DataError(f"{absent[0]}: the per-series evaluation of shard {absent[0].stem} is missing "
                        "(run evaluate_shard for every shard first)")
    return pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True).sort_values(
        "series", kind="stable").reset_index(drop=True)


def _reference_frame(cfg: PipelineConfig):
    """Baselines and the statistical reference per series: the merged table when written,
    else every shard's file."""
    import pandas as pd

    layout = cfg.layout
    if layout.reference_table.exists():
        return with_fleet_naive(pd.read_parquet(layout.reference_table))
    return _reference_shards(cfg)


def _reference_shards(cfg: PipelineConfig):
    """Every shard's baselines and reference, merged and sorted by series id."""
    import pandas as pd

    layout = cfg.layout
    paths = [layout.reference_shard(k) for k in range(len(read_shards(cfg)))]
    absent = [p for p in paths if not p.exists()]
    if absent:
        raise DataError(f"{absent[0]}: the baselines of shard {absent[0].stem} are missing "
                        "(run reference_shard for every shard first)")
    merged = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True).sort_values(
        "series", kind="stable").reset_index(drop=True)
    return with_fleet_naive(merged)


def with_fleet_naive(reference):
    """``reference`` with the columns ``fleet_naive.<metric>``: the naive method with the lowest
    mean MASE over the whole fleet (naive, or a seasonal naive where a series' history allows
    it, else that series' naive), THE baseline of the gates.

    Not each series' own best naive (``best_naive``, chosen per series on its holdout): picking
    the better of two forecasts per series on the very period judged is look-ahead, and on one
    origin per series its minimum is far below any method's (M3 monthly sample: 0.97 against
    the seasonal naive's 1.15). ``best_naive`` stays as the per-series bar of ``loses_share``."""
    if f"{FLEET_NAIVE}.mase" in reference.columns:
        return reference
    names = [n for n in _naive_forecasters(reference) if n != FLEET_NAIVE]
    filled = {}
    for name in names:
        column = reference[f"{name}.mase"].to_numpy(np.float64)
        fallback = reference["naive.mase"].to_numpy(np.float64) if "naive.mase" in reference.columns else column
        filled[name] = np.where(np.isfinite(column), column, fallback)
    best = min(filled, key=lambda n: np.nanmean(filled[n]))
    reference = reference.copy()
    reference[FLEET_NAIVE] = best
    for metric in (*METRICS, *interval_names(reference.columns, best)):
        column = reference[f"{best}.{metric}"].to_numpy(np.float64)
        naive = f"naive.{metric}"
        fallback = reference[naive].to_numpy(np.float64) if naive in reference.columns else column
        reference[f"{FLEET_NAIVE}.{metric}"] = np.where(np.isfinite(column), column, fallback)
    return reference


def _naive_forecasters(reference) -> list[str]:
    return [c[: -len(".mase")] for c in reference.columns if c.endswith(".mase")
            and (c.startswith("naive.") or c.startswith("seasonal_naive_"))]


def _reference_forecasters(reference) -> list[str]:
    """The statsforecast models in a reference table (the forecasters that are not baselines)."""
    naive = set(_naive_forecasters(reference)) | {BEST_NAIVE, FLEET_NAIVE}
    return [c[: -len(".mase")] for c in reference.columns if c.endswith(".mase") and c[: -len(".mase")] not in naive]


def _sampled_histories(fleet: FleetData, batch: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """``batch`` real histories of ``steps`` rows from random series at random ends (before
    the holdout is not required: parity and latency do not judge accuracy), edge-padded."""
    series = rng.integers(0, fleet.n_series, size=batch)
    ends = 1 + (rng.random(batch) * fleet.lengths[series]).astype(np.int64)
    return histories(fleet, series, np.maximum(ends, 1), steps)


def _torch_table(run_torch, fleet: FleetData, plan: Plan, lookback: int, table):
    """PyTorch eager's per-series metrics on the whole fleet, for the torch entry."""
    import pandas as pd

    position = fleet.index_of()
    order = np.array([position[s] for s in table["series"]], dtype=np.int64)
    forecast = predict_fleet(run_torch, fleet, plan, lookback)[order]
    scale = table["mase_scale"].to_numpy(np.float64)
    columns: dict = {"series": table["series"].to_numpy(), f"{BEST_NAIVE}.mase": table[f"{BEST_NAIVE}.mase"]}
    _metric_columns(columns, "torch", plan_actuals(fleet, plan)[order], forecast, scale)
    columns["mase_scale"] = scale
    return pd.DataFrame(columns)


def _holdout(aggregate: dict, table, name: str, plan: Plan) -> dict | None:
    """A variant's ``holdout`` entry in fleet mode: ``mae`` and ``mase`` are the mean MASE
    over series (so the gates and the choice, which read ``mae``, judge on MASE), ``rmse`` the
    mean of per-series RMSE over each series' MASE scale, ``smape`` the mean sMAPE."""
    if aggregate["mase_mean"] is None:
        return None
    rmse = (table[f"{name}.rmse"] / table["mase_scale"]).to_numpy(np.float64)
    out = {"metric": "mean MASE over series", "mae": aggregate["mase_mean"],
           "rmse": float(np.nanmean(rmse)), "smape": aggregate["smape_mean"], "mase": aggregate["mase_mean"],
           "mape": aggregate["mape_mean"], "mae_ci95": aggregate["mase_ci95"], "origins": plan.origins,
           "series": aggregate["series"]}
    if aggregate.get("intervals"):  # means over series of the per-series interval columns
        out["intervals"] = aggregate["intervals"]
    return out


def _fleet_tests(table, reference) -> tuple[dict, dict]:
    """fp32 against the best naive (every series) and against each reference model (the
    sampled series, fp32 on the reference's origins only), paired across series."""
    def versus(a, b) -> dict:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        both = np.isfinite(a) & np.isfinite(b)
        ratio = float(a[both].mean() / b[both].mean()) if both.any() and b[both].mean() else None
        return {"mase_ratio": ratio, **paired_across_series(a, b)}

    if "fp32.mase" not in table.columns:
        return {}, {}
    vs_best = versus(table["fp32.mase"], table[f"{FLEET_NAIVE}.mase"])
    sampled = table["in_reference_sample"].fillna(False).to_numpy(bool)
    vs_reference = {name: {"on": "the reference sample, its origins", **versus(
        table[f"fp32.{REF_MASE}"][sampled], table[f"{name}.mase"][sampled])}
        for name in _reference_forecasters(reference) if f"{name}.mase" in table.columns}
    return vs_best, vs_reference


def fleet_baselines(cfg: PipelineConfig) -> dict:
    """The merged reference table (written to ``data/reference/per_series.parquet``) and its
    aggregates, in the shape of ``data/baselines.json`` where the report reads it: ``best``,
    ``seasonal_naive`` (THE baseline: each series' best naive; ``mae``/``rmse`` are means of
    per-series figures in each series' own unit, informational; ``mase`` is what the gates
    use), ``candidates``, ``origins``, ``reference`` (the best statsforecast model on the
    sample), plus ``fleet``: every aggregate with its interval and the sample's size."""
    layout = cfg.layout
    reference = _reference_shards(cfg)
    _write_table({c: reference[c].to_numpy() for c in reference.columns}, layout.reference_table)
    meta = FleetData.load(layout.fleet if (layout.fleet / "fleet.json").exists() else layout.shard(0), mmap=True)
    plan = plan_for(cfg, meta)
    candidates = {}
    for name in _naive_forecasters(reference):
        aggregate = _with_intervals(fleet_aggregate(reference, name, seed=cfg.seed), reference, name, cfg.levels,
                                    cfg.seed)
        if aggregate["series"]:
            candidates[name] = aggregate
    best = _with_intervals(fleet_aggregate(reference, FLEET_NAIVE, seed=cfg.seed), reference, FLEET_NAIVE,
                           cfg.levels, cfg.seed)
    own_best = fleet_aggregate(reference, BEST_NAIVE, seed=cfg.seed)
    counts = reference[BEST_NAIVE].value_counts()
    naive_name = str(reference[FLEET_NAIVE].iloc[0])
    season = 1 if naive_name == "naive" else int(naive_name.rsplit("_", 1)[1])
    models = _reference_forecasters(reference)
    sampled = reference["in_reference_sample"].to_numpy(bool)
    aggregates = {m: _with_intervals(fleet_aggregate(reference, m, seed=cfg.seed), reference, m, cfg.levels, cfg.seed)
                  for m in models}
    ran = {m: a for m, a in aggregates.items() if a["series"]}
    out = {"best": naive_name,
           "seasonal_naive": {"name": naive_name, **_legacy_metrics(best, reference, FLEET_NAIVE, cfg.seed),
                              "season": season, **({"intervals": best["intervals"]} if "intervals" in best else {})},
           "candidates": {n: {**_legacy_metrics(a, reference, n, cfg.seed),
                              "season": 1 if n == "naive" else int(n.rsplit("_", 1)[1])}
                          for n, a in candidates.items()},
           "origins": {"count": plan.origins, "stride": plan.stride, "block": 1,
                       "from_end": [int(b) for b in plan.back], "aligned": "at each series' end"},
           "reference": None,
           "fleet": {"metric": "mase", "series": int(len(reference)), "best_naive": {**best, "is": naive_name},
                     "per_series_best_naive": own_best,
                     "best_naive_is": {str(k): int(v) for k, v in counts.items()}, "candidates": candidates,
                     "reference": {"models": models, "sample_size": int(sampled.sum()),
                                   "sampled": bool(sampled.sum() < len(reference)), "n_series": int(len(reference)),
                                   "origins": plan.reference_origins, "aggregates": aggregates}}}
    if ran:
        name = min(ran, key=lambda m: ran[m]["mase_mean"])
        out["reference"] = {"model": name, **_legacy_metrics(ran[name], reference, name, cfg.seed),
                            "origins": plan.reference_origins, "series": ran[name]["series"],
                            "sample_size": int(sampled.sum()), "sampled": bool(sampled.sum() < len(reference))}
        if "intervals" in ran[name]:
            out["reference"]["intervals"] = ran[name]["intervals"]
    return json_safe(out)


def _legacy_metrics(aggregate: dict, table, name: str, seed: int) -> dict:
    """The single-series metric keys from a fleet aggregate: mae/rmse are means of per-series
    figures (unit-mixed, informational), smape and mase the means over series."""
    return {"mae": aggregate["mae_mean"], "rmse": aggregate["rmse_mean"], "smape": aggregate["smape_mean"],
            "mase": aggregate["mase_mean"], "mae_ci95": bootstrap_interval(table[f"{name}.mae"].to_numpy(), seed=seed),
            "mase_ci95": aggregate["mase_ci95"], "series": aggregate["series"]}


def fleet_report(cfg: PipelineConfig, models: list[dict]) -> dict:
    """What ``assemble_report`` needs in fleet mode: ``summary`` (dataset, split, quality; the
    data gate's ``data/dataset.json`` with any missing required key filled from the fleet),
    ``baselines`` (:func:`fleet_baselines`), ``family_choice`` (``compare_families`` on per-series
    fp32 MASE, aligned by series id) and the report's ``fleet`` object."""
    import pandas as pd

    layout = cfg.layout
    baselines = fleet_baselines(cfg)
    fleet = _load_fleet(cfg)
    summary = read_json(layout.dataset) if layout.dataset.exists() else {}
    filled = _fleet_summary(cfg, fleet)
    for key in ("dataset", "split"):
        summary[key] = {**filled[key], **(summary.get(key) or {})}
    summary.setdefault("quality", None)

    frames = {m["family"]: pd.read_parquet(layout.per_series(m["family"]), columns=["series", "fp32.mase"])
              for m in models if layout.per_series(m["family"]).exists()}
    ids = sorted(set().union(*(set(f["series"]) for f in frames.values()))) if frames else []
    per_series = {family: frame.set_index("series")["fp32.mase"].reindex(ids).to_numpy(np.float64)
                  for family, frame in frames.items()}
    family_choice = compare_families(models, 1, per_series=per_series)

    quality = (summary.get("quality") or {}).get("series") or {}
    padded = quality.get("padded")
    if padded is None and frames:
        padded = int(sum((pd.read_parquet(layout.per_series(f), columns=["padded_steps"])["padded_steps"] > 0).sum()
                         for f in list(frames)[:1]))
    reference = baselines["fleet"]["reference"]
    fleet_object = {
        "metric": "mase", "n_series": fleet.n_series, "excluded": quality.get("excluded"), "padded": padded,
        "shards": len(read_shards(cfg)) if layout.shards.exists() else 1,
        "origins": baselines["origins"],
        "reference": {k: reference[k] for k in ("models", "sample_size", "sampled", "origins", "aggregates")},
        "baselines": {BEST_NAIVE: baselines["fleet"]["best_naive"], "candidates": baselines["fleet"]["candidates"]},
        "families": {m["family"]: (m.get("fleet") or {}).get("variants", {}) for m in models},
        "tests": {m["family"]: {"vs_best_naive": (m.get("fleet") or {}).get("vs_best_naive"),
                                "vs_reference": (m.get("fleet") or {}).get("vs_reference"),
                                "vs_best_family": family_choice["tests"].get(m["family"])} for m in models},
    }
    baselines = {k: v for k, v in baselines.items() if k != "fleet"}  # the report's own ``fleet`` holds it
    return json_safe({"summary": summary, "baselines": baselines, "family_choice": family_choice,
                    "fleet": fleet_object})


def _fleet_summary(cfg: PipelineConfig, fleet: FleetData) -> dict:
    """``dataset`` and ``split`` with the single-series report's required keys: rows over
    every series, the earliest start and latest end, and the split's latest boundaries."""
    import pandas as pd

    split = split_fleet(fleet.lengths, cfg)
    # every series lies on the fleet's one grid: place each start on it once
    first = pd.Timestamp(int(fleet.starts.min()), unit="ns")
    head = pd.date_range(first, pd.Timestamp(int(fleet.starts.max()), unit="ns"), freq=fleet.freq)
    start_at = np.searchsorted(head.asi8, fleet.starts)
    grid = pd.date_range(first, periods=int((start_at + fleet.lengths).max()), freq=fleet.freq).asi8

    def latest(position: np.ndarray) -> str:  # the latest timestamp over series at a relative position
        return utc_iso(np.datetime64(int(grid[start_at + position].max()), "ns"))

    dataset = {"uri": cfg.data_uri, "sha256": fleet.sha256, "rows": int(len(fleet.values)),
               "start": utc_iso(np.datetime64(int(fleet.starts.min()), "ns")), "end": latest(fleet.lengths - 1),
               "freq": fleet.freq, "season": fleet.season, "target": cfg.target_column,
               "features": list(cfg.feature_columns), "series_column": cfg.series_column,
               "n_series": fleet.n_series}
    return {"dataset": dataset, "split": {
        "train_end": latest(split.train_end - 1), "validation_end": latest(split.validation_end - 1),
        "holdout_start": latest(split.validation_end), "holdout_end": latest(fleet.lengths - 1), **split.as_dict()}}
