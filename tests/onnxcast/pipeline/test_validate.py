import numpy as np
import pytest
import torch

from onnxcast.pipeline.export import export_onnx
from onnxcast.pipeline.intervals import coverage_failures
from onnxcast.pipeline.models import ModelSpec, build_model
from onnxcast.pipeline.sessions import onnx_session
from onnxcast.pipeline.validate import check_parity, measure_latency, parity_shapes, torch_runner

META = {"model_family": "lstm", "lookback": 16, "horizon": 4, "freq": "h", "target": "y", "features": "",
        "precision": "fp32", "trained_until": "t", "dataset_sha256": "s"}


@pytest.fixture(scope="module")
def model_and_session(tmp_path_factory):
    torch.manual_seed(1)
    model = build_model(ModelSpec(family="lstm", n_features=1, horizon=4, lookback=16, hidden_size=8,
                                  num_layers=1, season=4), np.array([50.0]), np.array([10.0])).eval()
    path = export_onnx(model, tmp_path_factory.mktemp("v") / "m.onnx", n_features=1, lookback=16, metadata=META)
    return model, onnx_session(path)


def series(n=400):
    return (50 + 10 * np.sin(np.arange(n) / 2.0)).astype(np.float32)[:, None]


def test_parity_passes_for_the_exported_model_at_every_shape(model_and_session):
    model, session = model_and_session
    shapes = parity_shapes(lookback=16, season=4)
    assert len({b for b, _ in shapes}) >= 3 and len({t for _, t in shapes}) >= 3
    result = check_parity(torch_runner(model), session, series(), shapes, rtol=1e-3, atol=1e-4)
    assert result["worst_tolerance_ratio"] <= 1.0
    assert [(r["batch"], r["time"]) for r in result["shapes"]] == shapes


def test_parity_catches_a_model_that_drifted(model_and_session):
    model, session = model_and_session
    drifted = build_model(ModelSpec(family="lstm", n_features=1, horizon=4, lookback=16, hidden_size=8,
                                    num_layers=1, season=4), np.array([50.0]), np.array([10.0])).eval()
    drifted.load_state_dict(model.state_dict())
    with torch.no_grad():
        drifted.core.head.bias.add_(0.01)  # a hundredth of a standard deviation
    result = check_parity(torch_runner(drifted), session, series(), [(4, 16)], rtol=1e-3, atol=1e-4)
    assert result["worst_tolerance_ratio"] > 1.0


def test_latency_reports_percentiles_per_batch(model_and_session):
    _, session = model_and_session
    inputs = {1: np.ones((1, 16, 1), np.float32), 64: np.ones((64, 16, 1), np.float32)}
    figures = measure_latency(lambda x: session.run(None, {"history": x}), inputs, repeats=5, warmup=1)
    assert set(figures) == {"batch1_p50", "batch1_p95", "batch64_p50", "batch64_p95"}
    assert 0 < figures["batch1_p50"] <= figures["batch1_p95"]


def _tiny_series(n=400):
    from onnxcast.pipeline.fleet_data import FleetData

    stamps = (np.datetime64("2024-01-01T00:00:00") + np.arange(n) * np.timedelta64(1, "h")).astype("datetime64[ns]")
    return FleetData.one(series(n), stamps, series_id="y", columns=("y",), freq="h", season=4,
                         source="mem", sha256="0" * 64)


@pytest.mark.parametrize("broken", ["unknown_op", "not_onnx"])
def test_an_fp32_that_onnx_runtime_cannot_load_fails_the_family_by_name(model_and_session, tmp_path, broken):
    """Issue 9: this raised KeyError('beats_seasonal_naive') and the failure never reached ``failures``."""
    import onnx
    from onnx import helper

    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.fleet_data import split_fleet
    from onnxcast.pipeline.validate import OverOrigins, validate_family_variants

    model, _ = model_and_session
    onnx_dir = tmp_path / "models" / "lstm" / "onnx"
    onnx_dir.mkdir(parents=True)
    if broken == "unknown_op":
        graph = helper.make_graph([helper.make_node("Frobnicate", ["history"], ["forecast"], domain="x.y")], "g",
                                  [helper.make_tensor_value_info("history", onnx.TensorProto.FLOAT, ["b", "t", 1])],
                                  [helper.make_tensor_value_info("forecast", onnx.TensorProto.FLOAT, ["b", 4])])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("x.y", 1)]),
                  onnx_dir / "fp32.onnx")
    else:
        (onnx_dir / "fp32.onnx").write_bytes(b"this is no protobuf \xff\xfe")
    export_onnx(model, onnx_dir / "fp32-opt.onnx", n_features=1, lookback=16, metadata=META)
    cfg = PipelineConfig(data_uri="mem", out_dir=str(tmp_path), lookback=16, horizon=4, latency_repeats=2)
    data = _tiny_series()
    split = split_fleet(data.lengths, cfg)
    entry = validate_family_variants(cfg, "lstm", model, [{"name": "fp32", "path": "fp32.onnx"},
                                                          {"name": "fp32-opt", "path": "fp32-opt.onnx"}],
                                     OverOrigins(cfg, data, split))
    assert entry["gates_passed"] is False
    assert entry["fp32_holdout_mae"] is None
    assert len(entry["failures"]) == 1
    assert entry["failures"][0].startswith("fp32 does not run with ONNX Runtime's CPU provider: ")
    fp32, opt = entry["variants"]
    assert fp32["eligible"] is False and fp32["holdout"] is None and "runs_on_cpu" in fp32["gates"]
    # the working variant is still measured, but without fp32 it cannot prove its accuracy budget
    assert opt["holdout"] is not None and opt["gates"]["parity"]["passed"]
    assert opt["gates"]["accuracy_vs_fp32"]["passed"] is False and not opt["eligible"]


