import numpy as np
import pytest
import torch

from onnxcast.pipeline.config import MODEL_FAMILIES
from onnxcast.pipeline.metrics import seasonal_naive
from onnxcast.pipeline.models import WINDOW_FAMILIES, ModelSpec, build_model
from onnxcast.pipeline.seasons import model_seasons

# an ensemble is built from trained members; base, the pretrained family, has its own tests
# (test_pretrained.py): it is scale-free by design (no fitted scaler) and its net is not sized by these settings
FAMILIES = [f for f in MODEL_FAMILIES if f not in ("ensemble", "base")]


def small(family, n_features=1, season=6, horizon=8, seasons=(6, 12)):
    spec = ModelSpec(family=family, n_features=n_features, horizon=horizon, lookback=24, hidden_size=8,
                     num_layers=1, d_model=8, n_heads=2, season=season, seasons=seasons)
    torch.manual_seed(0)
    return build_model(spec, mean=np.full(n_features, 500.0), std=np.full(n_features, 50.0)).eval()


def zero_correction(model):
    """Zero the layers that write the core's correction to the seasonal anchor."""
    core = model.core
    layers = ([b.forecast for b in core.blocks] if hasattr(core, "blocks")
              else [core.trend, core.seasonal, core.extra] if hasattr(core, "trend") else [core.head])
    with torch.no_grad():
        for layer in layers:
            layer.weight.zero_()
            layer.bias.zero_()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("batch", "time"), [(1, 24), (5, 13), (3, 100)])
def test_any_batch_and_history_length_gives_batch_by_horizon(family, batch, time):
    if family in WINDOW_FAMILIES and time < 24:
        pytest.skip("the window families need at least the lookback (the contract's minimum)")
    # the LSTM and Transformer also run below the lookback, from their longest anchor period (12)
    model = small(family, n_features=2)
    out = model(torch.randn(batch, time, 2) * 50 + 500)
    assert out.shape == (batch, 8)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_untrained_correction_zero_gives_exactly_the_seasonal_naive_forecast(family):
    model = small(family)
    zero_correction(model)
    series = (np.sin(np.arange(200) / 3.0) * 40 + 500).astype(np.float32)
    origins = np.array([50, 120])
    history = np.stack([series[o - 24 : o] for o in origins])[:, :, None]
    got = model(torch.from_numpy(history)).detach().numpy()
    expected = seasonal_naive(series, origins, horizon=8, season=6)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_works_in_raw_units_scaler_is_part_of_the_module(family):
    model = small(family)
    history = torch.randn(4, 24, 1) * 50 + 500
    shifted = model(history + 1000.0)
    # per-window normalisation: a level shift of the input shifts the forecast by the same amount
    torch.testing.assert_close(shifted, model(history) + 1000.0, rtol=1e-4, atol=1e-2)
    state = model.state_dict()
    assert torch.equal(state["feature_mean"].flatten(), torch.tensor([500.0]))


def test_unknown_family_is_named():
    with pytest.raises(ValueError, match="unknown model family 'gru'.*'nhits'"):
        build_model(ModelSpec(family="gru", n_features=1, horizon=2, lookback=4))


@pytest.mark.parametrize("family", WINDOW_FAMILIES)
def test_window_families_read_only_the_last_lookback_steps(family):
    model = small(family, n_features=2)
    history = torch.randn(3, 24, 2) * 50 + 500
    older = torch.randn(3, 50, 2) * 5000  # anything before the window changes nothing
    torch.testing.assert_close(model(torch.cat([older, history], dim=1)), model(history))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_season_is_an_anchor_the_model_can_mix(family):
    model = small(family, seasons=(6, 12))
    zero_correction(model)
    with torch.no_grad():
        model.mix.zero_()
        model.mix[1] = 1.0  # all weight on the second period
    series = (np.sin(np.arange(200) / 3.0) * 40 + np.arange(200) % 12 * 5 + 500).astype(np.float32)
    origins = np.array([50, 120])
    history = np.stack([series[o - 24 : o] for o in origins])[:, :, None]
    got = model(torch.from_numpy(history)).detach().numpy()
    np.testing.assert_allclose(got, seasonal_naive(series, origins, horizon=8, season=12), rtol=1e-5)


def test_seasons_of_a_model_are_the_runs_season_then_every_implied_period_that_fits():
    assert model_seasons(24, (24, 168), lookback=168) == (24, 168)
    assert model_seasons(24, (24, 168), lookback=96) == (24,)
    assert model_seasons(168, (24, 168), lookback=336) == (168, 24)
    assert model_seasons(52, (52,), lookback=104) == (52,)
    assert ModelSpec(family="nhits", n_features=1, horizon=4, lookback=48, season=24,
                     seasons=[24, 168, 12]).anchor_seasons == (24, 12)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_json_written_before_seasons_existed_still_loads(family, tmp_path):
    """model.json of earlier releases has ``season`` but no ``seasons``: one anchor."""
    import json

    model = small(family, seasons=())
    torch.save(model.state_dict(), tmp_path / "model.pt")
    spec = {k: v for k, v in model_spec_dict(family).items() if k != "seasons"}
    (tmp_path / "model.json").write_text(json.dumps({"spec": spec}))
    loaded = ModelSpec(**json.loads((tmp_path / "model.json").read_text())["spec"])
    assert loaded.seasons == () and loaded.anchor_seasons == (6,)
    rebuilt = build_model(loaded)
    rebuilt.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    history = torch.randn(2, 30, 1) * 50 + 500
    torch.testing.assert_close(rebuilt.eval()(history), model(history))


def model_spec_dict(family):
    return ModelSpec(family=family, n_features=1, horizon=8, lookback=24, hidden_size=8, num_layers=1,
                     d_model=8, n_heads=2, season=6).to_dict()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_json_written_before_fleet_mode_loads_as_a_single_series_model(family):
    spec = {k: v for k, v in model_spec_dict(family).items() if k not in ("global_model", "n_series")}
    loaded = ModelSpec(**spec)
    assert loaded.global_model is False and loaded.n_series == 0
    assert build_model(loaded).relative_eps is False


@pytest.mark.parametrize("family", FAMILIES)
def test_only_a_global_model_floors_the_window_spread_relative_to_its_level(family):
    """A window of tiny variance: the absolute EPS (single-series graphs, unchanged) squashes
    it, the relative floor of a global model does not, so its forecast scales with the data."""
    spec = {k: v for k, v in model_spec_dict(family).items() if k not in ("global_model", "n_series", "seasons")}
    history = (1.0 + 0.001 * torch.sin(torch.arange(30.0))).reshape(1, 30, 1)
    out = {}
    for global_model in (False, True):
        torch.manual_seed(0)
        model = build_model(ModelSpec(**spec, global_model=global_model, n_series=3)).eval()
        assert model.relative_eps is global_model
        with torch.no_grad():
            for parameter in model.core.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.1)
            out[global_model] = (model(history), model(history * 1e6) / 1e6)
    torch.testing.assert_close(out[True][0], out[True][1], rtol=1e-5, atol=0)
    assert not torch.allclose(out[False][0], out[False][1], rtol=1e-5, atol=0)
