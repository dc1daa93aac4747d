"""Global models (fleet mode, docs/design/fleet.md section 3) on the M1/M3 panels."""

import hashlib
import json
import tracemalloc

import numpy as np
import pytest
import torch

from onnxcast.base.contract import read_metadata
from onnxcast.pipeline.checkpoint import load_model
from onnxcast.pipeline.config import MODEL_FAMILIES, PipelineConfig
from onnxcast.pipeline.fleet_data import FleetData, split_fleet
from onnxcast.pipeline.fleet_train import (
    WindowSampler,
    gather,
    series_weights,
    train_global,
    validation_windows,
)
from onnxcast.pipeline.metrics import mase_scale
from onnxcast.pipeline.models import ModelSpec, build_model, torch_threads
from onnxcast.pipeline.run import export_family
from onnxcast.pipeline.training import train_sampled, weighted_loss
from tests.real_panels import load_panel

LOOKBACK, HORIZON, SEASON = 36, 18, 12


def fleet_of(panel) -> FleetData:
    """The panel's long table as a FleetData (what the data gate saves), built directly."""
    import pandas as pd

    frame = panel.frame.sort_values(["unique_id", "ds"], kind="stable")
    ids, counts = np.unique(frame["unique_id"].to_numpy(dtype=str), return_counts=True)
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    values = frame["y"].to_numpy(dtype=np.float32)[:, None]
    starts = pd.to_datetime(frame["ds"].to_numpy()[offsets[:-1]]).as_unit("ns").asi8.astype(np.int64)
    return FleetData(values=values, offsets=offsets, starts=starts, ids=tuple(ids), columns=("y",),
                     freq=panel.freq, season=panel.season, source=panel.name,
                     sha256=hashlib.sha256(values.tobytes()).hexdigest())


@pytest.fixture(scope="module")
def m3():
    panel = load_panel("m3-monthly", limit=200)
    cfg = PipelineConfig.from_dict({"data_uri": "x", "out_dir": "unused", **panel.settings()})
    fleet = fleet_of(panel)
    return panel, fleet, split_fleet(fleet.lengths, cfg)


def sampler(m3, power=0.5, seed=0):
    _, fleet, split = m3
    return WindowSampler(fleet, split, LOOKBACK, HORIZON, season=SEASON, power=power, seed=seed)


def within_binomial(counts, p, n):
    """Every count within 5 standard deviations of its binomial expectation."""
    expected = n * p
    return np.all(np.abs(counts - expected) <= 5 * np.sqrt(n * p * (1 - p)) + 1)


@pytest.mark.parametrize("power", [0.0, 1.0])
def test_series_are_drawn_uniformly_at_power_0_and_in_proportion_to_their_windows_at_power_1(m3, power):
    s = sampler(m3, power=power)
    n = 200_000
    series, origins = s.draw(n)
    counts = np.bincount(series, minlength=len(s.n_origins))
    p = np.full(len(counts), 1 / len(counts)) if power == 0 else s.n_origins / s.n_origins.sum()
    assert within_binomial(counts, p, n)
    # origins stay in the training segment: a season of context, targets before validation
    _, _, split = m3
    assert origins.min() >= SEASON
    assert np.all(origins + HORIZON <= split.train_end[series])


def test_histories_before_the_series_start_repeat_its_first_row(m3):
    _, fleet, split = m3
    series = np.array([0, 1, 2])
    origins = np.array([SEASON, SEASON + 3, 40])
    x, y = gather(fleet, series, origins, LOOKBACK, HORIZON)
    for k, (i, o) in enumerate(zip(series, origins, strict=True)):
        target = fleet.target(i)
        pad = max(LOOKBACK - o, 0)
        assert np.all(x[k, :pad, 0] == target[0])
        np.testing.assert_array_equal(x[k, pad:, 0], target[max(o - LOOKBACK, 0):o])
        np.testing.assert_array_equal(y[k], target[o:o + HORIZON])


