"""``onnxcast serve`` over real HTTP on loopback: V2 protocol, verified pulls, readiness,
validation, batching, metrics, atomic swaps under load, graceful shutdown."""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from serve_support import burst, forecast_of, infer_body

from onnxcast import cli
from onnxcast.base.files import sha256_bytes
from onnxcast.rollout.promote import promote
from onnxcast.rollout.store import open_store

pytestmark = pytest.mark.slow


class TestServe:
    def test_serves_the_channels_model_with_the_pipelines_numbers(self, store_uri, make_run, start_server, window):
        report = make_run("a")
        promote(report, store_uri, "m", "cloud", version="1")
        server = start_server(store_uri)
        meta = server.wait_ready("1")
        assert meta["inputs"] == [{"name": "history", "datatype": "FP32", "shape": [-1, -1, 2]}]
        assert meta["outputs"] == [{"name": "forecast", "datatype": "FP32", "shape": [-1, 4]}]
        assert meta["parameters"]["artifact"] == "lstm-fp32.onnx"  # the cloud variant, not edge's
        status, body, headers = server.infer(window)
        assert status == 200, body
        assert (body["model_name"], body["model_version"], headers["x-model-version"]) == ("m", "1", "1")
        out = body["outputs"][0]
        assert (out["name"], out["datatype"], out["shape"]) == ("forecast", "FP32", [3, 4])
        np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(3, 4), forecast_of(report, window),
                                   rtol=1e-6, atol=1e-5)
        assert server.stop() == 0

    def test_ready_only_once_a_verified_model_is_loaded(self, tmp_path, make_run, start_server, window):
        store = str(tmp_path / "store")
        server = start_server(store)
        assert server.get("/v2/health/live")[0] == 200
        status, body, _ = server.get("/v2/health/ready")
        assert (status, body) == (503, {"ready": False})
        status, body, _ = server.infer(window)
        assert status == 503 and "no verified version loaded yet" in body["error"]
        promote(make_run("a"), store, "m", "cloud", version="1")
        server.wait_ready("1")
        assert server.get("/v2/health/ready")[:2] == (200, {"ready": True})
        assert server.infer(window)[0] == 200

    def test_tampered_version_is_refused_and_the_old_one_keeps_serving(self, tmp_path, make_run, start_server,
                                                                         window):
        store = tmp_path / "store"
        promote(make_run("a"), str(store), "m", "cloud", version="1")
        server = start_server(str(store))
        server.wait_ready("1")
        # Version 2 is written (through the edge channel), its cloud artifact's bytes are then
        # swapped, and only then does the cloud pointer move to it, as a bucket writer could:
        # without the release key its pointer carries no valid signature.
        promote(make_run("b"), str(store), "m", "edge", version="2")
        artifact = store / "m/versions/2/lstm-fp32.onnx"
        artifact.write_bytes(artifact.read_bytes()[:-4] + b"evil")
        rollout = open_store(str(store))
        manifest = rollout.read(rollout.version_key("m", "2"))
        pointer = rollout.read_channel("m", "cloud")
        evil = sha256_bytes(artifact.read_bytes())
        rollout.replace_pointer(rollout.channel_key("m", "cloud"), {**pointer.envelope, "signed": {
            **pointer.value, "version": "2", "counter": pointer.value["counter"] + 1, "sha256": evil,
            "manifest": {"sha256": sha256_bytes(manifest), "length": len(manifest)},
            "manifest_sha256": sha256_bytes(manifest)}}, pointer.token)
        deadline = time.monotonic() + 30
        while 'onnxcast_serve_poll_errors_total{error="RefusedError",model="m"}' not in server.metrics():
            assert time.monotonic() < deadline, server.log.read_text()
            time.sleep(0.2)
        status, body, headers = server.infer(window)
        assert (status, body["model_version"]) == (200, "1")
        assert server.get("/v2/health/ready")[0] == 200
        assert "signed by 0 of the 1 release key(s) required; refusing it (still serving version 1)" in \
            server.log.read_text()

    def test_tritonclient_works_unchanged(self, tmp_path, make_run, start_server, window):
        tritonclient_http = pytest.importorskip("tritonclient.http")
        store = str(tmp_path / "store")
        report = make_run("a")
        promote(report, store, "m", "cloud", version="1")
        server = start_server(store)
        server.wait_ready("1")
        client = tritonclient_http.InferenceServerClient(server.url.removeprefix("http://"))
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("m")
        assert client.get_model_metadata("m")["versions"] == ["1"]
        for binary in (True, False):  # tritonclient's default is the binary tensor extension
            tensor = tritonclient_http.InferInput("history", list(window.shape), "FP32")
            tensor.set_data_from_numpy(window, binary_data=binary)
            result = client.infer("m", [tensor], outputs=[tritonclient_http.InferRequestedOutput(
                "forecast", binary_data=binary)])
            np.testing.assert_allclose(result.as_numpy("forecast"), forecast_of(report, window), rtol=1e-6, atol=1e-5)
            assert result.get_response()["model_version"] == "1"
        client.close()

    def test_concurrent_requests_are_batched_and_metrics_name_the_version(self, tmp_path, make_run, start_server):
        store = str(tmp_path / "store")
        report = make_run("a")
        promote(report, store, "m", "cloud", version="1")
        server = start_server(store, "--max-delay-ms", "50", "--max-batch-size", "64")
        server.wait_ready("1")
        rng = np.random.default_rng(2)
        histories = rng.normal(100, 10, size=(48, 1, 16, 2)).astype(np.float32)
        results = burst(f"{server.url}/v2/models/m/infer", [json.dumps(infer_body(h)).encode() for h in histories])
        expected = forecast_of(report, histories[:, 0])
        for (status, body), want in zip(results, expected, strict=True):
            assert status == 200, body
            np.testing.assert_allclose(body["outputs"][0]["data"], want, rtol=1e-6, atol=1e-5)
        metrics = server.metrics()
        calls = _metric(metrics, 'onnxcast_serve_batch_requests_count{model="m"}')
        assert _metric(metrics, 'onnxcast_serve_batch_requests_sum{model="m"}') == 48
        assert calls < 48, f"48 concurrent requests took {calls} ONNX Runtime calls"
        assert _metric(metrics, 'onnxcast_serve_requests_total{code="200",model="m",version="1"}') == 48
        assert 'onnxcast_serve_model_version_info{model="m",sha256=' in metrics
        assert _metric(metrics, 'onnxcast_serve_request_seconds_count{model="m"}') == 48

    def test_swap_under_load_fails_no_request_and_mixes_no_versions(self, tmp_path, make_run, make_shifted_run,
                                                                     start_server):
        store = str(tmp_path / "store")
        reports = {"1": make_run("a"), "2": make_shifted_run("b")}
        promote(reports["1"], store, "m", "cloud", version="1")
        server = start_server(store)
        server.wait_ready("1")
        history = np.random.default_rng(3).normal(100, 10, size=(2, 16, 2)).astype(np.float32)
        expected = {v: forecast_of(r, history) for v, r in reports.items()}
        assert not np.allclose(expected["1"], expected["2"])  # the two versions answer differently
        stop = threading.Event()

        def client():
            seen = []
            while not stop.is_set():
                status, body, headers = server.infer(history)
                assert status == 200, body
                version = body["model_version"]
                assert headers["x-model-version"] == version
                np.testing.assert_allclose(np.reshape(body["outputs"][0]["data"], (2, 4)), expected[version],
                                           rtol=1e-6, atol=1e-5)  # the numbers are the named version's
                seen.append(version)
            return seen

        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(client) for _ in range(8)]
            time.sleep(1.0)
            promote(reports["2"], store, "m", "cloud", version="2")
            server.wait_ready("2")
            time.sleep(1.0)
            stop.set()
            seen = [f.result() for f in futures]
        for versions in seen:
            assert versions[0] == "1" and versions[-1] == "2"
            assert versions == sorted(versions)  # once a client saw 2, never 1 again
        metrics = server.metrics()
        assert 'onnxcast_serve_model_version_info{model="m",sha256=' in metrics
        assert _metric(metrics, 'onnxcast_serve_swaps_total{model="m"}') == 2
        assert 'code="5' not in metrics

    def test_graceful_shutdown_answers_what_is_in_flight(self, tmp_path, make_run, start_server, window):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "cloud", version="1")
        server = start_server(store)
        server.wait_ready("1")
        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(server.infer, window) for _ in range(64)]
            time.sleep(0.05)
            code = server.stop()
            statuses = []
            for future in futures:
                try:
                    statuses.append(future.result()[0])
                except OSError:  # sent after the listener closed: refused, never half-answered
                    statuses.append("refused")
        assert code == 0
        assert set(statuses) <= {200, "refused"} and 200 in statuses


