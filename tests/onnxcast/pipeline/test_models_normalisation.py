"""The "recent" normalisation of global models (issue 32, no blow-ups): level and spread of the
window's newest steps, the normalised window clipped, the same function in the module and in its
export form; model.json files without the field keep the whole-window normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onnxcast.pipeline.graph_forms import graph_form
from onnxcast.pipeline.models import NORM_CLIP, ModelSpec, build_model, recent_steps

FAMILIES = ("lstm", "transformer", "nhits", "dlinear")
LEVELS = (0.1, 0.5, 0.9)


def _model(family: str, normalisation: str, n_features: int = 1, global_model: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    spec = ModelSpec(family=family, n_features=n_features, horizon=18, lookback=36, season=12, seasons=(12,),
                     global_model=global_model, quantile_levels=LEVELS, patch=3, normalisation=normalisation)
    mean, std = (None, None) if global_model else (np.array([100.0, 5.0][:n_features]), np.array([30.0, 2.0][:n_features]))
    model = build_model(spec, mean, std)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
        model.quantile_offsets.copy_(torch.sort(torch.randn(18, len(LEVELS)), dim=1).values)
    return model.eval()


def _level_shift(batch: int = 4, time: int = 40, n_features: int = 1, old: float = 3000.0) -> torch.Tensor:
    """Monthly histories that collapse from ``old`` to about 180 twenty steps before their end
    (M1's MND23, MND21: the series that blew up)."""
    rng = np.random.default_rng(5)
    season = 20 * np.sin(np.arange(time) * 2 * np.pi / 12)
    values = 180.0 + season + rng.normal(0, 10, (batch, time))
    values[:, : time - 20] += old - 180.0
    history = np.repeat(values[:, :, None], n_features, axis=2)
    if n_features > 1:
        history[:, :, 1:] = rng.normal(5, 2, (batch, time, n_features - 1))
    return torch.from_numpy(history.astype(np.float32))


def test_recent_steps_are_half_the_lookback_and_at_least_a_season():
    assert recent_steps(12, 36) == 18
    assert recent_steps(4, 16) == 8
    assert recent_steps(24, 168) == 84
    assert recent_steps(12, 12) == 12
    assert recent_steps(1, 1) == 1


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("n_features", "global_model"), [(1, True), (2, True), (1, False)])
def test_the_export_form_normalises_as_the_model_does(family, n_features, global_model):
    model = _model(family, "recent", n_features, global_model)
    form = graph_form(model).eval()
    rng = np.random.default_rng(2)
    smooth = torch.from_numpy((rng.standard_normal((3, 45, n_features)) * 30 + 500).astype(np.float32))
    for history in (_level_shift(n_features=n_features), smooth, _level_shift(time=36, n_features=n_features)):
        with torch.no_grad():
            normed, _, _ = model.normalise(history[:, -36:] if family in ("nhits", "dlinear") else history)
            expected, expected_q = model.forecast_and_quantiles(history)
            forecast, quantiles = form(history)
        np.testing.assert_allclose(forecast.numpy(), expected.numpy(), rtol=2e-5, atol=1e-2)
        np.testing.assert_allclose(quantiles.numpy(), expected_q.numpy(), rtol=2e-5, atol=1e-2)
    assert float(normed.abs().max()) <= NORM_CLIP


@pytest.mark.parametrize("family", FAMILIES)
def test_the_size_of_an_old_level_shift_no_longer_sets_the_forecast(family):
    """Under "recent" a window that collapsed from 3,000 or from 30,000 to 180 forecasts the same
    (the old part is clipped either way), at the recent level; under "window" the old part sets
    the level and spread the correction is multiplied by."""
    small, big = _level_shift(old=3000.0), _level_shift(old=30000.0)
    with torch.no_grad():
        recent = _model(family, "recent")
        np.testing.assert_allclose(recent(small).numpy(), recent(big).numpy(), rtol=1e-5, atol=1e-3)
        window = _model(family, "window")
        moved = (window(big) - window(small)).abs().max()
        recent_error = (recent(small) - small[:, -12:, 0].repeat(1, 2)[:, :18]).abs().max()
    assert float(moved) > 10 * float(recent_error)


@pytest.mark.parametrize("family", ["nhits", "dlinear"])
def test_recent_normalisation_keeps_a_global_model_scale_free(family):
    model = _model(family, "recent")
    history = _level_shift()
    with torch.no_grad():
        np.testing.assert_allclose((model(history * 1000.0) / 1000.0).numpy(), model(history).numpy(), rtol=1e-4)


def test_a_spec_without_the_field_normalises_on_the_whole_window():
    spec = ModelSpec(family="nhits", n_features=1, horizon=18, lookback=36, season=12)
    assert spec.normalisation == "window" and build_model(spec).norm_steps == 0
    with pytest.raises(ValueError, match="unknown normalisation 'robust'"):
        build_model(ModelSpec(family="nhits", n_features=1, horizon=18, lookback=36, season=12,
                              normalisation="robust"))
