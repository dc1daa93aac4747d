"""``onnxcast serve`` for a fleet: a global model answers one V2 request holding many series
(batch = series, ``history`` [n, time, F]) over real HTTP, with the numbers ONNX Runtime
gives for the same histories; a batch over ``--max-request-batch`` gets a 413 naming the
limit. The histories are 1,000 real M3 monthly series (their newest 24 values).

``tiny_onnx`` is overridden with an untrained one-column LSTM for the panel (lookback 24,
horizon 18), so the shared ``make_run`` promotes it.
"""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
from serve_support import forecast_of, infer_body

from onnxcast.rollout.promote import promote

pytestmark = pytest.mark.slow

LOOKBACK, HORIZON = 24, 18


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    from onnxcast.pipeline.export import export_onnx
    from onnxcast.pipeline.models import ModelSpec, build_model

    spec = ModelSpec(family="lstm", n_features=1, horizon=HORIZON, lookback=LOOKBACK, hidden_size=8, num_layers=1,
                     season=12)
    model = build_model(spec, np.array([0.0]), np.array([1.0]))
    metadata = {"model_family": "lstm", "lookback": LOOKBACK, "horizon": HORIZON, "freq": "MS", "target": "y",
                "features": "", "precision": "fp32", "trained_until": "2000-01-01T00:00:00Z",
                "dataset_sha256": "ab" * 32, "season": 12, "global": "true", "n_series": 1000,
                "series_column": "unique_id"}
    path = tmp_path_factory.mktemp("fleet-onnx") / "lstm-fp32.onnx"
    return export_onnx(model, path, n_features=1, lookback=LOOKBACK, metadata=metadata)


@pytest.fixture(scope="module")
def fleet_histories():
    """[1000, 24, 1] float32: the newest 24 values of 1,000 M3 monthly series (66 to 144 long)."""
    from tests.real_panels import load_panel

    frame = load_panel("m3-monthly", limit=1000).frame
    newest = frame[frame.groupby("unique_id").cumcount(ascending=False) < LOOKBACK]
    return np.stack([part["y"].to_numpy(np.float32) for _, part in newest.groupby("unique_id", sort=False)])[:, :, None]


def test_a_fleet_batch_over_http_equals_ort_and_the_limit_is_named(tmp_path, make_run, start_server,
                                                                   fleet_histories):
    report = make_run("a")
    promote(report, str(tmp_path / "store"), "m", "cloud", version="1")
    server = start_server(str(tmp_path / "store"))
    meta = server.wait_ready("1")
    assert meta["parameters"]["max_batch"] == 1024 and meta["parameters"]["max_body_bytes"] == 64 * 1024 * 1024
    assert (meta["parameters"]["global"], meta["parameters"]["n_series"], meta["parameters"]["series_column"]) \
        == (True, 1000, "unique_id")
    assert len(fleet_histories) == 1000
    expected = forecast_of(report, fleet_histories)

    # JSON tensor: 24,000 values, ~0.4 MB
    status, body, _ = server.infer(fleet_histories)
    assert status == 200, body
    out = body["outputs"][0]
    assert out["shape"] == [1000, HORIZON]
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(1000, HORIZON), expected,
                               rtol=1e-6, atol=1e-5 * np.abs(expected).max())

    # binary tensor extension (what tritonclient sends): 4 bytes a value
    header = json.dumps({"inputs": [{"name": "history", "datatype": "FP32", "shape": list(fleet_histories.shape),
                                     "parameters": {"binary_data_size": fleet_histories.nbytes}}],
                         "outputs": [{"name": "forecast", "parameters": {"binary_data": True}}]}).encode()
    req = urllib.request.Request(f"{server.url}/v2/models/m/infer", data=header + fleet_histories.tobytes(),
                                 headers={"Inference-Header-Content-Length": str(len(header)),
                                          "Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=30) as response:
        size = int(response.headers["Inference-Header-Content-Length"])
        raw = response.read()
    answer = np.frombuffer(raw[size:], dtype="<f4").reshape(1000, HORIZON)
    np.testing.assert_allclose(answer, expected, rtol=1e-6, atol=1e-5 * np.abs(expected).max())

    # over the request limit: a 413 that names it (the fix: --max-request-batch, or split)
    too_many = np.concatenate([fleet_histories, fleet_histories[:25]])
    status, body, _ = server.infer(body=infer_body(too_many))
    assert status == 413 and body["error"] == "history: batch of 1025 histories; at most 1024 a request"
    assert server.stop() == 0
