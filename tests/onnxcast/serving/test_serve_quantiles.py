"""``onnxcast serve`` over real HTTP with a model that has the ``quantiles`` output: V2
inference answers with both outputs (forecast first) unless the request chooses, in JSON and
in the binary tensor extension; model metadata lists both and the levels; a model from before
quantiles answers exactly as it did."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from serve_support import infer_body

from onnxcast.rollout.promote import promote

pytestmark = pytest.mark.slow
LEVELS = [0.025, 0.1, 0.5, 0.9, 0.975]


def _outputs_of(report, history: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What ONNX Runtime gives for ``history`` with the run's cloud file (fp32)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(report.parent / "models/lstm/onnx/fp32.onnx"),
                                   providers=["CPUExecutionProvider"])
    forecast, quantiles = session.run(["forecast", "quantiles"], {"history": history})
    return forecast, quantiles


@pytest.fixture
def served(tmp_path, make_run, start_server):
    """A server on version 1 of a model with quantiles; (server, report)."""
    store = str(tmp_path / "store")
    report = make_run("a", quantiles=True)
    promote(report, store, "m", "cloud", version="1")
    server = start_server(store)
    server.wait_ready("1")
    return server, report


class TestQuantiles:
    def test_metadata_lists_both_outputs_and_the_levels(self, served):
        server, _ = served
        status, meta, _ = server.get("/v2/models/m")
        assert status == 200
        assert meta["outputs"] == [{"name": "forecast", "datatype": "FP32", "shape": [-1, 4]},
                                   {"name": "quantiles", "datatype": "FP32", "shape": [-1, 4, 5]}]
        assert meta["parameters"]["quantile_levels"] == LEVELS
        assert server.get("/v2/models/m/versions/1")[1]["outputs"] == meta["outputs"]
        status, document, _ = server.get("/openapi.json")
        requested = document["paths"]["/v2/models/{name}/infer"]["post"]["requestBody"]["content"][
            "application/json"]["schema"]["properties"]["outputs"]["items"]["properties"]["name"]
        assert status == 200 and requested["enum"] == ["forecast", "quantiles"]

    def test_a_request_naming_no_outputs_gets_both_forecast_first(self, served, window):
        server, report = served
        status, body, _ = server.infer(window)
        assert status == 200, body
        assert [(o["name"], o["datatype"], o["shape"]) for o in body["outputs"]] == [
            ("forecast", "FP32", [3, 4]), ("quantiles", "FP32", [3, 4, 5])]
        forecast, quantiles = _outputs_of(report, window)
        np.testing.assert_allclose(np.reshape(body["outputs"][0]["data"], (3, 4)), forecast, rtol=1e-6, atol=1e-5)
        got = np.reshape(body["outputs"][1]["data"], (3, 4, 5))
        np.testing.assert_allclose(got, quantiles, rtol=1e-6, atol=1e-5)
        assert (np.diff(got, axis=2) >= 0).all()

    def test_the_request_chooses_which_and_in_what_order(self, served, window):
        server, report = served
        forecast, quantiles = _outputs_of(report, window)
        status, body, _ = server.infer(body=infer_body(window, outputs=[{"name": "quantiles"}]))
        assert status == 200 and [o["name"] for o in body["outputs"]] == ["quantiles"]
        np.testing.assert_allclose(np.reshape(body["outputs"][0]["data"], (3, 4, 5)), quantiles, rtol=1e-6, atol=1e-5)
        status, body, _ = server.infer(body=infer_body(window, outputs=[{"name": "forecast"}]))
        assert status == 200 and [o["name"] for o in body["outputs"]] == ["forecast"]
        status, body, _ = server.infer(body=infer_body(window, outputs=[{"name": "quantiles"}, {"name": "forecast"}]))
        assert status == 200 and [o["name"] for o in body["outputs"]] == ["quantiles", "forecast"]
        status, body, _ = server.infer(body=infer_body(window, outputs=[{"name": "q0.5"}]))
        assert (status, body) == (400, {"error": "unknown output 'q0.5': this model gives 'forecast' and 'quantiles'"})

    def test_binary_outputs_follow_the_header_in_order(self, served, window):
        server, report = served
        forecast, quantiles = _outputs_of(report, window)
        raw = window.astype("<f4").tobytes()
        header = json.dumps({"inputs": [{"name": "history", "datatype": "FP32", "shape": list(window.shape),
                                         "parameters": {"binary_data_size": len(raw)}}],
                             "parameters": {"binary_data_output": True}}).encode()
        payload, headers = _post(server, header + raw, len(header))
        size = int(headers["Inference-Header-Content-Length"])
        answer = orjson.loads(payload[:size])
        assert [(o["name"], o["parameters"]["binary_data_size"]) for o in answer["outputs"]] == [
            ("forecast", 48), ("quantiles", 240)]
        data = np.frombuffer(payload[size:], "<f4")
        np.testing.assert_allclose(data[:12].reshape(3, 4), forecast, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(data[12:].reshape(3, 4, 5), quantiles, rtol=1e-6, atol=1e-5)

    def test_tritonclient_reads_both_outputs(self, served, window):
        tritonclient_http = pytest.importorskip("tritonclient.http")
        server, report = served
        forecast, quantiles = _outputs_of(report, window)
        client = tritonclient_http.InferenceServerClient(server.url.removeprefix("http://"))
        assert [o["name"] for o in client.get_model_metadata("m")["outputs"]] == ["forecast", "quantiles"]
        for binary in (True, False):
            tensor = tritonclient_http.InferInput("history", list(window.shape), "FP32")
            tensor.set_data_from_numpy(window, binary_data=binary)
            result = client.infer("m", [tensor])  # no outputs named: every output
            np.testing.assert_allclose(result.as_numpy("forecast"), forecast, rtol=1e-6, atol=1e-5)
            np.testing.assert_allclose(result.as_numpy("quantiles"), quantiles, rtol=1e-6, atol=1e-5)
            mixed = client.infer("m", [tensor], outputs=[
                tritonclient_http.InferRequestedOutput("quantiles", binary_data=binary),
                tritonclient_http.InferRequestedOutput("forecast", binary_data=not binary)])
            np.testing.assert_allclose(mixed.as_numpy("quantiles"), quantiles, rtol=1e-6, atol=1e-5)
            np.testing.assert_allclose(mixed.as_numpy("forecast"), forecast, rtol=1e-6, atol=1e-5)
        client.close()


def test_a_model_without_quantiles_answers_as_before(tmp_path, make_run, start_server, window):
    store = str(tmp_path / "store")
    promote(make_run("old"), store, "m", "cloud", version="1")
    server = start_server(store)
    meta = server.wait_ready("1")
    assert meta["outputs"] == [{"name": "forecast", "datatype": "FP32", "shape": [-1, 4]}]
    assert "quantile_levels" not in meta["parameters"]
    status, body, _ = server.infer(window)
    assert status == 200 and [o["name"] for o in body["outputs"]] == ["forecast"]
    status, body, _ = server.infer(body=infer_body(window, outputs=[{"name": "quantiles"}]))
    assert (status, body) == (400, {"error": "unknown output 'quantiles': this model gives 'forecast'"})


def _post(server, data: bytes, header_length: int):
    """A binary-extension request; the raw answer body and headers."""
    import urllib.request

    req = urllib.request.Request(f"{server.url}/v2/models/m/infer", data=data, headers={
        "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)})
    with urllib.request.urlopen(req, timeout=30) as response:
        assert response.status == 200
        return response.read(), response.headers  # case-insensitive names