# --- the baseline gate: better by a margin, one verdict per family ---------------------------

def _daily_series(n=400, seed=0):
    """A daily series with an exact weekly cycle: seasonal naive 7 is the best baseline."""
    from onnxcast.pipeline.fleet_data import FleetData

    rng = np.random.default_rng(seed)
    t = np.arange(n)
    y = (200 + 30 * np.sin(2 * np.pi * t / 7) + 10 * np.cos(4 * np.pi * t / 7) + rng.normal(0, 1, n)).astype(np.float32)
    stamps = (np.datetime64("2020-01-01T00:00:00") + np.arange(n) * np.timedelta64(1, "D")).astype("datetime64[ns]")
    return FleetData.one(y[:, None], stamps, series_id="y", columns=("y",), freq="D", season=7, source="mem",
                         sha256="0" * 64)


def test_an_untrained_model_equal_to_its_anchor_does_not_beat_the_baseline(tmp_path):
    """Issue 18: an untrained LSTM (best epoch 0: its seasonal-naive anchor) was eligible and
    selected, its MAE 2.3043603969 "below" the baseline's 2.3043604084 by float32 rounding."""
    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.fleet_data import split_fleet
    from onnxcast.pipeline.validate import OverOrigins, baselines_for, validate_family_variants

    data = _daily_series()
    cfg = PipelineConfig(data_uri="mem", out_dir=str(tmp_path), lookback=14, horizon=4, latency_repeats=2)
    split = split_fleet(data.lengths, cfg)
    baselines = baselines_for(cfg, data, split)
    assert baselines["best"] == "seasonal_naive_7"
    model = build_model(ModelSpec(family="lstm", n_features=1, horizon=4, lookback=14, hidden_size=8, num_layers=1,
                                  season=7), data.values.mean(axis=0), data.values.std(axis=0)).eval()
    onnx_dir = tmp_path / "models" / "lstm" / "onnx"
    export_onnx(model, onnx_dir / "fp32.onnx", n_features=1, lookback=14, metadata={**META, "lookback": 14})
    entry = validate_family_variants(cfg, "lstm", model, [{"name": "fp32", "path": "fp32.onnx"}],
                                     OverOrigins(cfg, data, split, baselines))
    fp32 = entry["variants"][0]
    # the same forecasts as the baseline, up to float32 rounding of the scaling inside the graph
    assert fp32["holdout"]["mae"] == pytest.approx(baselines["seasonal_naive"]["mae"], rel=1e-5)
    assert not fp32["eligible"] and not entry["gates_passed"]
    gate = fp32["gates"]["beats_seasonal_naive"]
    assert gate["passed"] is False and gate["threshold"] == pytest.approx(0.99 * baselines["seasonal_naive"]["mae"])
    assert gate["paired_test"]["significant"] is False
    assert entry["failures"] == [next(f for f in entry["failures"] if f.startswith("fp32 holdout MAE "))]
    assert "by the 1% margin" in entry["failures"][0]
    # a model without a quantiles output (from before forecast distributions): no interval gates
    assert fp32["holdout"]["intervals"] is None and "interval_coverage" not in fp32["gates"]
    assert fp32["intervals_note"].startswith("no 'quantiles' output") and entry["torch"]["holdout"]["intervals"] is None


