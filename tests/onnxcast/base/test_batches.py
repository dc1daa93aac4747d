"""Many histories in cache-sized chunks give the numbers of one call, up to float rounding
(onnxcast.base.batches)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxcast.base.batches import CHUNK_ROWS, run_in_chunks


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """A real exported model with both outputs (DLinear: exports in a second)."""
    import torch

    from onnxcast.pipeline.export import export_onnx
    from onnxcast.pipeline.models import ModelSpec, build_model
    from onnxcast.pipeline.sessions import onnx_session

    torch.manual_seed(0)
    spec = ModelSpec(family="dlinear", n_features=1, horizon=6, lookback=24, season=12, seasons=(12,),
                     quantile_levels=(0.1, 0.5, 0.9))
    model = build_model(spec, np.array([50.0]), np.array([5.0]))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    metadata = {"model_family": "dlinear", "lookback": 24, "horizon": 6, "freq": "MS", "target": "y",
                "features": "", "precision": "fp32", "trained_until": "2024-01-01T00:00:00Z",
                "dataset_sha256": "0" * 64, "quantile_levels": "0.1,0.5,0.9"}
    path = export_onnx(model.eval(), tmp_path_factory.mktemp("batches") / "m.onnx", n_features=1, lookback=24,
                       metadata=metadata)
    return onnx_session(path)


@pytest.mark.parametrize("rows", [1, CHUNK_ROWS, CHUNK_ROWS + 1, 3 * CHUNK_ROWS + 45])
def test_chunks_give_the_numbers_of_one_call(session, rows):
    history = (50 + 5 * np.random.default_rng(rows).standard_normal((rows, 30, 1))).astype(np.float32)
    whole = session.run(["forecast", "quantiles"], {"history": history})
    chunked = run_in_chunks(session, ["forecast", "quantiles"], history)
    assert [a.shape for a in chunked] == [(rows, 6), (rows, 6, 3)]
    for expected, got in zip(whole, chunked, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_one_output_in_the_order_asked(session):
    history = np.full((CHUNK_ROWS * 2 + 1, 24, 1), 50.0, np.float32)
    (quantiles,) = run_in_chunks(session, ["quantiles"], history)
    assert quantiles.shape == (CHUNK_ROWS * 2 + 1, 6, 3)
