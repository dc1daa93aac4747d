"""Accuracy in production of a fleet model (one global model over many series): the served
ONNX file judged per series on each series' rows after the model's ``trained_until``, beside
the holdout's per-series figures (docs/airflow.md#monitoring-and-retraining).

- **Data.** The whole long table through the same fleet data gate as training
  (onnxcast.pipeline.fleet_quality, no ``trained_until``); a series the gate excludes, one
  that was not in training, or one with fewer new steps than the horizon is left out, counted
  with its reason.
- **Realised error.** Each series is forecast at rolling origins over its new rows (the
  holdout's stride rule, :func:`onnxcast.pipeline.evaluation.holdout_origins`), the series'
  histories in batches (batch = series x origins) through ONNX Runtime; the realised MASE of a
  series is its MAE over the series' own in-sample seasonal-naive scale, the same scale as
  its holdout figure (``mase_scale`` of ``models/<family>/per_series.parquet``, or recomputed
  on the rows before its holdout). The fleet's realised MASE is the mean over the judged
  series, beside the holdout's mean and its bootstrap interval over series (the report's
  ``fleet.families``).
- **Degraded** is a paired one-sided test across series: Wilcoxon's signed-rank test that
  the per-series log ratio realised / holdout MASE is above 0 (series are the independent
  units; the ratio makes a series of any scale count alike). Like with like: the realised
  MASE the test takes is each series' latest new rows laid out as its holdout was (the same
  origins counted back from its end), so both average the same number of windows; a series
  with fewer new steps than its holdout's is judged (its realised MASE over all its new
  origins is reported) but not compared. Fewer than ``MIN_SERIES`` compared series: never
  degraded; a non-finite forecast in any series: always ("non-finite forecasts", the series
  named). The series that got worse most are named.
- **Input drift**: the one-series suite (onnxcast.pipeline.drift.drift_suite) on the
  seasonal change of every column pooled over series, each series' change divided by its
  training's mean absolute seasonal change (so a series of any scale counts alike), rows in
  time order.

The per-series holdout figures: the family's per-series table when given
(``MonitorInput.holdout_table``), else recomputed here with the served file on each series'
holdout as training laid it out (the last ``horizon * min_holdout_windows`` steps before
``trained_until``): the same function as the pipeline's (fleet_eval), the same numbers when
the data up to ``trained_until`` is unchanged.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from onnxcast.base.batches import run_in_chunks
from onnxcast.base.errors import ConfigError
from onnxcast.base.files import finite_or_none
from onnxcast.pipeline.config import PipelineConfig, data_source
from onnxcast.pipeline.data import parse_utc, utc_iso
from onnxcast.pipeline.drift import pooled_drift
from onnxcast.pipeline.evaluation import holdout_origins, series_metrics
from onnxcast.pipeline.fleet_data import FleetData, min_train_steps, split_fleet
from onnxcast.pipeline.fleet_eval import (
    histories,
    mase_scales,
    plan_actuals,
    plan_for,
    predict_fleet,
)
from onnxcast.pipeline.fleet_quality import check_fleet_shard, check_fleet_table, merge_fleet_checks
from onnxcast.pipeline.report import served_variant
from onnxcast.pipeline.seasons import evaluation_seasons
from onnxcast.pipeline.sessions import open_model
from onnxcast.pipeline.significance import ALPHA, bootstrap_interval

log = logging.getLogger(__name__)

MIN_SERIES = 10  # fewer judged series: never called degraded
WORST = 10  # series named as the ones that got worse most
LEFT_OUT_NAMED = 50  # left-out series listed by id (all are counted)
BATCH = 1024


def monitor_fleet(item, work_dir: str | Path, *, s3_settings: Any = None) -> dict:
    """The monitor result of a fleet model (the one-series keys, plus ``fleet``)."""
    started = time.monotonic()
    report = item.report
    entry, variant = served_variant(report, item.channel)
    session, meta = open_model(item.model_path)
    trained_until = meta.get("onnxcast.trained_until") or report["dataset"].get("end")
    work = Path(work_dir)
    cfg, fleet, gate_left_out = read_fleet(report, item.data_uri, work, s3_settings)
    horizon = int(cfg.horizon)
    lookback = int(meta.get("onnxcast.lookback") or cfg.lookback)
    season = int(fleet.season)
    seasons = evaluation_seasons(fleet.freq, season)
    cut = parse_utc(trained_until)
    first_new = np.array([int(np.searchsorted(fleet.timestamps(i), cut, side="right")) for i in range(fleet.n_series)],
                         dtype=np.int64)
    run = _runner(session)
    holdout, source = holdout_per_series(cfg, fleet, first_new, variant["name"], run, lookback,
                                         item.holdout_table)

    left_out: list[dict] = list(gate_left_out)
    judged_index, origin_lists = [], []
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
            origins = _origins(int(fleet.lengths[i]), int(first_new[i]), horizon, seasons)
            judged_index.append(i)
            origin_lists.append(origins)
    scales = np.array([holdout[fleet.ids[i]]["scale"] for i in judged_index])
    with np.errstate(invalid="ignore", over="ignore"):
        figures = realised_per_series(fleet, judged_index, origin_lists, run, lookback, horizon, scales,
                                      _baseline_season(report, season))
        # like with like: each series' latest new data laid out as its holdout was (the same
        # count of origins, same stride, aligned at its end), so that both MASEs average alike
        back = like_sized_back(cfg, fleet)
        like, latest = compared_mase(fleet, judged_index, first_new, back, run, lookback, horizon, scales)
    ids = [fleet.ids[i] for i in judged_index]
    realised = figures["mase"]
    before = np.array([holdout[s]["mase"] for s in ids], np.float64)
    non_finite = [ids[k] for k in np.flatnonzero(~np.isfinite(realised))]
    fleet_block = _fleet_block([ids[k] for k in like], latest, before[like], left_out, source)
    fleet_block.update(judged=len(ids), compared=len(like), holdout_origins_per_series=int(len(back)))
    aggregate = _holdout_aggregate(report, entry, variant)
    test = paired_degradation_test(latest, before[like], non_finite=non_finite)
    result: dict[str, Any] = {
        "channel": item.channel, "family": entry["family"], "variant": variant["name"],
        "trained_until": trained_until, "data_uri": fleet.source, "data_sha256": fleet.sha256,
        "from": utc_iso(min(fleet.timestamps(i)[first_new[i]] for i in judged_index)) if judged_index else None,
        "to": utc_iso(max(fleet.end(i) for i in range(fleet.n_series))) if fleet.n_series else None,
        "new_rows": int(sum(int(fleet.lengths[i] - first_new[i]) for i in judged_index)),
        "origins": int(sum(len(o) for o in origin_lists)),
        "stride": int(Counter(_stride(o) for o in origin_lists).most_common(1)[0][0]) if origin_lists else None,
        "block": 1, "mase_scale": None, **aggregate,
        "mase": finite_or_none(realised.mean()) if len(realised) else None,
        "mase_ci": _interval(realised) if not non_finite else None,
        "baseline": (report["baselines"].get("seasonal_naive") or {}).get("name") or report["baselines"].get("best"),
        "baseline_mase": finite_or_none(figures["baseline"].mean()) if len(realised) else None,
        "holdout_baseline_mase": _float((report["baselines"].get("seasonal_naive") or {}).get("mase")),
        "test": test, "p_value": test["p_value"], "degraded": test["degraded"], "fleet": fleet_block,
    }
    result["drift_check"] = pooled_drift(fleet, judged_index, first_new, season)
    result["drift"] = result["drift_check"]["drifted"]
    result["origin_times"], result["per_origin_mase"] = figures["origin_times"], figures["per_origin_mase"]
    result["seconds"] = round(time.monotonic() - started, 3)
    log.info("monitor %s %s/%s (fleet): realised mean MASE %s over %d series (their holdout %s; the fleet's %.4g, "
             "95%% [%.4g, %.4g]), %d left out, p=%s%s; worst %s; drift: %s", item.channel, entry["family"],
             variant["name"], _fmt(result["mase"]), len(ids), _fmt(fleet_block["holdout_mase_judged"]),
             result["holdout_mase"], *result["holdout_ci"], len(left_out), _fmt(result["p_value"]),
             " DEGRADED" if result["degraded"] else "", ", ".join(w["series"] for w in fleet_block["worst"][:3]),
             ", ".join(result["drift"]) or "none")
    return result


# --- the data ---------------------------------------------------------------------------------

def read_fleet(report: dict, data_uri: str | None, work_dir: Path, s3_settings: Any = None):
    """(config, fleet, left out): every series of the long table under the deployed version's
    settings without ``trained_until``, through the fleet data gate (its files under
    ``work_dir/gate``); the series the gate excluded, with its reasons."""
    import pandas as pd

    values = {**report["config"], "trained_until": None, "out_dir": str(work_dir / "gate")}
    if data_uri:
        values["data_uri"] = data_source(data_uri)
    cfg = PipelineConfig.from_dict(values)
    for shard in check_fleet_table(cfg, s3_settings=s3_settings):
        check_fleet_shard(cfg, shard)
    merge_fleet_checks(cfg)
    table = pd.read_parquet(cfg.layout.series_table)
    excluded = table[table["excluded_because"].notna()]
    left_out = [{"series": str(sid), "because": f"data_gate:{why}"}
                for sid, why in zip(excluded[cfg.series_column], excluded["excluded_because"], strict=True)]
    return cfg, FleetData.load(cfg.layout.fleet), left_out


def holdout_per_series(cfg, fleet, first_new: np.ndarray, variant: str, run, lookback: int,
                       table_path: str | Path | None) -> tuple[dict[str, dict], str]:
    """``{series id: {"mase", "scale"}}`` of the holdout, and where it came from: the family's
    per-series table (its ``<variant>.mase`` and ``mase_scale``), else recomputed on each series'
    rows up to ``trained_until`` as fleet_eval lays out the holdout."""
    if table_path is not None:
        import pandas as pd

        table = pd.read_parquet(table_path)
        column = f"{variant}.mase"
        missing = [c for c in ("series", column, "mase_scale") if c not in table.columns]
        if missing:
            raise ConfigError(f"{table_path}: no column {missing[0]!r} (a fleet family's per_series.parquet)")
        return ({str(s): {"mase": float(m), "scale": float(k)} for s, m, k in
                 zip(table["series"], table[column], table["mase_scale"], strict=True)}, str(table_path))

    split = split_fleet(first_new, cfg)
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


def _origins(n_rows: int, first: int, horizon: int, seasons: tuple[int, ...]) -> np.ndarray:
    return holdout_origins(n_rows, first, horizon, seasons).index


def _stride(origins: np.ndarray) -> int:
    return int(origins[1] - origins[0]) if len(origins) > 1 else 1


def _baseline_season(report: dict, season: int) -> int:
    named = (report["baselines"].get("seasonal_naive") or {}).get("season")
    return int(named) if named else season


# --- the verdict ---------------------------------------------------------------------------------

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


def paired_degradation_test(realised: np.ndarray, holdout: np.ndarray, alpha: float | None = None, *,
                            non_finite: list[str] | None = None) -> dict:
    """One-sided Wilcoxon signed-rank test across series that the log ratio realised / holdout
    MASE is above 0 (the series got worse). Both MASEs of a series must average the same
    number of like windows (the realised one over the latest windows laid out as the
    holdout's): under no change the log ratio is then symmetric about 0, which it is not when
    one averages more windows than the other (the less variable mean has the larger expected
    log). Degraded when p < ``alpha`` and at least ``MIN_SERIES`` series; and whenever a
    series had a non-finite forecast (``non_finite``: their ids), with the note
    "non-finite forecasts"."""
    from scipy import stats

    alpha = ALPHA if alpha is None else alpha
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


# --- drift ------------------------------------------------------------------------------------

def _float(value) -> float | None:
    return None if value is None else float(value)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"


__all__ = ["MIN_SERIES", "holdout_per_series", "compared_mase", "like_sized_back", "monitor_fleet", "paired_degradation_test", "read_fleet", "realised_per_series"]