def _measured(name: str, mae: float) -> dict:
    return {"name": name, "holdout": {"mae": mae}, "size_bytes": 100, "parity_max_abs_diff": 0.0,
            "latency_ms": {"batch1_p50": 1.0, "batch64_p50": 10.0},
            "gates": {"parity": {"passed": True, "value": 0.1, "threshold": 1.0}} if name in ("fp32", "fp32-opt") else {}}


def test_float32_rounding_below_the_baseline_is_not_beating_it():
    from onnxcast.pipeline.validate import judge_variants

    entries = [_measured("fp32", 2.3043603969)]
    failures = judge_variants(entries, baseline_mae=2.3043604084, torch_latency={"batch1_p50": 2.0},
                              accuracy_budget=0.01)
    assert not entries[0]["eligible"]
    assert failures == ["fp32 holdout MAE 2.304 does not beat the best baseline (seasonal naive) 2.304 by the "
                        "1% margin (needs below 2.281)"]


@pytest.mark.parametrize("variant", ["fp16", "int8", "fp32-opt"])
def test_a_variant_of_a_family_whose_fp32_failed_is_never_eligible(variant):
    """Issue 18: fp16 was eligible because its rounding noise landed 0.007 below the threshold
    its fp32 missed."""
    from onnxcast.pipeline.validate import judge_variants

    baseline = 370.99583239433093
    entries = [_measured("fp32", baseline), _measured(variant, baseline - 0.007)]
    failures = judge_variants(entries, baseline_mae=baseline, torch_latency={"batch1_p50": 2.0},
                              accuracy_budget=0.01)
    assert failures and not entries[0]["eligible"] and not entries[1]["eligible"]
    assert entries[1]["gates"]["accuracy_vs_fp32"]["passed"]  # within budget: the family verdict excludes it
    reason = next(r for r in entries[1]["reasons"] if r.startswith("beats_seasonal_naive"))
    assert reason == "beats_seasonal_naive: 371 vs threshold 367.3 (fp32's verdict: one per family)"
    assert "370.99583239433093" not in " ".join(failures + entries[1]["reasons"])


def test_a_family_clearly_better_than_the_baseline_passes_with_all_its_variants():
    from onnxcast.pipeline.validate import judge_variants

    entries = [_measured("fp32", 300.0), _measured("fp32-opt", 300.0), _measured("int8", 301.0)]
    assert judge_variants(entries, baseline_mae=371.0, torch_latency={}, accuracy_budget=0.01) == []
    assert [e["eligible"] for e in entries] == [True, True, True]


# --- forecast distributions: parity, intervals and their gates -------------------------------

LEVELS = (0.025, 0.1, 0.5, 0.9, 0.975)


def _calibrated(data, cfg, split, lookback=14):
    from onnxcast.base.contract import format_quantile_levels
    from onnxcast.pipeline.data import windows
    from onnxcast.pipeline.intervals import calibrate

    torch.manual_seed(0)
    model = build_model(ModelSpec(family="lstm", n_features=1, horizon=4, lookback=lookback, hidden_size=8,
                                  num_layers=1, season=7), data.values.mean(axis=0), data.values.std(axis=0)).eval()
    x, y = windows(data.values, lookback, 4, int(split.train_end[0]), int(split.validation_end[0]))[:2]
    calibrate(model, x, y, LEVELS)
    return model, {**META, "lookback": lookback, "quantile_levels": format_quantile_levels(LEVELS)}