def test_batches_are_deterministic_with_the_seed_and_weighted_by_the_series_scale(m3):
    a, b, c = sampler(m3, seed=3), sampler(m3, seed=3), sampler(m3, seed=4)
    for _ in range(3):
        xa, ya, wa = a.batch(32)
        xb, yb, wb = b.batch(32)
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(wa, wb)
    assert not np.array_equal(a.batch(32)[0], c.batch(32)[0])
    assert xa.shape == (32, LOOKBACK, 1) and ya.shape == (32, HORIZON) and xa.dtype == ya.dtype == wa.dtype == np.float32
    _, fleet, split = m3
    expected = 1 / mase_scale(fleet.target(5)[: split.train_end[5]].astype(np.float64), SEASON)
    assert series_weights(fleet, split, SEASON)[5] == pytest.approx(expected, rel=1e-6)


def test_the_sampler_draws_the_series_generator_choice_drew(m3):
    """Issue 23: the sampler draws series from its cumulative weights (Generator.choice summed
    and checked all of them on every batch); a seed still draws the windows it drew before."""
    drawn = sampler(m3, seed=11)
    rng = np.random.default_rng(11)
    for _ in range(20):
        series, origins = drawn.draw(64)
        expected = rng.choice(len(drawn.p), size=64, p=drawn.p)
        np.testing.assert_array_equal(series, expected)
        np.testing.assert_array_equal(
            origins, drawn.min_context + np.floor(rng.random(64) * drawn.n_origins[expected]).astype(np.int64))


def test_batches_from_a_big_fleet_never_materialise_its_windows():
    # layout only (10,000 series x 1,000 points, 40 MB): the values are irrelevant here
    n, length = 10_000, 1_000
    values = np.linspace(1, 2, n * length, dtype=np.float32)[:, None]
    fleet = FleetData(values=values, offsets=np.arange(n + 1, dtype=np.int64) * length,
                      starts=np.zeros(n, dtype=np.int64), ids=tuple(f"s{i:05d}" for i in range(n)), columns=("y",),
                      freq="h", season=24, source="layout", sha256="")
    cfg = PipelineConfig.from_dict({"data_uri": "x", "out_dir": "unused", "series_column": "id", "horizon": 24,
                                    "lookback": 168})
    split = split_fleet(fleet.lengths, cfg)
    s = WindowSampler(fleet, split, 168, 24, season=24, power=0.5, seed=0)
    tracemalloc.start()
    for _ in range(5):
        s.batch(256)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # one batch: 256 x 168 rows (int64 indices 344 kB, float32 values 172 kB); all windows would be 6.7 GB
    assert peak < 4 * 1024**2


def test_validation_windows_are_the_horizon_before_the_holdout_of_sampled_series(m3):
    _, fleet, split = m3
    x, y, w = validation_windows(fleet, split, LOOKBACK, HORIZON, season=SEASON, max_series=50, seed=0)
    assert x.shape == (50, LOOKBACK, 1) and y.shape == (50, HORIZON) and w.shape == (50,)
    all_x, all_y, _ = validation_windows(fleet, split, LOOKBACK, HORIZON, season=SEASON, max_series=10_000, seed=0)
    assert len(all_y) == fleet.n_series
    i = int(np.argmax(split.train_end))  # a history without padding
    target = fleet.target(i)
    np.testing.assert_array_equal(all_y[i], target[split.validation_end[i] - HORIZON: split.validation_end[i]])
    np.testing.assert_array_equal(all_x[i, :, 0], target[split.train_end[i] - LOOKBACK: split.train_end[i]])


def test_the_weighted_loss_is_the_mean_squared_scaled_error():
    spec = ModelSpec(family="dlinear", n_features=1, horizon=4, lookback=8, season=2, global_model=True)
    torch.manual_seed(0)
    model = build_model(spec, np.zeros(1), np.ones(1)).eval()
    x = torch.arange(24, dtype=torch.float32).reshape(3, 8, 1) ** 1.5
    y = torch.tensor([[1.0, 2, 3, 4], [10, 20, 30, 40], [0, 0, 0, 0]])
    w = torch.tensor([0.5, 0.01, 2.0])
    with torch.no_grad():
        pred = model(x).numpy()
        mse = float(weighted_loss(model, x, y, w))
        mae = float(weighted_loss(model, x, y, w, "mae"))
    scaled = (pred - y.numpy()) * w.numpy()[:, None]
    assert mse == pytest.approx(float(np.mean(scaled**2)), rel=1e-6)
    assert mae == pytest.approx(float(np.mean(np.abs(scaled))), rel=1e-6)


