"""The export forms compute what the trained models compute (onnxcast.pipeline.graph_forms)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onnxcast.pipeline.graph_forms import fold_linear, graph_form
from onnxcast.pipeline.models import ModelSpec, build_model

FAMILIES = ("lstm", "transformer", "nhits", "dlinear", "base")
LEVELS = (0.1, 0.5, 0.9)


def _trained_like(family: str, n_features: int, global_model: bool, seed: int = 0):
    """A model with random weights everywhere (a zero head would hide the core), quantile offsets
    set, and two anchor periods, one of them shorter than the horizon."""
    torch.manual_seed(seed)
    spec = ModelSpec(family=family, n_features=n_features, horizon=24, lookback=168, season=24,
                     seasons=(24, 168, 12), global_model=global_model, quantile_levels=LEVELS, patch=7)
    mean, std = np.array([1000.0, 5.0][:n_features]), np.array([100.0, 2.0][:n_features])
    model = build_model(spec, None if global_model else mean, None if global_model else std)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
        model.quantile_offsets.copy_(torch.sort(torch.randn(24, len(LEVELS)), dim=1).values)
    return model.eval()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("n_features", "global_model"), [(1, False), (2, False), (1, True)])
def test_the_export_form_forecasts_what_the_model_does(family, n_features, global_model):
    model = _trained_like(family, n_features, global_model)
    form = graph_form(model).eval()
    rng = np.random.default_rng(1)
    for batch, time in ((1, 168), (5, 200), (3, 171)):  # 171: not a whole number of patches
        scale = np.array([300.0, 2.0][:n_features])
        level = np.array([4000.0, 5.0][:n_features]) * (1000 if global_model else 1)
        history = torch.from_numpy((rng.standard_normal((batch, time, n_features)) * scale + level).astype(np.float32))
        with torch.no_grad():
            expected, expected_q = model.forecast_and_quantiles(history)
            forecast, quantiles = form(history)
        np.testing.assert_allclose(forecast.numpy(), expected.numpy(), rtol=2e-5, atol=1e-3 * float(scale[0]))
        np.testing.assert_allclose(quantiles.numpy(), expected_q.numpy(), rtol=2e-5, atol=1e-3 * float(scale[0]))


@pytest.mark.parametrize("family", ["lstm", "transformer"])
def test_a_first_release_model_exports_the_same_function(family):
    """model.json files from before the anchors' mix and quantiles: one anchor, no seasons, no
    patches; fetched from the registry, they are exported through the same forms."""
    torch.manual_seed(0)
    model = build_model(ModelSpec(family=family, n_features=1, horizon=24, lookback=168, season=24),
                        np.array([1000.0]), np.array([100.0]))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.eval()
    history = torch.randn(3, 170, 1) * 100 + 1000
    with torch.no_grad():
        np.testing.assert_allclose(graph_form(model)(history).numpy(), model(history).numpy(), rtol=2e-5, atol=0.05)


def test_a_model_without_quantiles_exports_the_forecast_alone():
    spec = ModelSpec(family="dlinear", n_features=1, horizon=12, lookback=48, season=12, seasons=(12,))
    model = build_model(spec).eval()
    history = torch.randn(4, 48, 1) + 10.0
    with torch.no_grad():
        out = graph_form(model)(history)
    assert isinstance(out, torch.Tensor) and out.shape == (4, 12)


def test_the_fold_refuses_a_core_that_is_not_affine():
    model = _trained_like("nhits", 1, False)
    with pytest.raises(ValueError, match="NHiTSCore is not affine in its window"):
        fold_linear(model)


def test_the_eager_model_keeps_fused_attention_after_an_export_form_is_made():
    from onnxcast.pipeline.models import EncoderLayer

    model = _trained_like("transformer", 1, False)
    graph_form(model)
    assert not any(layer.explicit_attention for layer in model.modules() if isinstance(layer, EncoderLayer))


def test_int8_keeps_the_seasonal_naive_anchor_exact(tmp_path):
    """An untrained model is its seasonal-naive anchor: quantized to int8, it must still forecast
    the anchor, not the anchor rounded to 256 levels of the window's range."""
    from onnxcast.pipeline.export import export_onnx
    from onnxcast.pipeline.optimize import make_variants
    from onnxcast.pipeline.sessions import onnx_session

    spec = ModelSpec(family="lstm", n_features=1, horizon=24, lookback=168, season=24, seasons=(24, 168))
    model = build_model(spec, np.array([1000.0]), np.array([100.0])).eval()
    metadata = {"model_family": "lstm", "lookback": 168, "horizon": 24, "freq": "h", "target": "y", "features": "",
                "precision": "fp32", "trained_until": "2024-01-01T00:00:00Z", "dataset_sha256": "0" * 64}
    fp32 = export_onnx(model, tmp_path / "fp32.onnx", n_features=1, lookback=168, metadata=metadata)
    int8 = {v.name: v.path for v in make_variants(fp32, tmp_path, "lstm", ("int8",))}["int8"]
    rng = np.random.default_rng(0)
    history = (1000 + 300 * np.sin(np.arange(200) * 2 * np.pi / 24)[None, :, None]
               + rng.normal(0, 20, (3, 200, 1))).astype(np.float32)
    anchor = history[:, -24:, 0]  # the daily seasonal naive: the last day again
    forecast = onnx_session(int8).run(["forecast"], {"history": history})[0]
    np.testing.assert_allclose(forecast, anchor, rtol=1e-5, atol=1e-2)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_exported_outputs_have_fixed_horizon_and_levels(tmp_path, family):
    """The manifest's signature, the device's level check and the Triton config read [H, Q] from
    the graph: a Reshape to -1 once left the quantiles' axes symbolic."""
    import onnx

    from onnxcast.base.contract import signature
    from onnxcast.pipeline.export import export_onnx

    model = _trained_like(family, 1, False)
    metadata = {"model_family": family, "lookback": 168, "horizon": 24, "freq": "h", "target": "y", "features": "",
                "precision": "fp32", "trained_until": "2024-01-01T00:00:00Z", "dataset_sha256": "0" * 64,
                "quantile_levels": ",".join(map(str, LEVELS))}
    path = export_onnx(model, tmp_path / "m.onnx", n_features=1, lookback=168, metadata=metadata)
    outputs = {o["name"]: o["shape"] for o in signature(onnx.load(str(path)))["outputs"]}
    assert outputs == {"forecast": ["batch", 24], "quantiles": ["batch", 24, len(LEVELS)]}


def test_an_output_with_a_symbolic_axis_is_refused():
    from onnxcast.pipeline.export import static_axis_problems

    sig = {"outputs": [{"name": "forecast", "shape": ["batch", 24]}, {"name": "quantiles", "shape": ["batch", 24, "q"]}]}
    assert static_axis_problems(sig) == ["output 'quantiles' has shape ['batch', 24, 'q']: every axis but the batch "
                                         "must be fixed"]
