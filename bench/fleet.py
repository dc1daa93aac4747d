"""`make bench-fleet` and `make bench-fleet-scale`: fleet mode on the M1/M3 competition panels.

accuracy (per panel, everything in one process run): statsforecast's SeasonalNaive, Naive,
AutoETS and AutoTheta fitted on each series' training part ``x`` and forecasting its official
test ``xx``, and the onnxcast pipeline in fleet mode on the same long table (settings from
``Panel.settings()``, which hold out exactly the official test of every series). Both sides are
judged here on the same series, the same test period and the same MASE scale (the in-sample
seasonal-naive MAE of ``x``, Hyndman's M3 scale): the pipeline's per-series MAE, sMAPE and MAPE
come from ``models/<family>/per_series.parquet``. Table per panel: mean MASE with a 95 %
bootstrap interval over series, mean sMAPE and MAPE, the share of series lost to that series'
best naive, the paired p-value vs AutoETS (``significance.paired_test``, block 1: series are the
independent units), the edge choice and the two goals of issue 20.

scale: ``resample_panel(m3-monthly, n)`` written as Parquet; every pipeline step runs in its
own spawn child that reports its wall time and ``getrusage(RUSAGE_SELF).ru_maxrss`` (a max over
all children could not be split per step); the shard steps of a step run as concurrent children.

    .venv/bin/python bench/fleet.py accuracy --panels m3-monthly --minutes 1
    .venv/bin/python bench/fleet.py accuracy --no-pipeline          # statsforecast side only
    .venv/bin/python bench/fleet.py scale --series 100,1000,10000

Results: bench/fleet-results.json (one section per subcommand; a run replaces its section) and
bench/fleet-results.md. Design: docs/design/fleet.md sections 6 and 7; docs/fleet.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import logging
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxcast.pipeline.ensemble import ensemble_last

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "fleet-results.json"
MARKDOWN = REPO / "bench" / "fleet-results.md"
DEFAULT_PANELS = ("m3-monthly", "m3-quarterly", "m1-monthly")
# the statistical side, in table order; the first two are the naives the best naive is chosen from
STATSFORECAST_MODELS = ("SeasonalNaive", "Naive", "AutoETS", "AutoTheta")
NAIVES = ("SeasonalNaive", "Naive")
REFERENCE = "AutoETS"  # the goal's bar and the paired tests' other side
FAMILIES = ("nhits", "dlinear", "lstm", "transformer")  # cheap families first
# design section 7: 5 minutes of training per family on M3 monthly, 3 on the smaller panels
DEFAULT_MINUTES = {"m3-monthly": 5.0}
BOOTSTRAP_SAMPLES = 1000
METRICS = ("mae", "smape", "mape")
# forecast distributions (issue 21): the pipeline's default quantile levels; statsforecast's
# level=[80, 95] intervals give the same quantiles (intervals.quantiles_from_levels)
INTERVAL_LEVELS = (0.025, 0.1, 0.5, 0.9, 0.975)
INTERVALS = ("coverage_80", "coverage_95", "msis_80", "msis_95", "pinball")
SCALED_INTERVALS = ("msis_80", "msis_95", "pinball")  # divided by the MASE scale: rescaled to the bench's
BLOWUP_RATIO = 3.0  # issue 32: no series with a test MAE above 3x its seasonal naive's
COVERAGE_GOAL = 0.03  # issue 21: the edge model's 80% and 95% intervals within 3 points of nominal

log = logging.getLogger("bench.fleet")

# Published figures, each with where it was read. Only figures found in a source available to the
# bench's author are quoted; the paper's own tables are cited without numbers otherwise.
M3_PAPER = ('Makridakis, S. & Hibon, M. (2000), "The M3-Competition: results, conclusions and '
            'implications", International Journal of Forecasting 16(4):451-476')
LITERATURE = {
    "m3-monthly": {
        "citation": M3_PAPER + ", the table of sMAPE by method for the 1,428 monthly series "
                    "(average of forecasting horizons 1-18)",
        "figures": [
            {"method": "Theta", "measure": "sMAPE, horizons 1-18, monthly (as published)", "value": 13.85,
             "source": "Autobox, 'The M3 Forecasting Competition Calculations were off for Monthly Data' "
                       "(https://autobox.com/cms/index.php/blog/tags/tag/m3-competition): 'Theta went from "
                       "13.85 to 13.94' when recomputed from the submitted forecasts"},
            {"method": "Theta", "measure": "sMAPE, horizons 1-18, monthly (recomputed by Autobox)", "value": 13.94,
             "source": "the same Autobox note"},
        ],
        "context": [
            {"method": "Theta", "measure": "MASE over all 3,003 M3 series (not the monthly subset)", "value": 1.39,
             "source": "Hyndman, 'Forecast comparisons using the Mcomp package' "
                       "(https://pkg.robjhyndman.com/Mcomp/articles/Comparisons.html)"},
            {"method": "ForecastPro", "measure": "MASE over all 3,003 M3 series", "value": 1.47,
             "source": "the same vignette"},
            {"method": "ForecastX", "measure": "MASE over all 3,003 M3 series", "value": 1.42,
             "source": "the same vignette"},
        ],
        "note": "The paper's sMAPE averages each horizon's mean over series; ours is each series' mean over "
                "its 18 steps, averaged over series (equal here: every series has the same 18 steps), with "
                "the same 200|e|/(|y|+|f|). Forecasts differ: statsforecast's AutoTheta is not the "
                "competition's Theta submission. Other rows of the paper's table (ForecastPro, ForcX, "
                "Naive2 on the monthly subset) were not available to us as numbers: not quoted.",
    },
    "m3-quarterly": {
        "citation": M3_PAPER + ", the table of sMAPE by method for the 756 quarterly series (horizons 1-8)",
        "figures": [], "context": [],
        "note": "No figure for the quarterly subset was available to us: cited without numbers.",
    },
    "m1-monthly": {
        "citation": "Makridakis, S. et al. (1982), \"The accuracy of extrapolation (time series) methods: "
                    "results of a forecasting competition\", Journal of Forecasting 1(2):111-153 (the 617 "
                    "monthly series of M1)",
        "figures": [], "context": [],
        "note": "The M1 paper reports MAPE and other measures on its own subsamples; no figure for these 617 "
                "series was available to us: cited without numbers.",
    },
}


def load_panels_module():
    """tests/real_panels.py, loaded by path (the bench is not a package and must not import tests)."""
    path = REPO / "tests" / "real_panels.py"
    spec = importlib.util.spec_from_file_location("onnxcast_bench_real_panels", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


# --- the statsforecast side: fitted on x, forecasting xx ----------------------------------------

def statsforecast_per_series(panel, *, n_jobs: int = 1, models: tuple[str, ...] = STATSFORECAST_MODELS):
    """Per-series metrics of statsforecast's models on the official test of every series.

    Returns ``(table, seconds)``: one row per series (``series``, ``train_steps``, ``mase_scale``,
    ``<model>.mae/.smape/.mape/.mase``, the models' own ``level=[80, 95]`` prediction intervals
    judged as ``<model>.coverage_80/.coverage_95/.msis_80/.msis_95/.pinball`` (scaled by the
    same MASE scale), ``best_naive``, ``best_naive.*``) and the fit-and-forecast seconds per
    model (each model fitted on its own, so its cost is its own; intervals included)."""
    import pandas as pd
    from statsforecast import StatsForecast

    from onnxcast.pipeline.intervals import (
        quantiles_from_levels,
        reference_levels,
        row_interval_metrics,
    )

    train, test = split_official(panel)
    ids = np.asarray(sorted(train["unique_id"].unique()))
    widths = reference_levels(INTERVAL_LEVELS)
    forecasts, quantiles, seconds = {}, {}, {}
    for name in models:
        model = make_model(name, panel.season)
        sf = StatsForecast(models=[model], freq=1, n_jobs=n_jobs, fallback_model=make_model("SeasonalNaive", panel.season))
        started = time.monotonic()
        out = sf.forecast(h=panel.horizon, df=train, level=widths)
        seconds[name] = round(time.monotonic() - started, 2)
        out = out.sort_values(["unique_id", "ds"])

        def column(key: str, frame=out) -> np.ndarray:
            return frame[key].to_numpy(np.float64).reshape(len(ids), panel.horizon)

        forecasts[name] = column(name)
        quantiles[name] = quantiles_from_levels({w: column(f"{name}-lo-{w}") for w in widths},
                                                {w: column(f"{name}-hi-{w}") for w in widths}, forecasts[name],
                                                INTERVAL_LEVELS)
        log.info("%s: %s on %d series in %.1fs", panel.name, name, len(ids), seconds[name])
    actual = test.sort_values(["unique_id", "ds"])["y"].to_numpy(np.float64).reshape(len(ids), panel.horizon)
    x_by_id = {k: g.to_numpy(np.float64) for k, g in train.groupby("unique_id", sort=True)["y"]}
    scales = np.array([mase_scale(x_by_id[i], panel.season) for i in ids])
    table = pd.DataFrame({"series": ids, "train_steps": [len(x_by_id[i]) for i in ids], "mase_scale": scales})
    for name, predicted in forecasts.items():
        for metric, values in series_metrics(actual, predicted, scales).items():
            table[f"{name}.{metric}"] = values
        for metric, values in row_interval_metrics(actual, quantiles[name], INTERVAL_LEVELS, scales).items():
            table[f"{name}.{metric}"] = values
    return add_best_naive(table), seconds


def make_model(name: str, season: int):
    from statsforecast import models as m

    if name == "Naive":
        return m.Naive()
    if name == "SeasonalNaive":
        return m.SeasonalNaive(season_length=season)
    return getattr(m, name)(season_length=season)


def split_official(panel):
    """(train, test) with integer time steps per series (statsforecast's ``freq=1``, which
    aligns every series at its own end): the test is the last ``h`` points of each series."""
    frame = panel.frame[["unique_id", "y"]].copy()
    frame["unique_id"] = frame["unique_id"].astype(str)
    frame["ds"] = frame.groupby("unique_id").cumcount()
    back = frame.groupby("unique_id").cumcount(ascending=False)  # not groupby.apply (pandas 3)
    return frame[back >= panel.horizon], frame[back < panel.horizon]


def mase_scale(x: np.ndarray, season: int) -> float:
    """In-sample seasonal-naive MAE of the training part (period 1: the naive's), as Hyndman's
    M3 scale ``mean(abs(diff(x, lag=frequency)))``; NaN when undefined (then the series has no MASE)."""
    lag = season if len(x) > season else 1
    diffs = np.abs(x[lag:] - x[:-lag])
    scale = float(diffs.mean()) if len(diffs) else 0.0
    return scale if scale > 0 else float("nan")


def series_metrics(actual: np.ndarray, predicted: np.ndarray, scales: np.ndarray) -> dict[str, np.ndarray]:
    """MAE, sMAPE (200|e|/(|y|+|f|), 0..200), MAPE (percent; NaN when the series has a zero actual)
    and MASE, each series' mean over its test steps: arrays ``[n_series, horizon]`` in, ``[n_series]`` out."""
    error = np.abs(predicted - actual)
    denom = np.abs(actual) + np.abs(predicted)
    with np.errstate(divide="ignore", invalid="ignore"):
        smape = np.where(denom > 0, 200.0 * error / denom, 0.0).mean(axis=1)
        mape = np.where((actual != 0).all(axis=1), (100.0 * error / np.abs(actual)).mean(axis=1), np.nan)
    mae = error.mean(axis=1)
    return {"mae": mae, "smape": smape, "mape": mape, "mase": mae / scales}


def add_best_naive(table):
    """Each series' best naive: the naive with the lower test MAE on that series (the harder bar,
    as the pipeline's per-series best naive)."""
    maes = np.stack([table[f"{n}.mae"].to_numpy() for n in NAIVES], axis=1)
    pick = np.argmin(maes, axis=1)
    table["best_naive"] = np.asarray(NAIVES)[pick]
    for metric in ("mae", "smape", "mape", "mase"):
        values = np.stack([table[f"{n}.{metric}"].to_numpy() for n in NAIVES], axis=1)
        table[f"best_naive.{metric}"] = values[np.arange(len(table)), pick]
    return table


# --- aggregates over series ------------------------------------------------------------------------

def mean_interval(values: np.ndarray, level: float = 0.95, seed: int = 0) -> list[float]:
    """Percentile bootstrap interval of the mean over series (series are independent units)."""
    values = np.asarray(values, np.float64)
    values = values[np.isfinite(values)]
    if len(values) < 2:
        return [float("nan"), float("nan")]
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(BOOTSTRAP_SAMPLES, len(values)))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return [float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))]