def test_a_calibrated_model_is_judged_on_its_intervals_in_onnx_and_in_torch(tmp_path):
    import shutil

    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.fleet_data import split_fleet
    from onnxcast.pipeline.validate import OverOrigins, baselines_for, validate_family_variants

    data = _daily_series(600)
    cfg = PipelineConfig(data_uri="mem", out_dir=str(tmp_path), lookback=14, horizon=4, latency_repeats=2,
                         baseline_margin=0.0)
    split = split_fleet(data.lengths, cfg)
    model, meta = _calibrated(data, cfg, split)
    onnx_dir = tmp_path / "models" / "lstm" / "onnx"
    export_onnx(model, onnx_dir / "fp32.onnx", n_features=1, lookback=14, metadata=meta)
    shutil.copy(onnx_dir / "fp32.onnx", onnx_dir / "fp32-opt.onnx")
    baselines = baselines_for(cfg, data, split)
    entry = validate_family_variants(cfg, "lstm", model, [{"name": "fp32", "path": "fp32.onnx"},
                                                          {"name": "fp32-opt", "path": "fp32-opt.onnx"}],
                                     OverOrigins(cfg, data, split, baselines))
    fp32, opt = entry["variants"]
    intervals = fp32["holdout"]["intervals"]
    assert intervals["levels"] == list(LEVELS) and intervals["crossing"] == 0.0
    assert 0 < intervals["coverage_80"] <= intervals["coverage_95"] <= 1
    torch_intervals = entry["torch"]["holdout"]["intervals"]
    assert torch_intervals["msis_95"] == pytest.approx(intervals["msis_95"], rel=1e-4)
    assert fp32["parity_outputs"] == ["forecast", "quantiles"]
    assert all(r["quantiles_tolerance_ratio"] <= 1.0 for r in fp32["parity_shapes"])
    coverage = fp32["gates"]["interval_coverage"]
    assert coverage["passed"] == (coverage_failures(intervals, 0.05) == [])
    assert set(coverage["ci95"]) == {"80", "95"} and len(intervals["coverage_80_ci95"]) == 2
    assert coverage["coverage"] == {"80": intervals["coverage_80"], "95": intervals["coverage_95"]}
    assert "interval_accuracy_vs_fp32" not in fp32["gates"]
    assert opt["gates"]["interval_accuracy_vs_fp32"] == {"passed": True, "value": 0.0, "threshold": 0.01,
                                                         "losses": {"msis_95": 0.0, "pinball": 0.0}}
    naive = baselines["seasonal_naive"]["intervals"]
    assert entry["fp32_vs"]["seasonal_naive_7"]["msis_95_ratio"] == pytest.approx(intervals["msis_95"] / naive["msis_95"])


def test_parity_covers_the_quantiles_output(tmp_path):
    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.fleet_data import split_fleet

    data = _daily_series(600)
    cfg = PipelineConfig(data_uri="mem", out_dir=str(tmp_path), lookback=14, horizon=4)
    model, meta = _calibrated(data, cfg, split_fleet(data.lengths, cfg))
    session = onnx_session(export_onnx(model, tmp_path / "m.onnx", n_features=1, lookback=14, metadata=meta))
    shapes = parity_shapes(lookback=14, season=7)
    same = check_parity(torch_runner(model, quantiles=True), session, data.values, shapes, rtol=1e-3, atol=1e-4)
    assert same["worst_tolerance_ratio"] <= 1.0 and "quantiles_max_abs_diff" in same["shapes"][0]
    with torch.no_grad():
        model.quantile_offsets[:, -1] += 1.0  # the 97.5% quantile moved, the forecast did not
    forecast_only = check_parity(torch_runner(model), session, data.values, shapes, rtol=1e-3, atol=1e-4)
    both = check_parity(torch_runner(model, quantiles=True), session, data.values, shapes, rtol=1e-3, atol=1e-4)
    assert forecast_only["worst_tolerance_ratio"] <= 1.0 < both["worst_tolerance_ratio"]


def _with_intervals(name: str, mae: float, coverage_80=0.8, coverage_95=0.95, msis_95=4.0, pinball=0.1) -> dict:
    entry = _measured(name, mae)
    entry["holdout"]["intervals"] = {"coverage_80": coverage_80, "coverage_95": coverage_95, "msis_80": 2.0,
                                     "msis_95": msis_95, "pinball": pinball, "levels": list(LEVELS)}
    return entry


def test_an_fp32_whose_intervals_miss_their_coverage_fails_the_family_when_strict():
    from onnxcast.pipeline.validate import judge_variants

    entries = [_with_intervals("fp32", 300.0, coverage_80=0.893), _with_intervals("fp32-opt", 300.0, coverage_80=0.893)]
    failures = judge_variants(entries, baseline_mae=371.0, torch_latency={}, accuracy_budget=0.01,
                              coverage_tolerance=0.05, strict_intervals=True)
    assert failures == ["fp32 80% interval covers 89.3% of holdout points, more than 5.0% from nominal",
                        "fp32-opt 80% interval covers 89.3% of holdout points, more than 5.0% from nominal"]
    gate = entries[0]["gates"]["interval_coverage"]
    assert gate["passed"] is False and gate["value"] == pytest.approx(0.093) and gate["threshold"] == 0.05
    assert entries[0]["reasons"] == ["interval_coverage: 80% interval covers 89.3% of holdout points, more than "
                                     "5.0% from nominal"]
    # a wider tolerance passes the same figures: the setting is what decides
    entries = [_with_intervals("fp32", 300.0, coverage_80=0.893)]
    assert judge_variants(entries, baseline_mae=371.0, torch_latency={}, accuracy_budget=0.01,
                          coverage_tolerance=0.1, strict_intervals=True) == []


