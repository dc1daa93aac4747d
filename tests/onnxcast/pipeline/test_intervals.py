"""The forecast distribution's core: split-conformal offsets, the quantiles output in the
graph (every family, every variant), and the contract that checks it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from onnxcast.base.contract import (
    DEFAULT_QUANTILE_LEVELS,
    central_intervals,
    contract_problems,
    format_quantile_levels,
    parse_quantile_levels,
    quantile_problems,
    read_metadata,
    signature,
)
from onnxcast.base.errors import ConfigError, ExportError
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.export import export_onnx
from onnxcast.pipeline.intervals import (
    calibrate,
    conformal_quantile,
    coverage_failures,
    interval_metrics,
    offsets_from_errors,
    quantiles_from_levels,
    reference_levels,
)
from onnxcast.pipeline.models import ModelSpec, build_model

LEVELS = DEFAULT_QUANTILE_LEVELS
LOOKBACK, HORIZON, SEASON = 24, 6, 12


def seasonal_windows(n: int, noise: float, seed: int = 0, level: float = 10.0):
    rng = np.random.default_rng(seed)
    t = np.arange(n + LOOKBACK + HORIZON)
    y = (level + np.sin(2 * np.pi * t / SEASON) + rng.normal(0, noise, len(t))).astype(np.float32)
    origins = np.arange(LOOKBACK, LOOKBACK + n)
    x = np.stack([y[o - LOOKBACK:o] for o in origins])[:, :, None]
    return x, np.stack([y[o:o + HORIZON] for o in origins])


def metadata(family: str, levels=LEVELS) -> dict:
    return {"model_family": family, "lookback": LOOKBACK, "horizon": HORIZON, "freq": "h", "target": "y",
            "features": "", "precision": "fp32", "trained_until": "2020-01-01T00:00:00Z", "dataset_sha256": "0" * 64,
            "quantile_levels": format_quantile_levels(levels)}


def test_levels_parse_and_refuse_with_the_value_named():
    assert parse_quantile_levels("0.1, 0.5,0.9") == (0.1, 0.5, 0.9)
    for bad, words in (("0.1,abc", "'abc' is not a number"), ("0.5,0.1", "strictly ascending"),
                       ("0,0.5", "between 0 and 1"), ("0.1,nan", "between 0 and 1"), ("", "1 to 99")):
        with pytest.raises(ValueError, match=words):
            parse_quantile_levels(bad)
    with pytest.raises(ConfigError, match="quantile_levels: level '1.5'"):
        PipelineConfig(data_uri="x.csv", out_dir="o", quantile_levels="0.5,1.5")
    assert PipelineConfig(data_uri="x.csv", out_dir="o").levels == LEVELS


def test_central_intervals_pair_a_and_one_minus_a():
    assert central_intervals(LEVELS) == [(0, 4, 0.95), (1, 3, 0.8)]
    assert central_intervals((0.1, 0.5, 0.8)) == []  # 0.1 has no 0.9
    assert reference_levels(LEVELS) == [80, 95]


def test_conformal_quantile_keeps_each_tail_within_its_share():
    values = np.arange(1, 20, dtype=float)  # n = 19: (n + 1) * 0.9 = 18
    assert conformal_quantile(values, 0.9) == 18.0
    assert conformal_quantile(values, 0.1) == 2.0
    assert conformal_quantile(values, 0.999) == 19.0  # clipped to the sample
    assert conformal_quantile(values[:3], 0.025) == 1.0


def test_offsets_ascend_per_step_and_pool_when_few_windows():
    rng = np.random.default_rng(1)
    errors = rng.normal(0, 1, (500, HORIZON)) * np.arange(1, HORIZON + 1)  # spread grows with the step
    offsets, method = offsets_from_errors(errors, LEVELS)
    assert method == "per_step" and offsets.shape == (HORIZON, len(LEVELS))
    assert (np.diff(offsets, axis=1) >= 0).all()
    assert offsets[-1, -1] > 3 * offsets[0, -1]  # the last step's 97.5% offset is the widest
    few, method = offsets_from_errors(errors[:30], LEVELS)
    assert method == "pooled" and (np.diff(few, axis=1) >= 0).all()
    assert few[-1, -1] > few[0, -1]


@pytest.mark.parametrize("family", ["lstm", "transformer", "nhits", "dlinear"])
def test_every_family_exports_quantiles_that_match_torch_and_never_cross(family, tmp_path):
    torch.manual_seed(0)
    model = build_model(ModelSpec(family=family, n_features=1, horizon=HORIZON, lookback=LOOKBACK, season=SEASON))
    x, y = seasonal_windows(600, 0.3)
    info = calibrate(model, x, y, LEVELS)
    assert info["windows"] == 600 and info["shape"] == "per_step"
    assert abs(info["validation_coverage"]["80"] - 0.8) < 0.02  # in sample, conformal: at nominal
    path = export_onnx(model, tmp_path / "m.onnx", n_features=1, lookback=LOOKBACK, metadata=metadata(family))
    proto = onnx.load(path)
    assert not contract_problems(signature(proto)) and not quantile_problems(signature(proto), read_metadata(proto))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["forecast", "quantiles"]
    test_x, _ = seasonal_windows(40, 0.3, seed=2)
    longer = np.concatenate([test_x[:, :4], test_x], axis=1)  # the time axis stays dynamic
    for history in (test_x, test_x[:1], longer):
        forecast, quantiles = session.run(None, {"history": history})
        want_f, want_q = (t.detach().numpy() for t in model.forecast_and_quantiles(torch.from_numpy(history)))
        np.testing.assert_allclose(forecast, want_f, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(quantiles, want_q, rtol=1e-4, atol=1e-4)
        assert quantiles.shape == (len(history), HORIZON, len(LEVELS))
        assert (np.diff(quantiles, axis=-1) >= 0).all()


def test_variants_keep_the_quantiles_and_their_order(tmp_path):
    from onnxcast.pipeline.optimize import make_variants

    torch.manual_seed(0)
    model = build_model(ModelSpec(family="dlinear", n_features=1, horizon=HORIZON, lookback=LOOKBACK, season=SEASON))
    x, y = seasonal_windows(400, 0.3)
    calibrate(model, x, y, LEVELS)
    fp32 = export_onnx(model, tmp_path / "fp32.onnx", n_features=1, lookback=LOOKBACK, metadata=metadata("dlinear"))
    test_x, _ = seasonal_windows(64, 0.3, seed=3, level=1e4)  # a big level: fp16 rounds, never crosses
    for variant in make_variants(fp32, tmp_path, "dlinear"):
        session = ort.InferenceSession(str(variant.path), providers=["CPUExecutionProvider"])
        assert [o.name for o in session.get_outputs()] == ["forecast", "quantiles"], variant.name
        _, quantiles = session.run(None, {"history": test_x})
        assert (np.diff(quantiles, axis=-1) >= 0).all(), variant.name


def test_global_scale_is_equivariant():
    model = build_model(ModelSpec(family="nhits", n_features=1, horizon=HORIZON, lookback=LOOKBACK, season=SEASON,
                                  global_model=True, quantile_levels=LEVELS))
    x, _ = seasonal_windows(8, 0.3)
    history = torch.from_numpy(x)
    small, big = model.interval_scale(history), model.interval_scale(history * 1e6)
    np.testing.assert_allclose(big.numpy(), small.numpy() * 1e6, rtol=1e-5)


def test_constant_validation_windows_are_left_out_and_all_constant_is_refused():
    model = build_model(ModelSpec(family="dlinear", n_features=1, horizon=HORIZON, lookback=LOOKBACK, season=SEASON))
    x, y = seasonal_windows(300, 0.3)
    flat = np.full_like(x[:20], 5.0)
    info = calibrate(model, np.concatenate([x, flat]), np.concatenate([y, np.full_like(y[:20], 5.0)]), LEVELS)
    assert info["windows"] == 300 and info["constant_windows_left_out"] == 20
    with pytest.raises(ValueError, match="all 20 are constant"):
        calibrate(model, flat, np.full_like(y[:20], 5.0), LEVELS)


def test_exporter_refuses_quantiles_without_their_levels(tmp_path):
    model = build_model(ModelSpec(family="dlinear", n_features=1, horizon=HORIZON, lookback=LOOKBACK, season=SEASON,
                                  quantile_levels=LEVELS))
    md = metadata("dlinear")
    del md["quantile_levels"]
    with pytest.raises(ExportError, match="needs the metadata onnxcast.quantile_levels"):
        export_onnx(model, tmp_path / "m.onnx", n_features=1, lookback=LOOKBACK, metadata=md)
    assert not (tmp_path / "m.onnx").exists()
    with pytest.raises(ExportError, match="holds 5 levels, the metadata lists 3"):
        export_onnx(model, tmp_path / "m.onnx", n_features=1, lookback=LOOKBACK,
                    metadata=metadata("dlinear", (0.1, 0.5, 0.9)))


def test_contract_names_what_is_wrong_with_the_outputs():
    sig = {"inputs": [{"name": "history", "dtype": "float32", "shape": ["batch", "time", 1]}],
           "outputs": [{"name": "forecast", "dtype": "float32", "shape": ["batch", 6]},
                       {"name": "quantiles", "dtype": "float16", "shape": ["batch", 6]}]}
    assert contract_problems(sig) == ["quantiles is float16, expected float32", "quantiles has rank 2, expected 3"]
    sig["outputs"].reverse()
    assert "expected outputs 'forecast' or ['forecast', 'quantiles']" in contract_problems(sig)[0]
    assert quantile_problems(sig, {"quantile_levels": "0.9,0.1"}) == [
        "onnxcast.quantile_levels must be strictly ascending: '0.1' follows 0.9"]


def test_interval_metrics_by_hand():
    actual = np.array([[0.0, 10.0]])
    # 80%: [-1, 1] at both steps; 95%: [-2, 2]
    q = np.array([[[-2.0, -1.0, 0.0, 1.0, 2.0], [-2.0, -1.0, 0.0, 1.0, 2.0]]])
    m = interval_metrics(actual, q, LEVELS, scale=2.0)
    assert m["coverage_80"] == 0.5 and m["coverage_95"] == 0.5
    # 95% interval score: step 1: width 4; step 2: 4 + 2/0.05 * 8 = 324; mean 164, scaled by 2
    assert m["msis_95"] == pytest.approx(82.0)
    assert m["width_80"] == pytest.approx(1.0) and m["crossing"] == 0.0
    assert coverage_failures(m, 0.05) == [
        "95% interval covers 50.0% of holdout points, more than 5.0% from nominal",
        "80% interval covers 50.0% of holdout points, more than 5.0% from nominal"]
    assert coverage_failures({"coverage_80": 0.82, "coverage_95": float("nan")}, 0.05)[0].startswith("95%")


def test_statsforecast_intervals_become_quantiles_in_level_order():
    mean = np.zeros((2, 3))
    lo = {80: mean - 1, 95: mean - 2}
    hi = {80: mean + 1, 95: mean + 2}
    q = quantiles_from_levels(lo, hi, mean, LEVELS)
    assert q.shape == (2, 3, 5) and q[0, 0].tolist() == [-2, -1, 0, 1, 2]
    assert quantiles_from_levels(lo, hi, mean, (0.05, 0.5, 0.95)) is None  # no 90% interval


def test_a_coverage_miss_within_its_sampling_error_passes_and_every_central_interval_is_judged():
    # 88% at 80% is 8 points off, but its interval over ~20 independent windows holds 80%
    assert coverage_failures({"coverage_80": 0.88, "coverage_80_ci95": [0.76, 0.97]}, 0.05) == []
    assert coverage_failures({"coverage_80": 0.88, "coverage_80_ci95": [0.84, 0.92]}, 0.05) == [
        "80% interval covers 88.0% of holdout points, more than 5.0% from nominal and outside its 95% interval "
        "[84.0%, 92.0%]"]
    # custom levels: a 90% interval is judged too, and 97.5% / 98% stay apart
    levels = (0.01, 0.0125, 0.05, 0.5, 0.95, 0.9875, 0.99)
    actual = np.zeros((4, 2))
    q = np.broadcast_to(np.array([-3.0, -2.5, -1.0, 0.0, 1.0, 2.5, 3.0]), (4, 2, 7))
    m = interval_metrics(actual, q, levels, 1.0, block=1)
    assert {k for k in m if k.startswith("coverage_") and not k.endswith("ci95")} == {
        "coverage_98", "coverage_97.5", "coverage_90"}
    assert coverage_failures(m, 0.05) == [] or all("interval covers 100.0%" in f for f in coverage_failures(m, 0.05))


def test_parity_fails_when_onnx_gives_nan():
    from onnxcast.pipeline.validate import parity_on

    class NaNSession:
        def run(self, names, feeds):
            return [np.full((len(feeds["history"]), 3), np.nan, np.float32)]

    history = np.zeros((2, 5, 1), np.float32)
    got = parity_on(lambda h: np.zeros((len(h), 3)), NaNSession(), [history], rtol=1e-3, atol=1e-4)
    assert got["worst_tolerance_ratio"] == float("inf")


def test_windows_that_repeat_with_the_season_are_left_out_of_the_calibration():
    model = build_model(ModelSpec(family="dlinear", n_features=1, horizon=HORIZON, lookback=LOOKBACK, season=SEASON))
    x, y = seasonal_windows(300, 0.3)
    periodic = np.tile(np.sin(2 * np.pi * np.arange(LOOKBACK) / SEASON), (20, 1))[:, :, None].astype(np.float32) + 5
    info = calibrate(model, np.concatenate([x, periodic]), np.concatenate([y, y[:20]]), LEVELS)
    assert info["windows"] == 300 and info["constant_windows_left_out"] == 20


# --- how many independent windows a coverage rests on (issue 30) ----------------------------

def test_independent_windows_counts_non_overlapping_holdout_windows():
    from onnxcast.pipeline.intervals import independent_windows

    assert independent_windows(np.arange(25), 24) == 2  # the monthly series: 25 origins a step apart
    assert independent_windows(np.arange(0, 500, 5), 24) == 20  # 100 origins, stride 5
    assert independent_windows(np.array([40, 0, 12, 24]), 12) == 4  # any order
    assert independent_windows(np.array([], np.int64), 12) == 0


def test_a_coverage_interval_is_given_only_where_the_sample_supports_it():
    """A moving-block bootstrap of 25 origins that make two independent windows gave the issue's
    0.4-point interval; below the minimum the coverage is reported without one."""
    from onnxcast.pipeline.intervals import MIN_INDEPENDENT_WINDOWS, interval_metrics

    rng = np.random.default_rng(0)
    actual = rng.normal(size=(25, 24))
    quantiles = np.stack([np.full((25, 24), v) for v in (-1.96, -1.28, 0.0, 1.28, 1.96)], axis=-1)
    few = interval_metrics(actual, quantiles, LEVELS, 1.0, block=24, independent=2)
    assert few["independent_windows"] == 2 and "coverage_95_ci95" not in few and 0 < few["coverage_95"] < 1
    enough = interval_metrics(actual, quantiles, LEVELS, 1.0, block=24, independent=MIN_INDEPENDENT_WINDOWS)
    assert len(enough["coverage_95_ci95"]) == 2 and enough["coverage_95"] == few["coverage_95"]