def aggregate(table, forecaster: str, *, reference: str | None = REFERENCE) -> dict:
    """Mean MASE [95 % CI], median MASE, mean sMAPE [CI], mean MAPE, the share of series lost to
    their best naive (higher test MAE) and the paired test of per-series MASE vs ``reference``."""
    from onnxcast.pipeline.significance import paired_test

    mase = table[f"{forecaster}.mase"].to_numpy(np.float64)
    finite = np.isfinite(mase)
    mape = table[f"{forecaster}.mape"].to_numpy(np.float64)
    result = {
        "forecaster": forecaster, "series": int(finite.sum()),
        "mase_mean": float(mase[finite].mean()), "mase_ci95": mean_interval(mase[finite]),
        "mase_median": float(np.median(mase[finite])),
        "smape_mean": float(table[f"{forecaster}.smape"].mean()),
        "smape_ci95": mean_interval(table[f"{forecaster}.smape"].to_numpy()),
        "mape_mean": float(np.nanmean(mape)) if np.isfinite(mape).any() else None,
        "mape_series": int(np.isfinite(mape).sum()),
        "loses_share": float((table[f"{forecaster}.mae"] > table["best_naive.mae"]).mean()),
    }
    blowup = (table[f"{forecaster}.mae"] > BLOWUP_RATIO * table["SeasonalNaive.mae"]).to_numpy()
    result["blowups"] = int(blowup.sum())
    result["blowup_series"] = table.loc[blowup, "series"].astype(str).tolist()[:20]
    if reference and forecaster != reference and f"{reference}.mase" in table:
        other = table[f"{reference}.mase"].to_numpy(np.float64)
        both = finite & np.isfinite(other)
        test = paired_test(mase[both], other[both], block=1)
        result[f"vs_{reference}"] = {"p_value": test["p_value"], "mean_diff": test["mean_diff"],
                                     "significant": test["significant"], "series": test["origins"]}
    intervals = interval_aggregate(table, forecaster, reference=reference)
    if intervals:
        result["intervals"] = intervals
    return result


