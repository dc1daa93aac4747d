import numpy as np
import pytest
import torch

from onnxcast.export import export_onnx
from onnxcast.models import ModelSpec, build_model
from onnxcast.validate import (
    check_parity,
    measure_latency,
    onnx_session,
    parity_shapes,
    torch_runner,
)

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
