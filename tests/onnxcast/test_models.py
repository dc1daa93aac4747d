import numpy as np
import pytest
import torch

from onnxcast.accuracy import seasonal_naive
from onnxcast.models import ModelSpec, build_model

FAMILIES = ["lstm", "transformer"]


def small(family, n_features=1, season=6, horizon=8):
    spec = ModelSpec(family=family, n_features=n_features, horizon=horizon, lookback=24, hidden_size=8,
                     num_layers=1, d_model=8, n_heads=2, season=season)
    torch.manual_seed(0)
    return build_model(spec, mean=np.full(n_features, 500.0), std=np.full(n_features, 50.0)).eval()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("batch", "time"), [(1, 24), (5, 7), (3, 100)])
def test_any_batch_and_history_length_gives_batch_by_horizon(family, batch, time):
    model = small(family, n_features=2)
    out = model(torch.randn(batch, time, 2) * 50 + 500)
    assert out.shape == (batch, 8)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_untrained_correction_zero_gives_exactly_the_seasonal_naive_forecast(family):
    model = small(family)
    with torch.no_grad():
        model.core.head.weight.zero_()
        model.core.head.bias.zero_()
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
    with pytest.raises(ValueError, match="unknown model family 'gru'"):
        build_model(ModelSpec(family="gru", n_features=1, horizon=2, lookback=4))