def interval_aggregate(table, forecaster: str, *, reference: str | None = REFERENCE) -> dict | None:
    """Means over series of the forecaster's interval columns (coverage is then the pooled
    coverage: every series has its h test points), a bootstrap interval of the mean MSIS of the
    95% interval and the paired test of per-series MSIS (95%) vs ``reference``'s; None when the
    forecaster has no intervals."""
    from onnxcast.pipeline.significance import paired_test

    if f"{forecaster}.msis_95" not in table:
        return None
    values = {m: table[f"{forecaster}.{m}"].to_numpy(np.float64) for m in INTERVALS if f"{forecaster}.{m}" in table}
    ran = np.all([np.isfinite(v) for v in values.values()], axis=0)
    out = {"series": int(ran.sum()), **{m: float(v[ran].mean()) if ran.any() else None for m, v in values.items()},
           "msis_95_ci95": mean_interval(values["msis_95"][ran])}
    if reference and forecaster != reference and f"{reference}.msis_95" in table:
        other = table[f"{reference}.msis_95"].to_numpy(np.float64)
        both = ran & np.isfinite(other)
        test = paired_test(values["msis_95"][both], other[both], block=1)
        out[f"msis_95_vs_{reference}"] = {"p_value": test["p_value"], "mean_diff": test["mean_diff"],
                                          "significant": test["significant"], "series": test["origins"]}
    return out


