"""The ensemble family: the combination's choice on validation windows, its module and graph,
a fetched ensemble's spec, and a fleet run that trains two members and the ensemble."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from onnxcast.base.contract import read_metadata
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.ensemble import (
    WEIGHTS_MARGIN,
    build_ensemble,
    choose_combination,
    ensemble_metadata,
    fit_weights,
    simplex_grid,
    train_ensemble,
)
from onnxcast.pipeline.export import export_onnx
from onnxcast.pipeline.models import ModelSpec, build_model, combine, median_weights
from onnxcast.pipeline.sessions import onnx_session
from onnxcast.registry.fetch import FetchError, read_source_spec

LEVELS = (0.1, 0.5, 0.9)
METADATA = {"model_family": "ensemble", "lookback": 24, "horizon": 6, "freq": "MS", "target": "y", "features": "",
            "precision": "fp32", "trained_until": "2020-01-01T00:00:00Z", "dataset_sha256": "0" * 64,
            "quantile_levels": "0.1,0.5,0.9"}


def member_spec(family: str, **extra) -> ModelSpec:
    values = {"family": family, "n_features": 1, "horizon": 6, "lookback": 24, "hidden_size": 8, "num_layers": 1,
              "d_model": 8, "n_heads": 2, "season": 12, "seasons": (12,), "nonnegative": True,
              "normalisation": "recent", "global_model": True, "patch": 2 if family in ("lstm", "transformer") else 1}
    return ModelSpec(**{**values, **extra})


def trained_members(families=("nhits", "dlinear", "lstm")) -> list[tuple]:
    """``[(model, spec)]`` of members with random (not zero) corrections and calibrated-looking quantiles."""
    out = []
    for i, family in enumerate(families):
        spec = member_spec(family, quantile_levels=LEVELS)
        torch.manual_seed(i)
        model = build_model(spec, np.zeros(1), np.ones(1))
        with torch.no_grad():
            for parameter in model.core.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.1)
            model.quantile_offsets.copy_(torch.tensor([[-1.0, 0.0, 1.0]] * 6))
        out.append((model.eval(), spec))
    return out


def histories(batch: int, time: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    level = rng.uniform(1.0, 1000.0, size=(batch, 1, 1))
    season = np.sin(np.arange(time) * 2 * np.pi / 12)[None, :, None]
    return (level * (1 + 0.2 * season + 0.05 * rng.normal(size=(batch, time, 1)))).astype(np.float32)


# --- the choice of the combination ----------------------------------------------------------------


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_the_simplex_grid_holds_non_negative_weights_summing_to_one_and_every_member_alone(count):
    grid = simplex_grid(count)
    assert (grid >= 0).all() and np.allclose(grid.sum(axis=1), 1.0)
    for corner in np.eye(count):
        assert (np.abs(grid - corner).max(axis=1) < 1e-12).any()
    assert len({tuple(np.round(g, 9)) for g in grid}) == len(grid)


def test_the_weights_favour_the_member_that_forecast_the_validation_windows_better():
    rng = np.random.default_rng(0)
    y = rng.normal(100.0, 10.0, size=(400, 6))
    good, biased = y + rng.normal(0, 1.0, y.shape), y + 8.0 + rng.normal(0, 1.0, y.shape)
    forecasts = np.stack([biased, good], axis=2)
    choice = choose_combination(forecasts, y, np.ones(len(y)), ["biased", "good"])
    assert choice["combination"] == "weighted" and choice["best_member"] == "good"
    assert choice["weights"][1] >= 0.8 and sum(choice["weights"]) == pytest.approx(1.0)
    losses = choice["validation_loss"]
    assert losses["weighted"] < losses["median"] * (1 - WEIGHTS_MARGIN)
    assert losses["weighted"] <= min(losses["members"].values()) * (1 + 1e-12)


def test_the_median_is_kept_when_the_weights_do_not_beat_it_on_validation():
    rng = np.random.default_rng(1)
    y = rng.normal(100.0, 10.0, size=(300, 6))
    same = y + rng.normal(0, 2.0, y.shape)  # two members forecasting alike: no weight can do better
    choice = choose_combination(np.stack([same, same], axis=2), y, np.ones(len(y)), ["a", "b"])
    assert choice["combination"] == "median" and choice["weights"] == []
    assert choice["validation_loss"]["weighted"] == pytest.approx(choice["validation_loss"]["median"])


def test_the_fit_weighs_each_window_by_its_series_scale():
    rng = np.random.default_rng(2)
    y = rng.normal(0.0, 1.0, size=(200, 4))
    a, b = y.copy(), y.copy()
    a[:100] += 5.0  # a misses the first half of the windows, b the second
    b[100:] += 5.0
    w = np.r_[np.full(100, 10.0), np.full(100, 0.1)]  # the first half matters 100 times more
    weights, _ = fit_weights(np.stack([a, b], axis=2), y, w)
    assert weights[1] == pytest.approx(1.0)


@pytest.mark.parametrize("count", [2, 3, 4])
def test_the_median_combination_is_numpys_median(count):
    forecasts = torch.randn(5, 6, count, generator=torch.Generator().manual_seed(count))
    got = combine(forecasts, median_weights(count), median=True).numpy()
    np.testing.assert_allclose(got, np.median(forecasts.numpy(), axis=2), rtol=1e-6, atol=1e-6)


# --- the model and its graph ----------------------------------------------------------------------


@pytest.mark.parametrize("weights", [(), (0.5, 0.3, 0.2)])
def test_the_onnx_graph_forecasts_what_the_eager_combination_does(tmp_path, weights):
    members = trained_members()
    model, spec = build_ensemble(members, weights)
    x = torch.from_numpy(histories(4, 30))
    with torch.no_grad():
        each = torch.stack([m(x) for m, _ in members], dim=-1)
        expected = combine(each, model.weights, median=not weights)
        torch.testing.assert_close(model(x), expected)
    assert spec.nonnegative and spec.quantile_levels == () and [m["family"] for m in spec.members] == [
        "nhits", "dlinear", "lstm"]
    assert all(m["quantile_levels"] == () and m["normalisation"] == "recent" for m in spec.members)
    model.add_quantiles(6, len(LEVELS))
    with torch.no_grad():
        model.quantile_offsets.copy_(torch.tensor([[-2.0, 0.0, 2.0]] * 6))
    metadata = {**METADATA, **ensemble_metadata(spec)}
    path = export_onnx(model, tmp_path / "fp32.onnx", n_features=1, lookback=24, metadata=metadata)
    session = onnx_session(path)
    for batch, time in ((1, 24), (3, 40)):
        history = histories(batch, time, seed=batch)
        forecast, quantiles = session.run(None, {"history": history})
        with torch.no_grad():
            eager_forecast, eager_quantiles = model.forecast_and_quantiles(torch.from_numpy(history))
        scale = float(np.abs(eager_forecast.numpy()).max())
        np.testing.assert_allclose(forecast, eager_forecast.numpy(), rtol=0, atol=1e-5 * scale)
        np.testing.assert_allclose(quantiles, eager_quantiles.numpy(), rtol=0, atol=1e-5 * scale)
        assert (quantiles >= 0).all()
    stored = read_metadata(onnx.load(path))
    assert stored["ensemble_members"] == "nhits,dlinear,lstm"
    assert stored["ensemble_combination"] == ("weighted" if weights else "median")
    assert stored["ensemble_weights"] == ",".join(f"{w:.6g}" for w in weights)


def test_an_ensemble_rebuilt_from_its_model_json_and_state_forecasts_the_same(tmp_path):
    model, spec = build_ensemble(trained_members(("dlinear", "nhits")), (0.7, 0.3))
    torch.save(model.state_dict(), tmp_path / "model.pt")
    again = build_model(ModelSpec(**json.loads(json.dumps(spec.to_dict()))))
    again.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    x = torch.from_numpy(histories(3, 24))
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x), model(x), rtol=0, atol=0)


def fetch_source(tmp_path, spec: dict) -> str:
    folder = tmp_path / "source"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"never loaded")
    (folder / "model.json").write_text(json.dumps({"spec": spec}))
    return str(folder)


def test_a_fetched_ensemble_spec_is_checked_member_by_member(tmp_path):
    _, spec = build_ensemble(trained_members(("dlinear", "nhits")), (0.7, 0.3))
    good = json.loads(json.dumps(spec.to_dict()))
    assert [m["family"] for m in read_source_spec(fetch_source(tmp_path / "a", good))["members"]] == [
        "dlinear", "nhits"]
    bad_member = {**good, "members": [{**good["members"][0], "lookback": "24"}, good["members"][1]]}
    bad_weights = {**good, "weights": [0.9, 0.3]}
    nested = {**good, "members": [good, good["members"][1]]}
    for name, spec_dict, fragment in (("b", bad_member, "member 0: model.json spec field 'lookback' must be an integer"),
                                      ("c", bad_weights, "field 'weights' must be one number in [0, 1] a member"),
                                      ("d", nested, "must be another family")):
        with pytest.raises(FetchError) as error:
            read_source_spec(fetch_source(tmp_path / name, spec_dict))
        assert fragment in str(error.value)


def test_a_fetched_ensemble_loads_and_forecasts_as_the_one_registered(tmp_path):
    from onnxcast.registry.fetch import fetch_model

    model, spec = build_ensemble(trained_members(("dlinear", "nhits")), ())
    source = tmp_path / "source"
    source.mkdir()
    torch.save(model.state_dict(), source / "model.pt")
    choice = {"members": ["dlinear", "nhits"], "combination": "median", "weights": []}
    (source / "model.json").write_text(json.dumps({"spec": spec.to_dict(), "ensemble": choice}))
    fetched = fetch_model(str(source), tmp_path / "champion", expect={"horizon": 6})
    assert fetched.family == "ensemble"
    record = json.loads((tmp_path / "champion" / "model.json").read_text())
    assert record["ensemble"] == choice and [m["family"] for m in record["spec"]["members"]] == ["dlinear", "nhits"]
    again = build_model(ModelSpec(**record["spec"]))
    again.load_state_dict(torch.load(tmp_path / "champion" / "model.pt", weights_only=True))
    x = torch.from_numpy(histories(2, 30))
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x), model(x), rtol=0, atol=0)


def test_mlflow_params_and_tags_name_the_members_and_weights(tmp_path):
    from onnxcast.base.files import write_json
    from onnxcast.pipeline.layout import RunLayout
    from onnxcast.registry.tracking import family_params

    _, spec = build_ensemble(trained_members(("dlinear", "nhits")), (0.7, 0.3))
    layout = RunLayout(tmp_path)
    layout.family("ensemble").mkdir(parents=True)
    choice = {"members": ["dlinear", "nhits", "lstm"], "combination": "weighted", "weights": [0.7, 0.3, 0.0]}
    write_json(layout.model_json("ensemble"), {"spec": spec.to_dict(), "source": "trained", "ensemble": choice})
    params = family_params(layout, "ensemble")
    assert params["spec.members"] == "dlinear,nhits"  # the graph's members, not their whole specs
    assert params["ensemble.members"] == "dlinear,nhits,lstm" and params["ensemble.combination"] == "weighted"
    assert params["ensemble.weights"] == "0.7,0.3,0"


def test_with_fewer_than_two_trained_members_the_ensemble_is_skipped_with_the_reason(tmp_path):
    cfg = PipelineConfig(data_uri="example", out_dir=str(tmp_path), models=("nhits", "ensemble"))
    result = train_ensemble(cfg)
    assert result["skipped"] == "needs at least two trained member families, the run trained 0"
    assert json.loads((tmp_path / "models" / "ensemble" / "skipped.json").read_text())["reason"] == result["skipped"]
    assert not (tmp_path / "models" / "ensemble" / "model.json").exists()


# --- a fleet run: two members and the ensemble ----------------------------------------------------


@pytest.mark.slow
def test_a_fleet_run_trains_two_members_and_their_ensemble(tmp_path, capsys):
    """M3 monthly, 40 series, one short epoch each (about 40 s on 2 cores)."""
    sys.path.append(str(Path(__file__).parents[2]))
    from real_panels import load_panel

    from onnxcast.pipeline.checkpoint import load_model
    from onnxcast.pipeline.report import validate_report
    from onnxcast.pipeline.run import run_pipeline

    panel = load_panel("m3-monthly", limit=40, seed=3)
    data = tmp_path / "m3.csv"
    panel.frame.to_csv(data, index=False)
    cfg = PipelineConfig.from_dict(panel.settings(
        data_uri=str(data), out_dir=str(tmp_path / "run"), models=["ensemble", "dlinear", "nhits"], max_epochs=1,
        hidden_size=8, lookback=36, fleet_windows_per_epoch=500, reference_max_series=2, fleet_shards=1,
        latency_repeats=2, coverage_tolerance=0.5))
    report = run_pipeline(cfg)
    validate_report(report)
    models = {m["family"]: m for m in report["models"]}
    assert list(models) == ["dlinear", "nhits", "ensemble"]  # the ensemble after its members
    ensemble = models["ensemble"]
    assert ensemble["ensemble"]["members"] == ["dlinear", "nhits"]
    weights = ensemble["ensemble"]["weights"]
    assert ensemble["ensemble"]["combination"] == ("weighted" if weights else "median")
    assert not weights or sum(weights) == pytest.approx(1.0)
    # a convex combination's MAE is at most the worse member's, series by series
    mase = {f: m["variants"][0]["holdout"]["mae"] for f, m in models.items()}
    assert mase["ensemble"] <= max(mase["dlinear"], mase["nhits"]) + 1e-6
    fp32 = Path(cfg.out_dir) / "models" / "ensemble" / "onnx" / "fp32.onnx"
    stored = read_metadata(onnx.load(fp32))
    assert stored["model_family"] == "ensemble"
    assert stored["ensemble_members"] == ",".join(ensemble["ensemble"]["in_graph"])
    model, spec = load_model(cfg, "ensemble")
    assert spec.quantile_levels == LEVELS or spec.quantile_levels == cfg.levels
    assert {v["name"] for v in ensemble["variants"]} >= {"fp32", "fp32-opt", "int8"}
    # bench/ensemble_quantiles.py judges its quantiles against the members' combined, on the run
    sys.path.append(str(Path(__file__).parents[3] / "bench"))
    import ensemble_quantiles

    assert ensemble_quantiles.main(cfg.out_dir) == 0
    printed = capsys.readouterr().out
    assert "the ensemble's conformal quantiles: coverage 80%" in printed and "the members' quantiles combined" in printed


def test_an_ensemble_alone_is_refused_with_the_reason():
    from onnxcast.base.errors import ConfigError

    with pytest.raises(ConfigError, match="ensemble combines the other families of the run; name at least two"):
        PipelineConfig(data_uri="example", out_dir="out", models=("ensemble",))


@pytest.mark.slow
def test_a_run_with_one_member_skips_the_ensemble_and_says_why(tmp_path):
    """One series (weekly CO2), DLinear for one epoch: the run passes with DLinear alone."""
    sys.path.append(str(Path(__file__).parents[2]))
    from real_series import weekly_co2_csv

    from onnxcast.pipeline.run import run_pipeline

    cfg = PipelineConfig.from_dict({"data_uri": weekly_co2_csv(), "out_dir": str(tmp_path / "run"), "horizon": 12,
                                    "lookback": 56, "max_epochs": 1, "models": ["ensemble", "dlinear"],
                                    "latency_repeats": 2, "coverage_tolerance": 0.5})
    report = run_pipeline(cfg)
    assert [m["family"] for m in report["models"]] == ["dlinear"]
    assert report["skipped"] == [{"family": "ensemble",
                                  "reason": "needs at least two trained member families, the run trained 1 (dlinear)"}]
    assert not (tmp_path / "run" / "models" / "ensemble" / "onnx").exists()