class TestValidation:
    @pytest.mark.parametrize("body, status, message", [
        (b"{not json", 400, "request body is not valid JSON"),
        ({"inputs": []}, 400, "'inputs' must list exactly one tensor named 'history'"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16, 2], "data": [0.0] * 32}]}, 400,
         "unknown input 'x': this model takes 'history'"),
        (infer_body(np.zeros((1, 16, 3), np.float32)), 400, "3 feature(s) per step; this model takes 2"),
        (infer_body(np.zeros((1, 8, 2), np.float32)), 400, "history of 8 step(s); this model takes 16"),
        (infer_body(np.zeros((2, 16), np.float32)), 400, "shape must be [batch, time, n_features]"),
        ({"inputs": [{"name": "history", "datatype": "INT32", "shape": [1, 16, 2], "data": [0] * 32}]}, 400,
         "datatype 'INT32' is not supported; send FP32"),
        ({"inputs": [{"name": "history", "datatype": "FP32", "shape": [1, 16, 2], "data": [0.0] * 31}]}, 400,
         "'data' holds 31 values, shape [1, 16, 2] needs 32"),
        ({"inputs": [{"name": "history", "datatype": "FP32", "shape": [1, 16, 2], "data": ["a"] * 32}]}, 400,
         "'data' holds a string 'a' at index 0; FP32 data must be JSON numbers"),
        (infer_body(np.zeros((0, 16, 2), np.float32)), 400, "batch is 0"),
        (infer_body(np.zeros((5, 16, 2), np.float32)), 413, "batch of 5 histories; at most 4 a request"),
        ({"inputs": [{"name": "history", "datatype": "FP64", "shape": [1, 16, 2], "data": [0.0] * 31 + [1e300]}]},
         400, "value at [0, 15, 1] is not finite"),
        ({**infer_body(np.zeros((1, 16, 2), np.float32)), "outputs": [{"name": "y"}]}, 400,
         "unknown output 'y': this model gives 'forecast'"),
    ])
    def test_bad_requests_get_a_4xx_naming_the_problem(self, tmp_path, make_run, start_server, body, status, message):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "cloud", version="1")
        server = start_server(store, "--max-request-batch", "4")
        server.wait_ready("1")
        got, answer, _ = server.infer(body=body)
        assert got == status and message in answer["error"], answer
        assert server.infer(np.zeros((1, 16, 2), np.float32))[0] == 200  # still serving

    def test_nan_unknown_model_and_version(self, tmp_path, make_run, start_server):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "cloud", version="1")
        server = start_server(store)
        server.wait_ready("1")
        text = json.dumps(infer_body(np.zeros((1, 16, 2), np.float32))).replace("0.0", "NaN", 1).encode()
        status, body, _ = server.infer(body=text)
        assert status == 400 and "value at [0, 0, 0] is not finite" in body["error"]
        status, body, _ = server.infer(np.zeros((1, 16, 2), np.float32), model="other")
        assert status == 404 and body["error"] == "unknown model 'other'; this server serves 'm'"
        connection = http.client.HTTPConnection(server.url.removeprefix("http://"))
        connection.request("POST", "/v2/models/other/infer", body=b"{}")
        answer = connection.getresponse()
        assert answer.status == 404 and answer.headers.get_all("content-length") == [str(len(answer.read()))]
        connection.close()
        status, body, _ = server.get("/v2/models/m/versions/7")
        assert status == 404 and "version '7' of 'm' is not served; serving '1'" in body["error"]
        assert 'code="400"' in server.metrics()


class TestCommand:
    def test_bad_settings_exit_2_with_one_line(self, tmp_path, capsys):
        code = cli.main(["serve", "--store", str(tmp_path), "--model", "m", "--max-batch-size", "0"])
        assert code == 2
        assert capsys.readouterr().err.strip() == "error: max_batch_size must be between 1 and 65536, got 0"

    def test_bad_model_name(self, tmp_path, capsys):
        assert cli.main(["serve", "--store", str(tmp_path), "--model", "../x"]) == 2
        assert "invalid model name '../x'" in capsys.readouterr().err


def _metric(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in metrics:\n{text}")