# --- the pipeline side -------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One pipeline step as the CLI runs it (onnxcast.pipeline.run._run_steps) and Airflow maps it:
    ``function`` is "module:name" (so a spawn child can import it), called ``function(cfg, *args)``."""
    name: str
    function: str
    args: tuple = ()
    shard: int | None = None


def fleet_steps(cfg, shards: list[int]) -> list[list[Step]]:
    """The fleet run's steps in order, grouped: the steps of one group may run at once (the shards
    of a mapped task); the groups run one after another, as in ``run._run_steps``."""
    quality, evaluation, run = "onnxcast.pipeline.fleet_quality", "onnxcast.pipeline.fleet_eval", "onnxcast.pipeline.run"
    groups = [[Step("check_series", f"{quality}:check_fleet_shard", (k,), k) for k in shards],
              [Step("merge_data", f"{quality}:merge_fleet_checks")],
              [Step("reference", f"{evaluation}:reference_shard", (k,), k) for k in shards]]
    for family in ensemble_last(cfg.models):  # the ensemble combines the families trained before it
        groups += [[Step(f"train {family}", f"{run}:train_family", (family,))],
                   [Step(f"export {family}", f"{run}:export_family", (family,))],
                   [Step(f"optimize {family}", f"{run}:optimize_family", (family,))]]
    groups.append([Step("evaluate", f"{evaluation}:evaluate_shard", (k,), k) for k in shards])
    groups += [[Step(f"validate {family}", f"{run}:validate_family", (family,))] for family in cfg.models]
    groups.append([Step("report", f"{run}:assemble_report")])
    return groups


CHECK_TABLE = Step("check_data", "onnxcast.pipeline.fleet_quality:check_fleet_table")


def call_step(step: Step, cfg):
    import importlib

    module, name = step.function.split(":")
    return getattr(importlib.import_module(module), name)(cfg, *step.args)


def run_fleet_steps(cfg) -> tuple[dict, str, list[dict]]:
    """Every step of a fleet run in this process, on the run folder itself (as Airflow's tasks do,
    no staging): a failed gate leaves the per-series tables in place, so the table still has every
    family. Returns (report, status, step timings)."""
    from onnxcast.base.errors import GateError
    from onnxcast.base.files import read_json

    timings, current = [], [CHECK_TABLE]

    def timed(step):
        current[0] = step
        started = time.monotonic()
        try:
            return call_step(step, cfg)
        finally:
            timings.append({"step": step.name, "shard": step.shard, "wall_s": round(time.monotonic() - started, 2)})

    report, status = None, "passed"
    try:
        shards = timed(CHECK_TABLE)
        for step in (s for group in fleet_steps(cfg, list(shards)) for s in group):
            value = timed(step)
            if step.name == "report":
                report = value
    except GateError as error:
        report, status = read_json(cfg.layout.failed_report), f"no family passed its gates: {error}"
    except Exception as error:  # the statsforecast side still makes a table; the run says why it stopped
        log.exception("%s: the pipeline failed", cfg.data_uri)
        status = f"{current[0].name} failed: {type(error).__name__}: {error}"
    return report, status, timings


def pipeline_per_series(cfg, family: str, variant: str = "fp32", path: Path | None = None):
    """A family's per-series MAE, sMAPE and MAPE of one variant, and its interval columns
    (``coverage_*``, ``msis_*``, ``pinball``: a model without quantiles has none) with the
    pipeline's MASE scale (``pipeline_scale``), from the run's Parquet table (``path``: another
    per-series table of the run, e.g. the reference's)."""
    import pandas as pd

    table = pd.read_parquet(path or cfg.layout.per_series(family))
    keep = {"series": table["series"].astype(str), "pipeline_scale": table["mase_scale"]}
    for metric in (*METRICS, *INTERVALS):
        column = f"{variant}.{metric}"
        if column in table:
            keep[metric] = table[column]
        elif metric in METRICS:
            keep[metric] = np.nan
    return pd.DataFrame(keep)


def join_pipeline(table, cfg, families: list[str], variants: dict[str, list[str]]):
    """The statsforecast table restricted to the series the pipeline judged, with each family's
    variants as forecasters ``<family>/<variant>`` and the pipeline's fleet naive with its
    split-conformal intervals as ``pipeline/<naive>``; MASE recomputed on our scale (the MAE over
    the scale of ``x``) and MSIS and pinball brought to it (times the pipeline's scale over
    ours), so every row of the table uses one scale."""
    from onnxcast.pipeline.fleet_eval import FLEET_NAIVE

    merged = table.copy()
    parts = [(f"{family}/{variant}", pipeline_per_series(cfg, family, variant))
             for family in families for variant in variants.get(family, ["fp32"])]
    if cfg.layout.reference_table.exists():
        import pandas as pd

        naive = str(pd.read_parquet(cfg.layout.reference_table, columns=[FLEET_NAIVE])[FLEET_NAIVE].iloc[0])
        parts.append((f"pipeline/{naive}", pipeline_per_series(cfg, "", FLEET_NAIVE, cfg.layout.reference_table)))
    for key, part in parts:
        ratio = part.pop("pipeline_scale")
        part = part.rename(columns={m: f"{key}.{m}" for m in (*METRICS, *INTERVALS)})
        part["_ratio"] = ratio
        merged = merged.merge(part, on="series", how="inner")
        merged[f"{key}.mase"] = merged[f"{key}.mae"] / merged["mase_scale"]
        for metric in SCALED_INTERVALS:
            if f"{key}.{metric}" in merged:
                merged[f"{key}.{metric}"] = merged[f"{key}.{metric}"] * merged["_ratio"] / merged["mase_scale"]
        merged = merged.drop(columns="_ratio")
    return merged


def accuracy_panel(name: str, args, work: Path) -> dict:
    """One panel: the statsforecast side, then the pipeline on the same series, then the table."""
    panels = load_panels_module()
    panel = panels.load_panel(name, limit=args.limit)
    started = time.monotonic()
    table, sf_seconds, sf_source = statsforecast_side(panel, args)
    row = {"panel": name, "series": panel.n_series, "rows": int(len(panel.frame)), "horizon": panel.horizon,
           "season": panel.season, "freq": panel.freq, "train_steps": describe(table["train_steps"]),
           "statsforecast_seconds": sf_seconds, "statsforecast_source": sf_source,
           "literature": LITERATURE.get(name)}
    judged, pipeline = table, None
    if not args.no_pipeline:
        pipeline, judged = run_panel_pipeline(panel, table, args, work)
    forecasters = [f for f in pipeline["forecasters"]] if pipeline else []
    row["forecasters"] = [aggregate(judged, f) for f in (*forecasters, *STATSFORECAST_MODELS)]
    row["best_naive"] = aggregate(judged, "best_naive")
    row["judged_series"] = int(len(judged))
    row["pipeline"] = pipeline
    row["goals"] = goals(row)
    row["seconds"] = round(time.monotonic() - started, 1)
    return row


def statsforecast_side(panel, args):
    """The statsforecast table: fitted in this run, or, with ``--statsforecast-cache DIR``, read
    from a table an earlier run of this bench saved there for the same panel and sample (fitted
    and saved when absent). Returns (table, seconds, source: "this run" or where it was read)."""
    import pandas as pd

    cache = None
    if args.statsforecast_cache:
        cache = Path(args.statsforecast_cache) / f"{panel.name}-{args.limit or 'all'}-statsforecast.parquet"
        cached = None
        if cache.exists():
            import pyarrow.parquet as pq

            cached = pq.read_schema(cache).names
        if cached and f"{REFERENCE}.msis_95" not in cached:
            log.info("%s: %s has no intervals (an earlier bench): fitted again", panel.name, cache)
        elif cached:
            meta = json.loads(cache.with_suffix(".json").read_text())
            log.info("%s: statsforecast side read from %s (fitted %s)", panel.name, cache, meta["fitted"])
            return pd.read_parquet(cache), meta["seconds"], f"read from {cache.name}, fitted {meta['fitted']}"
    table, seconds = statsforecast_per_series(panel, n_jobs=args.n_jobs)
    if cache:
        cache.parent.mkdir(parents=True, exist_ok=True)
        table.to_parquet(cache, index=False)
        cache.with_suffix(".json").write_text(json.dumps(
            {"fitted": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "seconds": seconds,
             "n_jobs": args.n_jobs}))
    return table, seconds, "this run"


def run_panel_pipeline(panel, table, args, work: Path) -> tuple[dict, object]:
    from onnxcast.pipeline.config import PipelineConfig

    data = load_panels_module().write_panel(panel, work / f"{panel.name}.parquet")
    minutes = args.minutes if args.minutes is not None else DEFAULT_MINUTES.get(panel.name, 3.0)
    settings = panel.settings(data_uri=data, out_dir=str(work / panel.name), models=",".join(args.families),
                              max_minutes=minutes, fleet_shards=1, threads=1,
                              reference_max_series=args.reference_series,
                              **json.loads(args.settings or "{}"))
    cfg = PipelineConfig.from_dict(settings)
    started = time.monotonic()
    report, status, timings = run_fleet_steps(cfg)
    seconds = round(time.monotonic() - started, 1)
    edge = (report.get("selected") or {}).get("edge") if report else None
    variants = {f: ["fp32"] for f in cfg.models}
    if edge and edge["variant"] != "fp32":
        variants[edge["family"]].append(edge["variant"])
    judged_families = [f for f in cfg.models if cfg.layout.per_series(f).exists()]
    judged = join_pipeline(table, cfg, judged_families, variants)
    forecasters = [f"{f}/{v}" for f in judged_families for v in variants[f]]
    forecasters += [c[: -len(".mase")] for c in judged.columns if c.startswith("pipeline/") and c.endswith(".mase")]
    log.info("%s: pipeline %s in %.0fs; %d of %d series judged by both", panel.name, status, seconds, len(judged),
             len(table))
    return {"status": status, "seconds": seconds, "minutes_per_family": minutes, "families": list(cfg.models),
            "forecasters": forecasters, "edge": edge, "steps": timings,
            "excluded_series": len(table) - len(judged), "report_fleet": (report or {}).get("fleet"),
            "training": {m["family"]: training_summary(m) for m in (report or {}).get("models", [])}}, judged


def training_summary(model: dict) -> dict:
    trained = (model.get("training") or {}).get("training") or {}
    return {k: trained.get(k) for k in ("epochs", "best_epoch", "initial_validation_loss", "best_validation_loss",
                                        "stopped", "seconds") if k in trained} | {
        "gates_passed": model.get("gates_passed"), "failures": model.get("failures", [])}


def goals(row: dict) -> dict:
    """Issue 20's goals on this panel: the edge model's mean MASE below AutoETS's, and the LSTM and
    the Transformer (fp32) each better than the best naive in aggregate (mean MASE)."""
    by = {a["forecaster"]: a for a in row["forecasters"]}
    # the bar of the goal and of the pipeline's gate: the one naive best in aggregate (each series'
    # own best naive is picked on its holdout, look-ahead; it is only the bar of "loses")
    naives = {n: by[n]["mase_mean"] for n in NAIVES if n in by}
    naive_name = min(naives, key=naives.get) if naives else None
    ets, naive = (by.get(REFERENCE) or {}).get("mase_mean"), naives.get(naive_name)
    pipeline = row.get("pipeline") or {}
    edge = pipeline.get("edge")
    edge_key = f"{edge['family']}/{edge['variant']}" if edge else None
    result = {"edge": edge_key, "edge_mase_mean": by[edge_key]["mase_mean"] if edge_key in by else None,
              "autoets_mase_mean": ets, "best_naive": naive_name, "best_naive_mase_mean": naive}
    result["edge_beats_autoets"] = None not in (result["edge_mase_mean"], ets) and result["edge_mase_mean"] < ets
    for family in ("lstm", "transformer"):
        key = f"{family}/fp32"
        result[f"{family}_beats_best_naive"] = by[key]["mase_mean"] < naive if key in by and naive else None
    # issue 21: the edge model's 80% and 95% intervals cover within 3 points of nominal, with a
    # lower mean MSIS (95%) than AutoETS's own intervals on the same series and test period
    edge_iv = (by.get(edge_key) or {}).get("intervals") or {}
    ets_iv = (by.get(REFERENCE) or {}).get("intervals") or {}
    gaps = [abs(edge_iv[f"coverage_{p}"] - p / 100) for p in (80, 95) if edge_iv.get(f"coverage_{p}") is not None]
    result.update(edge_coverage_80=edge_iv.get("coverage_80"), edge_coverage_95=edge_iv.get("coverage_95"),
                  edge_msis_95=edge_iv.get("msis_95"), autoets_msis_95=ets_iv.get("msis_95"),
                  edge_coverage_within_3_points=(len(gaps) == 2 and max(gaps) <= COVERAGE_GOAL) if edge_iv else None)
    result["edge_msis_below_autoets"] = (edge_iv["msis_95"] < ets_iv["msis_95"]
                                         if edge_iv.get("msis_95") is not None and ets_iv.get("msis_95") is not None
                                         else None)
    return result


def describe(values) -> dict:
    values = np.asarray(values)
    return {"min": int(values.min()), "median": float(np.median(values)), "max": int(values.max())}


# --- scale: every step in its own spawn child ----------------------------------------------------

def _child(step: Step, settings: dict, conn) -> None:
    """A spawn child: run one step, send back (ok, value or error, wall s, peak RSS MiB)."""
    import resource

    from onnxcast.pipeline.config import PipelineConfig

    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    try:
        value, ok = call_step(step, PipelineConfig.from_dict(settings)), True
    except BaseException as error:  # reported to the parent, which decides
        value, ok = f"{type(error).__name__}: {error}", False
    wall = time.monotonic() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB
    try:
        json.dumps(value)
    except TypeError:
        value = None
    conn.send((ok, value, wall, peak_mib))
    conn.close()


def run_group(steps: list[Step], settings: dict) -> list[dict]:
    """Run the steps of one group as concurrent spawn children; their timings, in order."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    started = time.monotonic()
    running = []
    for step in steps:
        parent, child = ctx.Pipe(duplex=False)
        process = ctx.Process(target=_child, args=(step, settings, child), name=f"bench-{step.name}")
        process.start()
        child.close()
        running.append((step, process, parent))
    rows = []
    for step, process, parent in running:
        try:
            ok, value, wall, peak = parent.recv()
        except EOFError:  # killed (out of memory) before it could answer
            ok, value, wall, peak = False, f"child died (exit code {process.exitcode})", float("nan"), float("nan")
        process.join()
        rows.append({"step": step.name, "shard": step.shard, "ok": ok, "value": value, "wall_s": round(wall, 2),
                     "peak_mib": round(peak, 1)})
    group_wall = time.monotonic() - started
    for row in rows:
        row["group_wall_s"] = round(group_wall, 2)
    return rows


def scale_fleet(n_series: int, args, work: Path) -> dict:
    """One fleet size end to end, step by step; the timings, and the run's fleet summary."""
    panels = load_panels_module()
    base = panels.load_panel("m3-monthly")
    panel = panels.resample_panel(base, n_series, seed=0)
    data = panels.write_panel(panel, work / f"fleet-{n_series}.parquet")
    settings = panel.settings(data_uri=data, out_dir=str(work / f"run-{n_series}"), models=",".join(args.families),
                              max_minutes=args.minutes, fleet_shards=args.shards, threads=1,
                              reference_max_series=args.reference_series, **json.loads(args.settings or "{}"))
    n_rows = int(len(panel.frame))
    # Each step's child starts as a fork of this process: a peak below this process's own size
    # cannot be seen (at 100,000 series every step read 1,203 MB, the panel held here)
    del panel, base
    import gc

    gc.collect()
    from onnxcast.pipeline.config import PipelineConfig

    cfg = PipelineConfig.from_dict(settings)
    load = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    rows = run_group([CHECK_TABLE], settings)
    status = "passed"
    if rows[0]["ok"]:
        for group in fleet_steps(cfg, list(rows[0]["value"])):
            done = run_group(group, settings)
            rows += done
            failed = [r for r in done if not r["ok"]]
            if failed:
                why = str(failed[0]["value"])
                status = (f"every step ran; no family passed its gates ({why.removeprefix('GateError: ')})"
                          if why.startswith("GateError") else f"{failed[0]['step']} failed: {why}")
                break
    else:
        status = f"check_data failed: {rows[0]['value']}"
    total = time.monotonic() - started
    for row in rows:
        row.pop("value", None)
    log.info("scale %d series: %s in %.0fs", n_series, status, total)
    return {"series": n_series, "rows": n_rows, "parquet_mib": round(Path(data).stat().st_size / 2**20, 2),
            "families": list(cfg.models), "minutes_per_family": args.minutes, "shards": args.shards,
            "reference_max_series": args.reference_series, "status": status, "end_to_end_s": round(total, 1),
            "load_average_at_start": load,
            "steps": rows}


# --- rendering --------------------------------------------------------------------------------------

def _f(value, spec=".3f") -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return format(value, spec)


def render_accuracy(section: dict) -> list[str]:
    lines = ["## Accuracy on the competition panels", "",
             f"Command: `{section['command']}` ({section['date']}, {section['machine']}). Every row is judged on "
             "the same series and the same official test period (each series' last h points, its `xx`); MASE "
             "on each series' in-sample seasonal-naive MAE of `x`; sMAPE 200|e|/(|y|+|f|); CI: 95 % bootstrap "
             "of the mean over series; 'loses' is the share of series where the forecaster's test MAE is "
             "above that series' best naive (the better of SeasonalNaive and Naive on that series' test); p: "
             "paired test of per-series MASE vs AutoETS (Diebold-Mariano with block 1, HLN), < 0.05 and a "
             "lower mean is a significant win.", ""]
    for row in section["panels"]:
        lines += render_panel(row)
    return lines


def render_panel(row: dict) -> list[str]:
    pipeline = row.get("pipeline") or {}
    lines = [f"### {row['panel']}: {row['judged_series']} of {row['series']} series, h {row['horizon']}, "
             f"period {row['season']}, training length {row['train_steps']['min']}-{row['train_steps']['max']} "
             f"(median {row['train_steps']['median']:g})", ""]
    if row.get("command"):
        lines.append(f"Command of this panel: `{row['command']}`" + (f"; {row['note']}" if row.get("note") else "") + ".")
    if pipeline:
        lines.append(f"Pipeline: {pipeline['status']} in {pipeline['seconds']:.0f} s (families "
                     f"{', '.join(pipeline['families'])}, {pipeline['minutes_per_family']:g} min of training each; "
                     f"{pipeline['excluded_series']} series not judged by the pipeline). statsforecast "
                     f"({row.get('statsforecast_source', 'this run')}) seconds: "
                     + ", ".join(f"{k} {v:g}" for k, v in row["statsforecast_seconds"].items()) + ".")
    else:
        lines.append(f"Pipeline not run (--no-pipeline). statsforecast ({row.get('statsforecast_source', 'this run')}) "
                     "seconds: "
                     + ", ".join(f"{k} {v:g}" for k, v in row["statsforecast_seconds"].items()) + ".")
    own = ((pipeline.get("report_fleet") or {}).get("reference") or {})
    if own.get("aggregates"):
        lines.append("Cross-check, the pipeline's own reference (its per-series tables, on "
                     f"{own.get('sample_size')} series; MASE on the pipeline's training-segment scale): "
                     + ", ".join(f"{name} mean MASE {_f(a.get('mase_mean'))}" for name, a in own["aggregates"].items()
                                 if isinstance(a, dict)) + ".")
    lines += ["", "| forecaster | mean MASE [95 % CI] | median MASE | mean sMAPE [95 % CI] | mean MAPE | loses to best naive "
              f"| MAE > {BLOWUP_RATIO:g}x seasonal naive | p vs AutoETS |",
              "|---|---|---:|---|---:|---:|---:|---:|"]
    for a in [*row["forecasters"], row["best_naive"]]:
        versus = a.get(f"vs_{REFERENCE}") or {}
        name = a["forecaster"].replace("best_naive", "best naive (per series)")
        lines.append(f"| {name} | {_f(a['mase_mean'])} [{_f(a['mase_ci95'][0])}, {_f(a['mase_ci95'][1])}] | "
                     f"{_f(a['mase_median'])} | {_f(a['smape_mean'], '.2f')} [{_f(a['smape_ci95'][0], '.2f')}, "
                     f"{_f(a['smape_ci95'][1], '.2f')}] | {_f(a['mape_mean'], '.2f')} | {_f(a['loses_share'], '.1%')} | "
                     f"{a.get('blowups', '-')} | {_f(versus.get('p_value'), '.3g')} |")
    lines += render_intervals(row)
    g = row["goals"]
    lines += ["", f"Edge choice: {g['edge'] or 'none'}. Goal 'edge model mean MASE < AutoETS': "
              + (_yes(g["edge_beats_autoets"]) + f" ({_f(g['edge_mase_mean'])} vs {_f(g['autoets_mase_mean'])})"
                 if g["edge"] else "not met (no edge model)") + ". Goal 'LSTM / Transformer beat the best naive in "
              f"aggregate' (mean MASE < {g.get('best_naive')}'s {_f(g['best_naive_mase_mean'])}): LSTM {_yes(g['lstm_beats_best_naive'])}, "
              f"Transformer {_yes(g['transformer_beats_best_naive'])}.", ""]
    lines += render_literature(row.get("literature"))
    return lines


def render_intervals(row: dict) -> list[str]:
    """The forecast distributions of every forecaster with intervals, and issue 21's goal."""
    rows = [a for a in row["forecasters"] if a.get("intervals")]
    if not rows:
        return []
    lines = ["", "Forecast intervals on the same series and test period (coverage: share of test points inside "
             "the central interval; MSIS: the M4's mean scaled interval score, on the same MASE scale; pinball: "
             "mean scaled pinball loss over the levels 0.025, 0.1, 0.5, 0.9, 0.975; statsforecast models: their "
             "own level=[80, 95] intervals; pipeline/*: the pipeline's fleet naive with split-conformal "
             "intervals; p: paired test of per-series MSIS (95%) vs AutoETS):", "",
             "| forecaster | coverage 80% | coverage 95% | MSIS 80% | MSIS 95% [95 % CI] | pinball | p MSIS vs AutoETS |",
             "|---|---:|---:|---:|---|---:|---:|"]
    for a in rows:
        iv = a["intervals"]
        versus = iv.get(f"msis_95_vs_{REFERENCE}") or {}
        ci = iv.get("msis_95_ci95") or [None, None]
        lines.append(f"| {a['forecaster']} | {_f(iv.get('coverage_80'), '.1%')} | {_f(iv.get('coverage_95'), '.1%')} | "
                     f"{_f(iv.get('msis_80'))} | {_f(iv.get('msis_95'))} [{_f(ci[0])}, {_f(ci[1])}] | "
                     f"{_f(iv.get('pinball'), '.4f')} | {_f(versus.get('p_value'), '.3g')} |")
    g = row["goals"]
    lines += ["", f"Goal (issue 21) 'the edge model's 80% and 95% intervals within 3 points of nominal': "
              f"{_yes(g.get('edge_coverage_within_3_points'))} ({_f(g.get('edge_coverage_80'), '.1%')}, "
              f"{_f(g.get('edge_coverage_95'), '.1%')}); 'its MSIS (95%) below AutoETS's': "
              f"{_yes(g.get('edge_msis_below_autoets'))} ({_f(g.get('edge_msis_95'))} vs {_f(g.get('autoets_msis_95'))})."]
    return lines


def _yes(value) -> str:
    return "not run" if value is None else ("met" if value else "NOT met")


def render_literature(literature: dict | None) -> list[str]:
    if not literature:
        return []
    lines = [f"Literature: {literature['citation']}."]
    for item in literature["figures"]:
        lines.append(f"- {item['method']}: {item['value']:g} ({item['measure']}; read in {item['source']}).")
    for item in literature["context"]:
        lines.append(f"- context, not the same series: {item['method']} {item['value']:g} ({item['measure']}; "
                     f"{item['source']}).")
    return [*lines, f"- {literature['note']}", ""]


def render_scale(section: dict) -> list[str]:
    lines = ["## Scale: wall time and peak memory per step", "",
             f"Command: `{section['command']}` ({section['date']}, {section['machine']}). Fleets made by "
             "resampling M3 monthly series (tests/real_panels.resample_panel: drawn with replacement, each "
             "copy scaled by a lognormal factor), written as Parquet. Each step ran in its own spawn child "
             "('step s': the step's own work; 'with start s': the same plus the process's start and imports, "
             "as an Airflow task pays them; shards of a step ran as concurrent children: the slowest shard, "
             "the group's wall time); peak MB is that child's ru_maxrss (the largest shard's). Load average "
             "of the machine (shared with other work) at the start of each fleet in the JSON.", "",
             "| series | rows | step | step s | with start s | peak MB |", "|---:|---:|---|---:|---:|---:|"]
    for fleet in section["fleets"]:
        for name, wall, group_wall, peak in step_rows(fleet["steps"]):
            lines.append(f"| {fleet['series']:,} | {fleet['rows']:,} | {name} | {_f(wall, '.1f')} | "
                         f"{_f(group_wall, '.1f')} | {_f(peak, '.0f')} |")
        lines.append(f"| {fleet['series']:,} | {fleet['rows']:,} | **end to end** ({fleet['status']}) | "
                     f"{_f(sum(s['wall_s'] for s in fleet['steps']), '.1f')} (sum over children) | **{_f(fleet['end_to_end_s'], '.1f')}** | "
                     f"{_f(max_peak(fleet), '.0f')} |")
    lines += ["", goal_line(section), ""]
    return lines


def step_rows(steps: list[dict]):
    """One row per step; the shards of a step folded into one (group wall, largest peak)."""
    seen = {}
    for s in steps:
        if s["step"] in seen:
            row = seen[s["step"]]
            row[1], row[3] = max(row[1], s["wall_s"]), max(row[3], s["peak_mib"])
            continue
        name = s["step"] + (" (per shard, concurrent)" if s["shard"] is not None else "")
        seen[s["step"]] = [name, s["wall_s"], s["group_wall_s"], s["peak_mib"]]
    return [tuple(v) for v in seen.values()]


def max_peak(fleet: dict) -> float:
    peaks = [s["peak_mib"] for s in fleet["steps"] if np.isfinite(s["peak_mib"])]
    return max(peaks) if peaks else float("nan")


def goal_line(section: dict) -> str:
    big = [f for f in section["fleets"] if f["series"] >= 10_000]
    if not big:
        return ("Goal '10,000 monthly series end to end < 60 min on 2 cores, reference included': not measured "
                "in this run (no 10,000-series fleet).")
    fleet = big[0]
    met = fleet["status"] == "passed" and fleet["end_to_end_s"] < 3600
    return (f"Goal '10,000 monthly series end to end < 60 min on 2 cores, reference included': "
            f"{'met' if met else 'NOT met'} ({fleet['end_to_end_s'] / 60:.1f} min, {fleet['status']}; reference on "
            f"{fleet['reference_max_series'] or 'all'} series).")


def write_results(results: dict, json_path: Path, markdown_path: Path) -> None:
    json_path.write_text(json.dumps(results, indent=2, default=_json_default) + "\n")
    lines = ["# Fleet benchmark (issue 20)", "",
             "Written by `bench/fleet.py` (`make bench-fleet`, `make bench-fleet-scale`); docs/fleet.md explains "
             "the protocol.", ""]
    if "accuracy" in results:
        lines += render_accuracy(results["accuracy"])
    if "scale" in results:
        lines += render_scale(results["scale"])
    markdown_path.write_text("\n".join(lines) + "\n")


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


# --- command line ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="JSON results file (its section is replaced)")
    parser.add_argument("--markdown", type=Path, default=MARKDOWN, help="Markdown tables")
    parser.add_argument("--work", type=Path, help="folder for the data and runs (default: a temporary one)")
    sub = parser.add_subparsers(dest="command", required=True)
    acc = sub.add_parser("accuracy", help="statsforecast and the pipeline on the official test of each panel")
    acc.add_argument("--panels", default=",".join(DEFAULT_PANELS), help="comma-separated panel names")
    acc.add_argument("--limit", type=int, help="a seeded sample of this many series per panel")
    acc.add_argument("--minutes", type=float, help="training minutes per family (default 5 on M3 monthly, 3 else)")
    acc.add_argument("--families", default=",".join(FAMILIES), help="comma-separated families")
    acc.add_argument("--n-jobs", type=int, default=2, help="statsforecast processes")
    acc.add_argument("--no-pipeline", action="store_true", help="the statsforecast side only")
    acc.add_argument("--statsforecast-cache", type=Path,
                     help="folder of statsforecast tables: reuse the panel's if an earlier run saved it, else "
                          "fit and save it (the results say which)")
    acc.add_argument("--reference-series", type=int, default=0,
                     help="the pipeline's own reference_max_series (0: every series; the table's statsforecast "
                          "rows are fitted here on every series either way)")
    acc.add_argument("--settings", help="extra pipeline settings as JSON (e.g. '{\"max_epochs\": 3}')")
    sc = sub.add_parser("scale", help="wall time and peak memory per step for fleets of several sizes")
    sc.add_argument("--series", default="100,1000,10000", help="comma-separated fleet sizes")
    sc.add_argument("--families", default="nhits,dlinear", help="comma-separated families")
    sc.add_argument("--minutes", type=float, default=5.0, help="training minutes per family")
    sc.add_argument("--shards", type=int, default=2, help="fleet_shards (their steps run as concurrent children)")
    sc.add_argument("--reference-series", type=int, default=2000, help="reference_max_series (0: every series)")
    sc.add_argument("--settings", help="extra pipeline settings as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("onnxcast", "torch.onnx", "onnxscript", "onnx_ir", "great_expectations"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args.families = [f for f in args.families.split(",") if f]

    command = "bench/fleet.py " + " ".join(sys.argv[1:] if argv is None else argv)
    header = {"date": dt.date.today().isoformat(), "command": command,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"}
    with tempfile.TemporaryDirectory(prefix="onnxcast-bench-fleet-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        if args.command == "accuracy":
            section = {**header, "panels": [accuracy_panel(name, args, work) for name in args.panels.split(",") if name]}
        else:
            section = {**header, "fleets": [scale_fleet(int(n), args, work) for n in args.series.split(",") if n]}
    # read at the end: the other subcommand may have written its section meanwhile
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    results[args.command] = section
    write_results(results, args.results, args.markdown)
    print(args.markdown.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
