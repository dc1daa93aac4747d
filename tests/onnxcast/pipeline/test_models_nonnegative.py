"""A target never negative in training is never forecast negative (issue 32): detected
(models.never_negative), recorded (ModelSpec.nonnegative, model.json, the ONNX metadata
``onnxcast.nonnegative``), enforced in the module and in its export form, quantiles included."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from onnxcast.pipeline.graph_forms import graph_form
from onnxcast.pipeline.models import ModelSpec, build_model, never_negative

FAMILIES = ("lstm", "transformer", "nhits", "dlinear")
LEVELS = (0.025, 0.5, 0.975)
METADATA = {"lookback": 48, "horizon": 12, "freq": "MS", "target": "y", "features": "", "precision": "fp32",
            "trained_until": "2024-01-01T00:00:00Z", "dataset_sha256": "0" * 64,
            "quantile_levels": ",".join(map(str, LEVELS))}


def _model(family: str, nonnegative: bool, seed: int = 0):
    """A global model with random weights and wide quantile offsets (some quantiles far below the
    forecast), as trained."""
    torch.manual_seed(seed)
    spec = ModelSpec(family=family, n_features=1, horizon=12, lookback=48, season=12, seasons=(12,),
                     global_model=True, quantile_levels=LEVELS, patch=4, nonnegative=nonnegative)
    model = build_model(spec)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
        model.quantile_offsets.copy_(torch.tensor([-6.0, 0.0, 6.0]).expand(12, 3))
    return model.eval()


def _falling_to_zero(batch: int = 6, time: int = 60) -> torch.Tensor:
    """Never-negative histories that fall to about zero: a seasonal naive of them is >= 0, but a
    trend carried on, or an interval around it, goes below."""
    rng = np.random.default_rng(3)
    steps = np.arange(time)
    slope = rng.uniform(1.0, 3.0, (batch, 1))
    values = np.clip(slope * (time - steps) + rng.normal(0, 2, (batch, time)), 0, None)
    return torch.from_numpy(values[:, :, None].astype(np.float32))


def test_the_training_part_of_every_series_decides():
    assert never_negative(np.array([0.0, 3.0, np.nan, 1.0]))
    assert not never_negative(np.array([2.0, -0.5, 1.0]))
    assert not never_negative(np.array([np.nan]))  # nothing to go by: not clipped
    # a fleet of two series back to back; series 1's negative value lies after its training part
    values = np.array([1.0, 2.0, 3.0, 5.0, 4.0, -1.0])
    offsets, train_end = np.array([0, 3, 6]), np.array([3, 2])
    assert never_negative(values, offsets, train_end)
    assert not never_negative(values, offsets, np.array([3, 3]))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_never_negative_target_forecasts_nothing_below_zero_in_module_and_graph(family):
    history = _falling_to_zero()
    free, clipped = _model(family, False), _model(family, True)
    with torch.no_grad():
        free_f, free_q = free.forecast_and_quantiles(history)
        forecast, quantiles = clipped.forecast_and_quantiles(history)
        form_f, form_q = graph_form(clipped).eval()(history)
    assert (free_q < 0).any(), "the test's histories must drive the unclipped model below zero"
    assert (forecast >= 0).all() and (quantiles >= 0).all()
    np.testing.assert_allclose(forecast.numpy(), free_f.clamp_min(0).numpy(), rtol=1e-6, atol=1e-6)
    # the quantiles sit around the clipped forecast (the one the offsets were calibrated on), clipped too
    around = (forecast.unsqueeze(-1) + free_q - free_f.unsqueeze(-1)).clamp_min(0)
    np.testing.assert_allclose(quantiles.numpy(), around.numpy(), rtol=1e-5, atol=1e-4)
    assert (torch.diff(quantiles, dim=-1) >= 0).all()  # still non-crossing
    np.testing.assert_allclose(form_f.numpy(), forecast.numpy(), rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(form_q.numpy(), quantiles.numpy(), rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("family", ["nhits", "dlinear"])
def test_a_target_with_negatives_is_not_clipped(family):
    history = _falling_to_zero() - 50.0  # the same shapes, below zero
    model = _model(family, False)
    with torch.no_grad():
        forecast, quantiles = model.forecast_and_quantiles(history)
        form_f, form_q = graph_form(model).eval()(history)
    assert (forecast < 0).any() and (quantiles < 0).any()
    np.testing.assert_allclose(form_f.numpy(), forecast.numpy(), rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(form_q.numpy(), quantiles.numpy(), rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("family", ["nhits", "dlinear"])
def test_the_graph_clips_and_its_metadata_says_so(tmp_path, family):
    import onnx

    from onnxcast.base.contract import read_metadata
    from onnxcast.pipeline.export import export_onnx
    from onnxcast.pipeline.sessions import onnx_session

    history = _falling_to_zero().numpy()
    relus = {}
    for nonnegative in (True, False):
        path = export_onnx(_model(family, nonnegative), tmp_path / f"{nonnegative}.onnx", n_features=1, lookback=48,
                           metadata={"model_family": family, **METADATA})
        proto = onnx.load(str(path))
        assert read_metadata(proto)["nonnegative"] == str(nonnegative).lower()
        relus[nonnegative] = sum(n.op_type == "Relu" for n in proto.graph.node)
        forecast, quantiles = onnx_session(path).run(["forecast", "quantiles"], {"history": history})
        assert bool((forecast >= 0).all() and (quantiles >= 0).all()) is nonnegative
    assert relus[True] == relus[False] + 2  # one after the forecast, one after the quantiles (N-HiTS has its own)


def test_a_model_json_without_the_field_loads_as_not_clipped(tmp_path):
    """model.json files written before issue 32 have no ``nonnegative``: not clipped."""
    from onnxcast.pipeline.checkpoint import load_model
    from onnxcast.pipeline.config import PipelineConfig

    cfg = PipelineConfig.from_dict({"data_uri": "x.csv", "out_dir": str(tmp_path), "horizon": 12, "lookback": 48})
    model = _model("dlinear", False)
    spec = {k: v for k, v in json.loads(json.dumps(ModelSpec(
        family="dlinear", n_features=1, horizon=12, lookback=48, season=12, seasons=(12,), global_model=True,
        quantile_levels=LEVELS).to_dict())).items() if k != "nonnegative"}
    cfg.layout.family("dlinear").mkdir(parents=True)
    torch.save(model.state_dict(), cfg.layout.model_pt("dlinear"))
    cfg.layout.model_json("dlinear").write_text(json.dumps({"spec": spec}))
    loaded, loaded_spec = load_model(cfg, "dlinear")
    assert loaded_spec.nonnegative is False and loaded.nonnegative is False
    with torch.no_grad():
        _, quantiles = loaded.forecast_and_quantiles(_falling_to_zero())
    assert (quantiles < 0).any()
