"""Accuracy in production: the model a channel serves, judged on the data that arrived after
it was trained, beside the figures its holdout gave (docs/airflow.md#monitoring-and-retraining).
One monitor for any number of series: the data is read as the deployed version read it (one
series, or a long table of many), and how the result is judged is chosen by the sample
(``significance.judged_across_series``: the origins of one series, or across series).

- **Realised error.** The served ONNX file forecasts each series' new rows (after the model's
  ``onnxcast.trained_until``) at rolling origins laid out as the holdout's were
  (``evaluation.holdout_origins``: same stride rule, every phase of the season), with ONNX
  Runtime; the per-origin MAE over the series' in-sample scale is its realised MASE,
  comparable with its holdout MASE. One series: the report's ``baselines.mase_scale`` and the
  holdout's moving-block interval. Several: each series' own scale (``mase_scale`` of
  ``models/<family>/per_series.parquet``, else recomputed on the rows before its holdout), the
  fleet's figure the mean over the judged series beside the holdout's mean and its bootstrap
  interval over series (the report's ``fleet.families``). The report's best baseline (same
  rule, same season) is scored on the same origins, so a drop that every forecaster suffers
  (a harder period) shows as such.
- **Degraded** is a one-sided test, not one number against a threshold (:func:`degradation_test`).
  Over the origins of one series, by batch means: each sample cut into non-overlapping batches
  of two horizons' worth of origins, a t statistic on the batch means with the holdout's batch
  variance as the reference (the errors of neighbouring origins share their windows, the
  batch means do not); fewer than ``MIN_ORIGINS`` new origins or ``MIN_BATCHES`` new batches:
  not judged. Across series, Wilcoxon's signed-rank test that the per-series log ratio
  realised / holdout MASE is above 0 (the ratio makes a series of any scale count alike), the
  realised MASE taken over each series' latest new rows laid out as its holdout was (like with
  like: both average the same number of windows); fewer than ``MIN_SERIES`` compared series:
  not judged, and the series that got worse most are named. A non-finite forecast (NaN, inf)
  is always degraded ("non-finite forecasts").
- **Input drift** is a Great Expectations suite built from the training window's profile
  (onnxcast.pipeline.drift); over several series, pooled on each series' seasonal change.
- **Left out** (several series): a series the data gate excludes, one that was not in training,
  or one with fewer new steps than the horizon, counted with its reason.

Pure library: no Airflow, no MLflow (onnxcast.registry.monitoring logs the result).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxcast.base.batches import CHUNK_ROWS, run_in_chunks
from onnxcast.base.errors import ConfigError
from onnxcast.base.files import finite_or_none
from onnxcast.pipeline.config import PipelineConfig, data_source
from onnxcast.pipeline.data import parse_utc, utc_iso
from onnxcast.pipeline.drift import check_drift
from onnxcast.pipeline.evaluation import holdout_origins, per_origin_mae, series_metrics
from onnxcast.pipeline.fleet_data import FleetData, min_train_steps, split_fleet
from onnxcast.pipeline.fleet_eval import (
    histories,
    mase_scales,
    plan_actuals,
    plan_for,
    predict_fleet,
)
from onnxcast.pipeline.fleet_quality import check_in_process
from onnxcast.pipeline.judging import ACROSS_SERIES, report_judging
from onnxcast.pipeline.metrics import seasonal_naive
from onnxcast.pipeline.report import served_variant
from onnxcast.pipeline.seasons import evaluation_seasons, seasons_for_freq
from onnxcast.pipeline.sessions import open_model
from onnxcast.pipeline.significance import (
    ALPHA,
    MIN_PAIRED_ORIGINS,
    bootstrap_interval,
    judged_across_series,
)

log = logging.getLogger(__name__)

MIN_ORIGINS = MIN_PAIRED_ORIGINS  # fewer new origins: never called degraded (too little evidence)
BATCH_BLOCKS = 2  # a batch of the degradation test: this many blocks of origins (each a horizon's span)
MIN_BATCHES = 5  # fewer new (or holdout) batches: never called degraded
# fewer compared series: never called degraded. Below MIN_PAIRED_SERIES (20, the two-sided
# comparisons' bar): the one-sided signed-rank test is exact at 10 (smallest p 1/1024), and
# its size held at alpha on 100-series simulations (TestLikeSizedComparisonHoldsItsSize)
MIN_SERIES = 10
WORST = 10  # series named as the ones that got worse most
LEFT_OUT_NAMED = 50  # left-out series listed by id (all are counted)
ORT_BATCH = CHUNK_ROWS  # histories a call: cache-sized (onnxcast.base.batches)
BATCH = 1024  # histories of several series a call


@dataclass(frozen=True)
class MonitorInput:
    """What is monitored: the served ONNX file, the report of the run that made it, the
    channel it serves, and the data (None: the report's own dataset). A model over several
    series may come with its family's per-series holdout table (``models/<family>/per_series.parquet``,
    the run's ``per_series/<family>.parquet`` artifact); without one the monitor recomputes the
    holdout's per-series figures (:func:`holdout_per_series`)."""

    model_path: Path
    report: dict
    channel: str
    data_uri: str | None = None
    holdout_table: Path | None = None


@dataclass(frozen=True)
class Served:
    """The served model: its report entries, its ONNX Runtime session and metadata."""

    entry: dict
    variant: dict
    session: Any
    meta: dict
    trained_until: str


@dataclass
class Sample:
    """What one check judges, whatever the number of series: the result's figures of the data,
    the errors the test compares (per origin of one series, or per compared series), and the
    drift check and error over time."""

    series: int  # the series judged: the test is chosen by it (significance.judged_across_series)
    figures: dict
    realised: np.ndarray
    holdout: np.ndarray
    drift_check: dict
    per_origin_mase: list
    origin_times: list
    block: int = 1
    holdout_block: int | None = None
    non_finite: list[str] | None = None
    fleet: dict | None = field(default=None)


def monitor(item: MonitorInput, work_dir: str | Path, *, s3_settings: Any = None) -> dict:
    """Judge the served model on the data after its ``trained_until``; the monitor result.

    Data of a version judged across series (the report's ``judging``) is judged per
    series: the same keys, plus ``fleet``. Raises ConfigError when the report does not describe
    the served model (no such channel or variant) and the data gate's errors when the data
    cannot be read or checked.
    """
    started = time.monotonic()
    served = open_served(item)
    read = fleet_sample if report_judging(item.report) == ACROSS_SERIES else series_sample
    sample = read(item, served, Path(work_dir), s3_settings)
    test = degradation_test(sample.realised, sample.holdout, series=sample.series, block=sample.block,
                            holdout_block=sample.holdout_block, non_finite=sample.non_finite)
    result: dict[str, Any] = {"channel": item.channel, "family": served.entry["family"],
                              "variant": served.variant["name"], "trained_until": served.trained_until,
                              **sample.figures, "test": test, "p_value": test["p_value"], "degraded": test["degraded"]}
    if sample.fleet is not None:
        result["fleet"] = sample.fleet
    result.update(drift_check=sample.drift_check, drift=sample.drift_check["drifted"],
                  per_origin_mase=sample.per_origin_mase, origin_times=sample.origin_times,
                  seconds=round(time.monotonic() - started, 3))
    _log_result(result)
    return result


def open_served(item: MonitorInput) -> Served:
    """The report's entries of the served variant and the served file opened (one thread, no spinning)."""
    entry, variant = served_variant(item.report, item.channel)
    session, meta = open_model(item.model_path)
    trained_until = meta.get("onnxcast.trained_until") or item.report["dataset"].get("end")
    return Served(entry, variant, session, meta, trained_until)


def reasons(result: dict) -> list[str]:
    """Why a monitor result asks for retraining: one line per finding (empty: it does not)."""
    out = []
    test = result.get("test") or {}
    across = "min_series" in test  # the test across series (else over the origins of one series)
    if result.get("degraded") and across and test.get("non_finite"):
        named = ", ".join(test["non_finite"][:5])
        more = test.get("non_finite_series", len(test["non_finite"])) - min(5, len(test["non_finite"]))
        out.append(f"{result['channel']}: non-finite forecasts in {test.get('non_finite_series')} series "
                   f"({named}{f' and {more} more' if more > 0 else ''})")
    elif result.get("degraded") and across:
        fleet = result["fleet"]
        worst = ", ".join(w["series"] for w in fleet["worst"][:5])
        out.append(f"{result['channel']}: realised mean MASE {result['mase']:.4g} over {fleet['series']} series "
                   f"worse than their holdout's {fleet['holdout_mase_judged']:.4g} (paired one-sided "
                   f"p={result['p_value']:.3g}, {fleet['worse_share']:.0%} of series worse; worst: {worst})")
    elif result.get("degraded") and test.get("non_finite"):
        out.append(f"{result['channel']}: non-finite forecasts at {result['test']['non_finite']} of "
                   f"{result['origins']} origins")
    elif result.get("degraded"):
        out.append(f"{result['channel']}: realised MASE {result['mase']:.4g} over {result['origins']} origins "
                   f"worse than the holdout's {result['holdout_mase']:.4g} (one-sided p={result['p_value']:.3g})")
    for column in result.get("drift") or []:
        failed = [c["check"] for c in result["drift_check"]["checks"] if c["column"] == column and not c["passed"]]
        out.append(f"{result['channel']}: input drift in {column!r} ({', '.join(failed)})")
    return out


def _log_result(result: dict) -> None:
    fleet = result.get("fleet")
    if fleet:
        over = (f"mean MASE {_fmt(result['mase'])} over {fleet['series']} series (their holdout "
                f"{_fmt(fleet['holdout_mase_judged'])}; the fleet's")
        after, worst = f", {fleet['left_out']} left out", "; worst " + ", ".join(w["series"] for w in fleet["worst"][:3])
    else:
        over, after, worst = f"MASE {_fmt(result['mase'])} (holdout", f" over {result['origins']} origins", ""
    log.info("monitor %s %s/%s%s: realised %s %.4g, 95%% [%.4g, %.4g])%s, p=%s%s%s; drift: %s", result["channel"],
             result["family"], result["variant"], " (fleet)" if fleet else "", over, result["holdout_mase"],
             *result["holdout_ci"], after, _fmt(result["p_value"]), " DEGRADED" if result["degraded"] else "", worst,
             ", ".join(result["drift"]) or "none")


# --- one series: its origins -------------------------------------------------------------------

def series_sample(item: MonitorInput, served: Served, work_dir: Path, s3_settings: Any = None) -> Sample:
    """One series: the realised per-origin scaled errors at its new origins, the holdout's."""
    report = item.report
    series = read_series(report, item.data_uri, work_dir, s3_settings)
    timestamps = series.timestamps(0)
    horizon, lookback = int(report["config"]["horizon"]), int(report["config"]["lookback"])
    first = int(np.searchsorted(timestamps, parse_utc(served.trained_until), side="right"))
    origins = holdout_origins(len(series.values), first, horizon, seasons_for_freq(series.freq), earliest=lookback)
    holdout = holdout_figures(report, served.entry, served.variant)
    holdout_errors = np.asarray(holdout.pop("_holdout_errors"))
    figures = {"data_uri": series.source, "data_sha256": series.sha256,
               "from": utc_iso(timestamps[first]) if first < len(timestamps) else None,
               "to": utc_iso(timestamps[-1]), "new_rows": int(len(series.values) - first),
               "origins": int(len(origins.index)), "stride": origins.stride, "block": origins.block,
               "mase_scale": float(report["baselines"]["mase_scale"]), **holdout}
    realised, scored = realised_errors(served.session, series, origins.index, report)
    figures.update(scored)
    return Sample(series=1, figures=figures, realised=realised, holdout=holdout_errors, block=origins.block,
                  holdout_block=int((report["baselines"].get("origins") or {}).get("block") or origins.block),
                  drift_check=check_drift(list(series.columns), [(series.values, first, timestamps)],
                                          int(report["baselines"]["seasonal_naive"]["season"])),
                  per_origin_mase=[finite_or_none(v) for v in realised],
                  origin_times=[utc_iso(timestamps[o]) for o in origins.index])


def read_series(report: dict, data_uri: str | None, work_dir: Path, s3_settings: Any = None):
    """The whole series under the deployed version's settings (no ``trained_until``), through
    the same data gate as training (its reports under ``work_dir/quality``)."""
    cfg = _checked(report, data_uri, work_dir, s3_settings)
    return FleetData.load(cfg.layout.fleet)


def _checked(report: dict, data_uri: str | None, work_dir: Path, s3_settings: Any = None,
             judging: str | None = None) -> PipelineConfig:
    """The deployed version's settings without ``trained_until`` over ``work_dir``, once the
    data gate has checked the data under them (``judging``: as ``merge_fleet_checks``)."""
    values = {**report["config"], "trained_until": None, "out_dir": str(work_dir)}
    if data_uri:
        values["data_uri"] = data_source(data_uri)
    cfg = PipelineConfig.from_dict(values)
    check_in_process(cfg, s3_settings=s3_settings, judging=judging)
    return cfg


def realised_errors(session, series, origins: np.ndarray, report: dict) -> tuple[np.ndarray, dict]:
    """The model's per-origin MAE over the report's MASE scale at ``origins``, and the figures:
    realised MASE, and the report's best baseline (same rule, same season) on the same origins."""
    if not len(origins):
        return np.zeros(0), {"mase": None, "baseline": None, "baseline_mase": None, "holdout_baseline_mase": None}
    horizon, lookback = int(report["config"]["horizon"]), int(report["config"]["lookback"])
    baselines = report["baselines"]
    scale = float(baselines["mase_scale"])
    actual = np.stack([series.target(0)[o:o + horizon] for o in origins]).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        realised = per_origin_mae(actual, forecast_at(session, series.values, origins, lookback)) / scale
    naive = seasonal_naive(series.target(0).astype(np.float64), origins, horizon, int(baselines["seasonal_naive"]["season"]))
    return realised, {"mase": finite_or_none(realised.mean()),
                      "baseline": baselines["seasonal_naive"].get("name", baselines.get("best")),
                      "baseline_mase": float(per_origin_mae(actual, naive).mean() / scale),
                      "holdout_baseline_mase": float(baselines["seasonal_naive"]["mase"])}


def holdout_figures(report: dict, entry: dict, variant: dict) -> dict:
    """The holdout's MASE of the served variant and its 95% interval (the MAE's moving-block
    interval over the same scale), plus its per-origin scaled errors (``_holdout_errors``)."""
    scale = float(report["baselines"]["mase_scale"])
    holdout = variant.get("holdout") or {}
    errors = variant.get("per_origin_mae") or next(
        (v.get("per_origin_mae") for v in entry["variants"] if v.get("name") == "fp32"), None)
    if holdout.get("mase") is None or not errors:
        raise ConfigError(f"report: {entry['family']}/{variant['name']} has no holdout MASE and per-origin errors")
    low, high = (holdout.get("mae_ci95") or [math.nan, math.nan])[:2]
    return {"holdout_mase": float(holdout["mase"]), "holdout_ci": [float(low) / scale, float(high) / scale],
            "holdout_origins": len(errors), "_holdout_errors": [float(e) / scale for e in errors]}


def forecast_at(session, values: np.ndarray, origins: np.ndarray, lookback: int) -> np.ndarray:
    """The model's forecasts ``[origins, horizon]`` from the ``lookback`` rows before each origin."""
    out = []
    for start in range(0, len(origins), ORT_BATCH):
        chunk = origins[start:start + ORT_BATCH]
        histories_ = np.stack([values[o - lookback:o] for o in chunk]).astype(np.float32)
        out.append(session.run(["forecast"], {"history": histories_})[0])
    return np.concatenate(out).astype(np.float64)


# --- several series: each on its own scale -----------------------------------------------------

def fleet_sample(item: MonitorInput, served: Served, work_dir: Path, s3_settings: Any = None) -> Sample:
    """Several series: per judged series its realised MASE; the compared ones (their latest new
    rows laid out as their holdout) beside their holdout MASE, and the fleet block."""
    report = item.report
    cfg, fleet, left_out = read_fleet(report, item.data_uri, work_dir, s3_settings)
    horizon, lookback = int(cfg.horizon), int(served.meta.get("onnxcast.lookback") or cfg.lookback)
    first_new = np.array([int(np.searchsorted(fleet.timestamps(i), parse_utc(served.trained_until), side="right"))
                          for i in range(fleet.n_series)], dtype=np.int64)
    run = _runner(served.session)
    holdout, source = holdout_per_series(cfg, fleet, first_new, served.variant["name"], run, lookback,
                                         item.holdout_table)
    judged, origins = judged_series(fleet, holdout, first_new, horizon,
                                    evaluation_seasons(fleet.freq, int(fleet.season)), left_out)
    scales = np.array([holdout[fleet.ids[i]]["scale"] for i in judged])
    with np.errstate(invalid="ignore", over="ignore"):
        scored = realised_per_series(fleet, judged, origins, run, lookback, horizon, scales,
                                     _baseline_season(report, int(fleet.season)))
        # like with like: each series' latest new data laid out as its holdout was (the same
        # count of origins, same stride, aligned at its end), so that both MASEs average alike
        back = like_sized_back(cfg, fleet)
        like, latest = compared_mase(fleet, judged, first_new, back, run, lookback, horizon, scales)
    ids = [fleet.ids[i] for i in judged]
    before = np.array([holdout[s]["mase"] for s in ids], np.float64)
    non_finite = [ids[k] for k in np.flatnonzero(~np.isfinite(scored["mase"]))]
    block = _fleet_block([ids[k] for k in like], latest, before[like], left_out, source)
    block.update(judged=len(ids), compared=len(like), holdout_origins_per_series=int(len(back)))
    sample = Sample(series=len(ids), figures=_fleet_figures(report, served, fleet, judged, first_new, origins, scored),
                    realised=latest, holdout=before[like], non_finite=non_finite, fleet=block,
                    drift_check=check_drift(list(fleet.columns), [(fleet.series(i), int(first_new[i]), fleet.timestamps(i))
                                                                  for i in judged], int(fleet.season)),
                    per_origin_mase=scored["per_origin_mase"], origin_times=scored["origin_times"])
    if not judged_across_series(sample.series):  # at most one series judged: its origins (the
        # holdout of a model over several series records no per-origin errors: not judged, unless
        # a forecast is non-finite)
        sample.realised = np.array([math.nan if v is None else v for v in scored["per_origin_mase"]], np.float64)
        sample.holdout, sample.non_finite = np.zeros(0), None
    return sample


def read_fleet(report: dict, data_uri: str | None, work_dir: Path, s3_settings: Any = None):
    """(config, fleet, left out): every series of the long table under the deployed version's
    settings without ``trained_until``, through the fleet data gate (its files under
    ``work_dir/gate``); the series the gate excluded, with its reasons."""
    import pandas as pd

    # the deployed model was judged across series
    cfg = _checked(report, data_uri, work_dir / "gate", s3_settings, judging=ACROSS_SERIES)
    table = pd.read_parquet(cfg.layout.series_table)
    excluded = table[table["excluded_because"].notna()]
    left_out = [{"series": str(sid), "because": f"data_gate:{why}"}
                for sid, why in zip(excluded[cfg.series_column], excluded["excluded_because"], strict=True)]
    return cfg, FleetData.load(cfg.layout.fleet), left_out


def holdout_per_series(cfg, fleet, first_new: np.ndarray, variant: str, run, lookback: int,
                       table_path: str | Path | None) -> tuple[dict[str, dict], str]:
    """``{series id: {"mase", "scale"}}`` of the holdout, and where it came from: the family's
    per-series table (its ``<variant>.mase`` and ``mase_scale``), else recomputed on each series'
    rows up to ``trained_until`` as fleet_eval lays out the holdout (the same function as the
    pipeline's: the same numbers when the data up to ``trained_until`` is unchanged)."""
    if table_path is not None:
        import pandas as pd

        table = pd.read_parquet(table_path)
        column = f"{variant}.mase"
        missing = [c for c in ("series", column, "mase_scale") if c not in table.columns]
        if missing:
            raise ConfigError(f"{table_path}: no column {missing[0]!r} (a fleet family's per_series.parquet)")
        return ({str(s): {"mase": float(m), "scale": float(k)} for s, m, k in
                 zip(table["series"], table[column], table["mase_scale"], strict=True)}, str(table_path))

    split = split_fleet(first_new, cfg, judging=ACROSS_SERIES)
    seen = np.flatnonzero(split.train_end >= min_train_steps(cfg, fleet.season))
    if not len(seen):
        return {}, "recomputed"
    before = _truncated(fleet, seen, first_new[seen])
    plan = plan_for(cfg, before)
    scale = mase_scales(before, plan)
    forecast = predict_fleet(run, before, plan, lookback, BATCH)
    mase = series_metrics(plan_actuals(before, plan), forecast, scale)["mase"]
    return ({sid: {"mase": float(m), "scale": float(k)} for sid, m, k in zip(before.ids, mase, scale, strict=True)},
            "recomputed")


def judged_series(fleet, holdout: dict, first_new: np.ndarray, horizon: int, seasons: tuple[int, ...],
                  left_out: list[dict]) -> tuple[list[int], list[np.ndarray]]:
    """(the positions of the series judged, the origins of each): a series not in training, with
    fewer new steps than the horizon or no holdout error is added to ``left_out`` instead."""
    judged, origins = [], []
    for i, sid in enumerate(fleet.ids):
        new = int(fleet.lengths[i] - first_new[i])
        if sid not in holdout:
            left_out.append({"series": sid, "because": "not_in_training"})
        elif new < horizon:
            left_out.append({"series": sid, "because": "too_short",
                             "details": f"{new} new steps, fewer than the horizon {horizon}"})
        elif not holdout[sid]["mase"] > 0:
            left_out.append({"series": sid, "because": "no_holdout_error",
                             "details": f"holdout MASE {holdout[sid]['mase']}"})
        else:
            judged.append(i)
            origins.append(holdout_origins(int(fleet.lengths[i]), int(first_new[i]), horizon, seasons).index)
    return judged, origins


def _fleet_figures(report: dict, served: Served, fleet, judged: list[int], first_new: np.ndarray,
                   origins: list[np.ndarray], scored: dict) -> dict:
    """The result's figures of several series: their data, the holdout's mean and interval over
    series, the realised mean MASE with its bootstrap interval, the best baseline's."""
    realised = scored["mase"]
    naive = report["baselines"].get("seasonal_naive") or {}
    return {"data_uri": fleet.source, "data_sha256": fleet.sha256,
            "from": utc_iso(min(fleet.timestamps(i)[first_new[i]] for i in judged)) if judged else None,
            "to": utc_iso(max(fleet.end(i) for i in range(fleet.n_series))) if fleet.n_series else None,
            "new_rows": int(sum(int(fleet.lengths[i] - first_new[i]) for i in judged)),
            "origins": int(sum(len(o) for o in origins)),
            "stride": int(Counter(_stride(o) for o in origins).most_common(1)[0][0]) if origins else None,
            "block": 1, "mase_scale": None, **_holdout_aggregate(report, served.entry, served.variant),
            "mase": finite_or_none(realised.mean()) if len(realised) else None,
            "mase_ci": _interval(realised) if np.all(np.isfinite(realised)) else None,
            "baseline": naive.get("name") or report["baselines"].get("best"),
            "baseline_mase": finite_or_none(scored["baseline"].mean()) if len(realised) else None,
            "holdout_baseline_mase": None if naive.get("mase") is None else float(naive["mase"])}


def _truncated(fleet, index: np.ndarray, ends: np.ndarray):
    """The series at ``index``, each cut to its first ``ends`` rows."""
    parts = [fleet.values[fleet.offsets[i]: fleet.offsets[i] + e] for i, e in zip(index, ends, strict=True)]
    offsets = np.zeros(len(index) + 1, np.int64)
    np.cumsum(ends, out=offsets[1:])
    return FleetData(values=np.ascontiguousarray(np.concatenate(parts), np.float32), offsets=offsets,
                     starts=fleet.starts[index].copy(), ids=tuple(fleet.ids[i] for i in index),
                     columns=fleet.columns, freq=fleet.freq, season=fleet.season, source=fleet.source,
                     sha256=fleet.sha256)


# --- the realised error ------------------------------------------------------------------------

def realised_per_series(fleet, index: list[int], origins: list[np.ndarray], run, lookback: int, horizon: int,
                        scales: np.ndarray, baseline_season: int, *, times: bool = True) -> dict:
    """Per judged series: the realised MASE (mean over its origins of the MAE over its scale)
    and the seasonal naive's on the same origins; per origin time, the mean scaled MAE over the
    series with an origin then (the fleet's error over time)."""
    if not index:
        return {"mase": np.zeros(0), "baseline": np.zeros(0), "origin_times": [], "per_origin_mase": []}
    series = np.concatenate([np.full(len(o), i, np.int64) for i, o in zip(index, origins, strict=True)])
    at = np.concatenate(origins).astype(np.int64)
    owner = np.concatenate([np.full(len(o), k, np.int64) for k, o in enumerate(origins)])
    forecast = np.empty((len(at), horizon), np.float64)
    for start in range(0, len(at), BATCH):
        part = slice(start, start + BATCH)
        forecast[part] = run(histories(fleet, series[part], at[part], lookback))
    steps = np.arange(horizon)
    rows = fleet.offsets[series][:, None] + at[:, None] + steps[None, :]
    actual = np.asarray(fleet.values[rows, 0], np.float64)
    lag = baseline_season * (steps // baseline_season + 1)
    naive_rows = fleet.offsets[series][:, None] + np.maximum(at[:, None] + steps[None, :] - lag[None, :], 0)
    naive = np.asarray(fleet.values[naive_rows, 0], np.float64)
    scale = scales[owner]
    error = np.abs(forecast - actual).mean(axis=1) / scale
    naive_error = np.abs(naive - actual).mean(axis=1) / scale
    counts = np.bincount(owner, minlength=len(index))
    mase = np.bincount(owner, weights=error, minlength=len(index)) / counts
    baseline = np.bincount(owner, weights=naive_error, minlength=len(index)) / counts
    if not times:
        return {"mase": mase, "baseline": baseline}
    calendars = {i: fleet.timestamps(i).astype("datetime64[s]").astype(np.int64) for i in index}
    stamps = np.concatenate([calendars[i][o] for i, o in zip(index, origins, strict=True)])
    times, where = np.unique(stamps, return_inverse=True)
    per_time = np.bincount(where, weights=error) / np.bincount(where)

    return {"mase": mase, "baseline": baseline, "per_origin_mase": [finite_or_none(v) for v in per_time],
            "origin_times": [utc_iso(np.datetime64(int(t), "s")) for t in times]}


def _runner(session):
    def run(histories: np.ndarray) -> np.ndarray:
        return run_in_chunks(session, ["forecast"], np.asarray(histories, np.float32))[0]

    return run


def _stride(origins: np.ndarray) -> int:
    return int(origins[1] - origins[0]) if len(origins) > 1 else 1


def _baseline_season(report: dict, season: int) -> int:
    named = (report["baselines"].get("seasonal_naive") or {}).get("season")
    return int(named) if named else season


def like_sized_back(cfg, fleet) -> np.ndarray:
    """Steps back from a series' end of its holdout origins as training laid them out
    (onnxcast.pipeline.fleet_eval.plan_for): the realised MASE the test compares is taken at
    the same count of origins from each series' latest rows."""
    return np.asarray(plan_for(cfg, fleet).back, np.int64)


def compared_mase(fleet, index: list[int], first_new: np.ndarray, back: np.ndarray, run, lookback: int,
                  horizon: int, scales: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The realised MASE the paired test compares: per series of ``index`` whose new rows
    (from ``first_new``) hold the holdout's layout (origins ``back`` steps before its end),
    its MASE at those origins. (positions into ``index`` of the compared series, their MASE)."""
    like = [k for k, i in enumerate(index) if int(fleet.lengths[i]) - int(back[0]) >= int(first_new[i])]
    mase = realised_per_series(fleet, [index[k] for k in like], [int(fleet.lengths[index[k]]) - back for k in like],
                               run, lookback, horizon, np.asarray(scales)[like], 1, times=False)["mase"]
    return like, mase


def _fleet_block(ids: list[str], realised: np.ndarray, holdout: np.ndarray, left_out: list[dict],
                 source: str) -> dict:
    ratio = realised / holdout if len(ids) else np.zeros(0)
    order = np.argsort(-ratio, kind="stable")[:WORST]
    return {"series": len(ids), "holdout_source": source,
            "holdout_mase_judged": float(holdout.mean()) if len(ids) else None,
            "left_out": len(left_out),
            "left_out_because": dict(sorted(Counter(e["because"] for e in left_out).items())),
            "left_out_series": left_out[:LEFT_OUT_NAMED],
            "worst": [{"series": ids[k], "mase": float(realised[k]), "holdout_mase": float(holdout[k]),
                       "ratio": float(ratio[k])} for k in order],
            "worse_share": float((ratio > 1).mean()) if len(ids) else None}


def _holdout_aggregate(report: dict, entry: dict, variant: dict) -> dict:
    """The holdout's mean MASE over series of the served variant and its bootstrap interval."""
    fleet = (report.get("fleet") or {}).get("families", {}).get(entry["family"], {}).get(variant["name"])
    fleet = fleet or (variant.get("fleet") or {})
    if fleet.get("mase_mean") is None:
        holdout = variant.get("holdout") or {}
        if holdout.get("mase") is None:
            raise ConfigError(f"report: {entry['family']}/{variant['name']} has no fleet holdout MASE")
        fleet = {"mase_mean": holdout["mase"], "mase_ci95": [math.nan, math.nan], "series": None}
    low, high = (fleet.get("mase_ci95") or [math.nan, math.nan])[:2]
    return {"holdout_mase": float(fleet["mase_mean"]), "holdout_ci": [float(low), float(high)],
            "holdout_origins": fleet.get("series")}


def _interval(values: np.ndarray) -> list[float] | None:
    return bootstrap_interval(values) if len(values) >= 2 else None




# --- the verdict --------------------------------------------------------------------------------

def degradation_test(realised: np.ndarray, holdout: np.ndarray, *, series: int = 1, block: int = 1,
                     holdout_block: int | None = None, alpha: float = ALPHA,
                     non_finite: list[str] | None = None) -> dict:
    """One-sided test that the realised errors are larger than the holdout's, the test chosen
    by the sample (``significance.judged_across_series(series)``, ``series`` the series judged):

    - over the origins of one series (``realised``, ``holdout``: per-origin scaled errors, of
      horizons spanning ``block`` / ``holdout_block`` origins), by batch means
      (:func:`_over_origins`);
    - across series (``realised``, ``holdout``: the paired per-series MASEs over like-sized
      windows; ``non_finite``: the ids of series with a non-finite forecast), by Wilcoxon's
      signed-rank test on the log ratios (:func:`_across_series`).

    Degraded when p < ``alpha`` with at least the test's minimum of evidence, and whenever a
    forecast was non-finite (the note "non-finite forecasts")."""
    if judged_across_series(series):
        return _across_series(realised, holdout, alpha, non_finite)
    return _over_origins(realised, holdout, block, holdout_block, alpha)


def _over_origins(realised: np.ndarray, holdout: np.ndarray, block: int, holdout_block: int | None,
                  alpha: float) -> dict:
    """Batch means: each sample cut into non-overlapping batches of ``BATCH_BLOCKS * block``
    consecutive origins (``holdout_block`` for the holdout's; the latest origins kept when they
    do not divide), each averaged over its origins whose windows end inside it (no two batch
    means share a forecast window), and a one-sided t statistic on the batch means whose
    variance is the holdout's batch variance (the null: the same process as on the holdout),
    with the holdout's batches less one degrees of freedom. The Newey-West Welch test on
    per-origin errors it replaced called a healthy model degraded 11-20% of the time at alpha
    0.05. Judged with at least ``MIN_ORIGINS`` new origins and ``MIN_BATCHES`` new batches (and
    as many holdout batches: the holdout's batch variance is the reference); any non-finite
    realised error is degraded whatever the count."""
    from scipy import stats

    realised, holdout = np.asarray(realised, np.float64), np.asarray(holdout, np.float64)
    block_r, block_h = max(1, int(block)), max(1, int(holdout_block or block))
    size_r, size_h = BATCH_BLOCKS * block_r, BATCH_BLOCKS * block_h
    result = {"test": "t on batch means, one-sided, the holdout's batch variance", "alpha": alpha, "min_origins": MIN_ORIGINS,
              "min_batches": MIN_BATCHES, "origins": int(len(realised)), "holdout_origins": int(len(holdout)),
              "batch": size_r, "holdout_batch": size_h, "batches": int(len(realised) // size_r),
              "holdout_batches": int(len(holdout) // size_h), "statistic": None, "p_value": None,
              "ratio": None, "degraded": False}
    bad = int(np.count_nonzero(~np.isfinite(realised)))
    if bad:
        result.update(degraded=True, non_finite=bad, note=f"non-finite forecasts: {bad} of {len(realised)} origins")
        return result
    if len(realised) < MIN_ORIGINS or result["batches"] < MIN_BATCHES:
        result["note"] = (f"{len(realised)} new origins ({result['batches']} batches of {size_r}), fewer than "
                          f"{MIN_ORIGINS} origins or {MIN_BATCHES} batches: not judged")
        return result
    if result["holdout_batches"] < MIN_BATCHES or not np.all(np.isfinite(holdout)):
        result["note"] = (f"the holdout's {len(holdout)} origins make {result['holdout_batches']} batches of "
                          f"{size_h} (or hold a non-finite error): not judged")
        return result
    means_r, means_h = _batch_means(realised, size_r, block_r), _batch_means(holdout, size_h, block_h)
    # the null is "the same process as on the holdout": the holdout's batch-to-batch variance
    # is the reference for both means (Student's t, the holdout's batches less one degrees of
    # freedom). The realised batches' own spread is not used: a change within the new data (a
    # shift from some date on) spreads them and would hide the very change it is
    diff = float(means_r.mean() - means_h.mean())
    result["ratio"] = float(realised.mean() / holdout.mean()) if holdout.mean() > 0 else None
    spread = math.sqrt(float(means_h.var(ddof=1)) * (1.0 / len(means_r) + 1.0 / len(means_h)))
    if spread == 0:
        result.update(statistic=0.0 if diff == 0 else math.copysign(math.inf, diff), p_value=0.0 if diff > 0 else 1.0)
    else:
        dof = float(len(means_h) - 1)
        result.update(statistic=float(diff / spread), p_value=float(stats.t.sf(diff / spread, df=dof)), dof=dof)
    result["degraded"] = bool(result["p_value"] < alpha)
    return result


def _batch_means(x: np.ndarray, size: int, block: int) -> np.ndarray:
    """Means of the non-overlapping batches of ``size`` consecutive origins (the latest kept),
    each over its first ``size - block + 1`` origins: their windows end before the next
    batch's start, so no two batch means share a forecast window."""
    count = len(x) // size
    return x[len(x) - count * size:].reshape(count, size)[:, :size - block + 1].mean(axis=1)


def _across_series(realised: np.ndarray, holdout: np.ndarray, alpha: float, non_finite: list[str] | None) -> dict:
    """Wilcoxon's one-sided signed-rank test across series that the log ratio realised /
    holdout MASE is above 0 (the series got worse). Both MASEs of a series must average the
    same number of like windows (the realised one over the latest windows laid out as the
    holdout's): under no change the log ratio is then symmetric about 0, which it is not when
    one averages more windows than the other (the less variable mean has the larger expected
    log). Judged with at least ``MIN_SERIES`` series; a series with a non-finite forecast
    (``non_finite``: their ids) is always degraded."""
    from scipy import stats

    realised, holdout = np.asarray(realised, np.float64), np.asarray(holdout, np.float64)
    result: dict[str, Any] = {"test": "Wilcoxon signed-rank, one-sided, per-series log(realised / holdout MASE) "
                                      "over like-sized windows",
                              "alpha": alpha, "min_series": MIN_SERIES, "series": int(len(realised)),
                              "statistic": None, "p_value": None, "ratio": None, "median_ratio": None,
                              "worse_share": None, "degraded": False}
    bad = list(non_finite or [])
    finite = np.isfinite(realised) & np.isfinite(holdout)
    if not np.all(finite):
        bad += [f"#{k}" for k in np.flatnonzero(~finite)] if non_finite is None else []
        realised, holdout = realised[finite], holdout[finite]
    if bad:
        named = ", ".join(bad[:WORST]) + (f" and {len(bad) - WORST} more" if len(bad) > WORST else "")
        result.update(degraded=True, non_finite=bad[:LEFT_OUT_NAMED], non_finite_series=len(bad),
                      note=f"non-finite forecasts in {len(bad)} series: {named}")
        return result
    if len(realised) < MIN_SERIES:
        result["note"] = f"{len(realised)} series judged, fewer than {MIN_SERIES}: not judged"
        return result
    log_ratio = np.log(np.maximum(realised, 1e-12) / holdout)
    result.update(ratio=float(realised.mean() / holdout.mean()), median_ratio=float(np.exp(np.median(log_ratio))),
                  worse_share=float((log_ratio > 0).mean()))
    if np.all(log_ratio == 0):
        result.update(statistic=0.0, p_value=1.0)
    else:
        test = stats.wilcoxon(log_ratio, alternative="greater", zero_method="wilcox")
        result.update(statistic=float(test.statistic), p_value=float(test.pvalue))
    result["degraded"] = bool(result["p_value"] < alpha)
    return result


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"


__all__ = ["ALPHA", "BATCH_BLOCKS", "MIN_BATCHES", "MIN_ORIGINS", "MIN_SERIES", "MonitorInput", "compared_mase",
           "degradation_test", "holdout_figures", "holdout_per_series", "like_sized_back", "monitor", "read_fleet",
           "realised_per_series", "reasons"]