def test_by_default_a_coverage_miss_is_reported_and_the_forecasts_stay_eligible():
    """Issue 30: intervals alone refused every family of a monthly series whose forecasts beat the
    seasonal naive by a third. Now the miss is recorded (enforced: false) and the family's
    intervals are marked for recalibration (one series) or shipping marked (a fleet)."""
    from onnxcast.pipeline.validate import interval_verdict, judge_variants

    entries = [_with_intervals("fp32", 300.0, coverage_80=0.893), _with_intervals("fp32-opt", 300.0, coverage_80=0.893)]
    assert judge_variants(entries, baseline_mae=371.0, torch_latency={}, accuracy_budget=0.01,
                          coverage_tolerance=0.05) == []
    gate = entries[0]["gates"]["interval_coverage"]
    assert gate["passed"] is False and gate["judged"] is True and gate["enforced"] is False
    assert all(e["eligible"] and e["reasons"] == [] for e in entries)
    verdict = interval_verdict(entries)
    assert verdict["status"] == "uncalibrated"
    assert verdict["missed"] == ["80% interval covers 89.3% of holdout points, more than 5.0% from nominal"]
    assert [e["intervals_status"] for e in entries] == ["uncalibrated", "uncalibrated"]


@pytest.mark.parametrize("strict", [False, True])
def test_a_coverage_on_too_few_independent_windows_is_reported_not_judged(strict):
    """The issue's gate: 86.2% at 95% 'outside its 95% interval [85.8%, 86.2%]' on 25 origins of a
    24-step horizon, two independent windows: not judged, even when strict."""
    from onnxcast.pipeline.validate import interval_verdict, judge_variants

    entries = [_with_intervals("fp32", 300.0, coverage_95=0.862), _with_intervals("fp32-opt", 300.0, coverage_95=0.862)]
    for entry in entries:
        entry["holdout"]["intervals"].update(independent_windows=2)
    assert judge_variants(entries, baseline_mae=371.0, torch_latency={}, accuracy_budget=0.01,
                          coverage_tolerance=0.05, strict_intervals=strict) == []
    gate = entries[0]["gates"]["interval_coverage"]
    assert gate["passed"] is True and gate["judged"] is False and gate["failures"] == []
    assert gate["note"] == ("not judged: 2 independent holdout window(s), fewer than the 20 a coverage needs to "
                            "refuse anything")
    assert all(e["eligible"] for e in entries)
    verdict = interval_verdict(entries)
    assert verdict["status"] == "not_judged" and verdict["coverage"]["95"] == 0.862
    assert verdict["independent_windows"] == 2 and verdict["min_independent_windows"] == 20


@pytest.mark.parametrize("variant", ["int8", "fp16"])
def test_an_edge_variant_off_coverage_or_over_the_interval_budget_is_not_eligible(variant):
    from onnxcast.pipeline.validate import judge_variants

    fp32 = _with_intervals("fp32", 300.0, msis_95=4.0, pinball=0.1)
    wide = _with_intervals(variant, 300.0, msis_95=4.0 * 1.02, pinball=0.1)  # msis 2% worse, budget 1%
    off = _with_intervals(variant, 300.0, coverage_95=0.85)
    fine = _with_intervals(variant, 300.0, msis_95=4.02, pinball=0.1005)
    assert judge_variants([fp32, wide], baseline_mae=371.0, torch_latency={}, accuracy_budget=0.01) == []
    gate = wide["gates"]["interval_accuracy_vs_fp32"]
    assert not wide["eligible"] and gate["passed"] is False and gate["value"] == pytest.approx(0.02)
    assert gate["losses"]["pinball"] == pytest.approx(0.0)
    assert wide["reasons"] == ["interval_accuracy_vs_fp32: 0.02 vs threshold 0.01"]
    assert judge_variants([fp32, off], baseline_mae=371.0, torch_latency={}, accuracy_budget=0.01) == []
    assert not off["eligible"] and off["reasons"][0].startswith("interval_coverage: 95% interval covers 85.0%")
    assert judge_variants([fp32, fine], baseline_mae=371.0, torch_latency={}, accuracy_budget=0.01) == []
    assert fine["eligible"] and fp32["eligible"]


def test_entries_without_intervals_get_no_interval_gates():
    """The benchmark and the fleet call judge_variants with point figures only."""
    from onnxcast.pipeline.validate import judge_variants

    entries = [_measured("fp32", 300.0), _measured("int8", 300.0)]
    assert judge_variants(entries, baseline_mae=371.0, torch_latency={}, accuracy_budget=0.01) == []
    assert not any(k.startswith("interval") for e in entries for k in e["gates"])