def test_train_sampled_is_deterministic_and_beats_its_anchor(m3):
    _, fleet, split = m3
    validation = validation_windows(fleet, split, LOOKBACK, HORIZON, season=SEASON, max_series=200, seed=0)
    states, results = [], []
    for _ in range(2):
        spec = ModelSpec(family="dlinear", n_features=1, horizon=HORIZON, lookback=LOOKBACK, season=SEASON,
                         seasons=(SEASON,), global_model=True, n_series=fleet.n_series)
        torch.manual_seed(0)
        model = build_model(spec, np.zeros(1), np.ones(1))
        with torch_threads(1):  # two threads on shared cores: up to 30x slower (docs/performance.md)
            results.append(train_sampled(model, sampler(m3), validation, windows_per_epoch=2_000, max_epochs=2,
                                         max_minutes=1, patience=5, batch_size=64, learning_rate=2e-3, seed=0))
        states.append(model.state_dict())
    for key in states[0]:
        torch.testing.assert_close(states[0][key], states[1][key], rtol=0, atol=0)
    assert results[0].best_validation_loss < results[0].initial_validation_loss


@pytest.mark.parametrize("family", [f for f in MODEL_FAMILIES if f != "ensemble"])  # ensemble: test_ensemble.py
def test_a_global_model_is_scale_equivariant_on_series_of_any_level(family):
    # M1 monthly levels range from 0.3 to millions: forecast(c * x) must be c * forecast(x)
    fleet = fleet_of(load_panel("m1-monthly"))
    x = gather(fleet, np.arange(fleet.n_series), fleet.lengths - HORIZON, LOOKBACK, HORIZON)[0]
    spec = ModelSpec(family=family, n_features=1, horizon=HORIZON, lookback=LOOKBACK, hidden_size=16, num_layers=1,
                     d_model=16, n_heads=2, season=SEASON, seasons=(SEASON,), global_model=True,
                     n_series=fleet.n_series)
    torch.manual_seed(0)
    model = build_model(spec, np.zeros(1), np.ones(1)).eval()
    with torch.no_grad():
        for parameter in model.core.parameters():  # a correction that is not zero (untrained heads are)
            parameter.add_(torch.randn_like(parameter) * 0.1)
        small = model(torch.from_numpy(x)).double().numpy()
        big = model(torch.from_numpy(x * np.float32(1e6))).double().numpy()
    spread = x[:, :, 0].astype(np.float64).std(axis=1)
    deviation = np.abs(big / 1e6 - small).max(axis=1) / spread  # in units of each window's spread
    assert deviation.max() < 1e-3, f"series {fleet.ids[int(deviation.argmax())]}: {deviation.max():.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("family", ["nhits", "dlinear"])
def test_train_global_saves_a_global_model_and_exports_its_fleet_metadata(tmp_path, family):
    panel = load_panel("m3-monthly", limit=150)
    cfg = PipelineConfig.from_dict({"data_uri": "x", "out_dir": str(tmp_path), "max_epochs": 2,
                                    "fleet_windows_per_epoch": 1_000, **panel.settings()})
    fleet = fleet_of(panel)
    fleet.save(cfg.layout.fleet)
    result = train_global(cfg, family)
    assert result["family"] == family and 1 <= result["epochs"] <= 2
    saved = json.loads(cfg.layout.model_json(family).read_text())
    assert saved["spec"]["global_model"] is True and saved["spec"]["n_series"] == 150
    assert saved["source"] == "trained" and saved["fleet"]["series"] == 150
    model, spec = load_model(cfg, family)
    assert spec.global_model and model.relative_eps
    import onnx

    metadata = read_metadata(onnx.load(export_family(cfg, family)))
    assert metadata["global"] == "true" and metadata["n_series"] == "150"
    assert metadata["series_column"] == "unique_id" and metadata["dataset_sha256"] == fleet.sha256
    assert metadata["trained_until"].startswith("2000-01-01")


def test_the_fleet_anchors_on_the_season_whose_naive_forecast_was_best_in_training(m3):
    from onnxcast.pipeline.fleet_train import anchor_season

    _, fleet, split = m3
    # M3 monthly: last month's value (period 1) beat last year's month (12) on the training
    # segments of this sample, in mean scaled MAE; a period the lookback cannot hold never wins
    assert anchor_season(fleet, split, (12, 1), HORIZON, LOOKBACK, sample=100, seed=0) == 1
    assert anchor_season(fleet, split, (12, 24), HORIZON, LOOKBACK, sample=100, seed=0) == 12
