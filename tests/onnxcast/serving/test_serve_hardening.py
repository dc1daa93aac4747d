"""``onnxcast serve`` against hostile or broken input, over real HTTP on loopback (issue 18):
bodies nested past the parsers' limits, histories shorter than the model takes, clients
that stall mid-request, requests without the bearer token, a channel pointer that is deep
JSON or a FIFO. Every answer is a V2 JSON error with a 4xx (or a counted 500), and the
loaded model keeps serving."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from serve_support import REPO, free_port, infer_body, request

from onnxcast.rollout.promote import promote

pytestmark = pytest.mark.slow


def _metric(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def _poll_errors(metrics: str) -> float:
    return sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith("onnxcast_serve_poll_errors_total{"))


def _wait_for(condition, timeout: float, server, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not seen in {timeout} s: {server.log.read_text()[-3000:]}"
        time.sleep(0.1)


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _answer_or_eof(sock: socket.socket, timeout: float) -> bytes | None:
    """What the server sent until it closed the connection; None if still open after ``timeout``."""
    received, deadline = b"", time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if select.select([sock], [], [], left)[0]:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk
    return None


@pytest.fixture
def served(tmp_path, make_run, start_server):
    """Factory: version 1 promoted to the cloud channel of a local store, a server ready on it."""

    def start(*extra: str, **options):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "cloud", version="1")
        server = start_server(store, *extra, **options)
        server.wait_ready("1")
        return server

    return start


class TestBadBodies:
    @pytest.mark.parametrize("body", [
        b'{"inputs": ' + b"[" * 1100 + b"]" * 1100 + b"}",  # past orjson's 1,024 levels
        b'{"id": NaN, "inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # orjson stops at NaN; json.loads recursed
    ], ids=["deep", "deep-after-nan"])
    def test_deeply_nested_body_is_a_counted_400(self, served, body):
        server = served()
        status, answer, headers = server.infer(body=body)
        assert status == 400 and headers["content-type"] == "application/json", answer
        assert answer == {"error": "request body is nested too deep (a V2 request nests 4 levels)"}
        assert server.infer(np.zeros((1, 16, 2), np.float32))[0] == 200  # still serving
        metrics = server.metrics()
        assert _metric(metrics, 'onnxcast_serve_requests_total{code="400",model="m",version="1"}') == 1
        assert "Traceback" not in server.log.read_text()

    def test_echoed_values_are_clipped_and_data_must_be_json_numbers(self, served):
        """Issue 30, item 12: a 10 MB datatype, a 1 MB input name or a million-entry shape came
        back whole in the 400 (a 10 MB answer); FP32 data as strings or booleans got a 200."""
        server = served()
        ok = [0.5] * 32

        def history(**fields):
            return {"inputs": [{"name": "history", "datatype": "FP32", "shape": [1, 16, 2], "data": ok, **fields}]}

        cases = [
            (history(datatype="X" * 10_000_000), 400, "history: datatype 'XXXX", "... (10,000,000 characters) is not "
                                                                                  "supported; send FP32"),
            (history(name="n" * 1_000_000), 400, "unknown input 'nnnn", "... (1,000,000 characters): this model takes "
                                                                          "'history'"),
            (history(shape=[1] * 1_000_000), 400, "history: shape must be [batch, time, n_features], got [1, 1, 1",
             "... (1,000,000 entries)"),
            (history(datatype=["FP32"] * 100_000), 400, "history: datatype ['FP32', ", "(100,000 entries) is not "
                                                                                       "supported; send FP32"),
            (history(datatype=[]), 400, "history: datatype [] is not supported", "send FP32"),  # was a 500
            (history(data=["0.5"] * 32), 400, "history: 'data' holds a string '0.5' at index 0",
             "; FP32 data must be JSON numbers"),
            (history(data=[True] * 32), 400, "history: 'data' holds a boolean (true) at index 0", "JSON numbers"),
            (history(data=[0.5] * 31 + [False]), 400, "history: 'data' holds a boolean (false) at index 31",
             "JSON numbers"),
            (history(data=[0.5] * 31 + [None]), 400, "history: 'data' holds null at index 31", "JSON numbers"),
            (history(datatype="FP64", data=[[[1, 2.5]] * 16]), 200, None, None),  # nested, ints: numbers all the same
            (history(data=[[[0.5, "x"]] * 16]), 400, "history: 'data' holds a string 'x' at index 1", "JSON numbers"),
            ({**history(), "id": "i" * 1_000_000}, 400, "'id' is 1,000,000 characters; at most 256", "answer)"),
            ({**history(), "id": "i" * 256}, 200, None, None),
            ({**history(), "outputs": [{"name": "o" * 1_000_000}]}, 400, "unknown output 'oooo",
             "... (1,000,000 characters): this model gives 'forecast'"),
        ]
        for body, status, start, end in cases:
            data = json.dumps(body).encode()
            got, answer, _ = server.infer(body=data)
            assert got == status, (got, str(answer)[:300])
            if status == 200:
                assert answer["outputs"][0]["shape"] == [1, 4] and answer.get("id") == body.get("id")
                continue
            message = answer["error"]
            assert len(message) < 300 and message.startswith(start) and message.endswith(end), message[:300]
        # an integer past float64 (the stdlib fallback after a NaN parses any length) is a 400, not a 500
        text = json.dumps(history(data=[0.5] * 31 + [7])).replace(", 7]", ", " + "9" * 400 + "]")
        got, answer, _ = server.infer(body=text.replace("0.5", "NaN", 1).encode())
        assert (got, answer["error"]) == (400, "history: 'data' holds a number beyond float64")
        status, answer, _ = server.infer(np.zeros((1, 16, 2), np.float32), model="q" * 60_000)
        assert status == 404 and answer["error"] == f"unknown model '{'q' * 56}... (60,000 characters); this server " \
                                                    "serves 'm'"
        status, answer, _ = server.get("/v2/models/m/versions/" + "7" * 60_000)
        assert status == 404 and answer["error"].startswith("version '777") and len(answer["error"]) < 200
        assert server.infer(np.zeros((1, 16, 2), np.float32))[0] == 200  # still serving
        assert 'code="500"' not in server.metrics()

    def test_min_history_below_the_lookback_never_reaches_onnx_runtime(self, served):
        server = served("--min-history", "1")
        meta = server.get("/v2/models/m")[1]
        assert meta["parameters"]["min_history"] == 16  # the model's lookback: what it takes
        for steps in (1, 3, 8):  # the LSTM's anchor failed in ORT at 1 (a 500) and wrapped around at 2-3
            status, answer, headers = server.infer(np.ones((1, steps, 2), np.float32))
            assert (status, headers["content-type"]) == (400, "application/json"), answer
            assert f"history of {steps} step(s); this model takes 16" in answer["error"]
        assert server.infer(np.ones((1, 16, 2), np.float32))[0] == 200
        assert 'onnxcast_serve_requests_total{code="5' not in server.metrics()
        log = server.log.read_text()
        assert "takes histories of at least 16 steps: --min-history 1 is raised to 16 for this version" in log
        assert "Traceback" not in log

    def test_a_model_failing_inside_onnx_runtime_is_a_counted_json_500(self, tmp_path, make_run, start_server):
        """A model that passes the load checks but fails in ORT on a request's shape (here: a
        Reshape that only fits the lookback) answers a V2 500, counted, and serving goes on."""
        import hashlib

        import onnx

        report_path = make_run("a")
        report = json.loads(report_path.read_text())
        for variant in report["models"][0]["variants"]:
            path = report_path.parent / variant["onnx_path"]
            proto = onnx.load(path)
            for node in proto.graph.node:
                node.output[:] = ["forecast_raw" if o == "forecast" else o for o in node.output]
            helper, numpy_helper = onnx.helper, onnx.numpy_helper
            proto.graph.initializer.extend([numpy_helper.from_array(np.array([-1, 32], np.int64), "flat_shape"),
                                            numpy_helper.from_array(np.float32(0), "zero")])
            proto.graph.node.extend([
                helper.make_node("Reshape", ["history", "flat_shape"], ["flat"]),  # 16 steps x 2 features only
                helper.make_node("ReduceSum", ["flat"], ["flat_sum"], keepdims=1),
                helper.make_node("Mul", ["flat_sum", "zero"], ["nothing"]),
                helper.make_node("Add", ["forecast_raw", "nothing"], ["forecast"])])
            onnx.save(proto, path)
            data = path.read_bytes()
            variant["sha256"], variant["size_bytes"] = hashlib.sha256(data).hexdigest(), len(data)
        report_path.write_text(json.dumps(report))
        store = str(tmp_path / "store")
        promote(report_path, store, "m", "cloud", version="1")
        server = start_server(store, "--max-history", "17")
        server.wait_ready("1")
        status, answer, headers = server.infer(np.ones((1, 17, 2), np.float32))
        assert (status, headers["content-type"]) == (500, "application/json"), answer
        assert answer["error"].startswith("internal error (") and answer["error"].endswith("; see the server log")
        assert "onnxruntime" not in answer["error"]  # ORT's message (shapes, node names) stays in the log
        assert server.infer(np.ones((1, 16, 2), np.float32))[0] == 200
        metrics = server.metrics()
        assert _metric(metrics, 'onnxcast_serve_requests_total{code="500",model="m",version="1"}') == 1
        assert _metric(metrics, 'onnxcast_serve_requests_total{code="200",model="m",version="1"}') == 1


class TestSlowClients:
    def test_a_stalled_body_holds_no_other_request_and_is_closed_at_the_read_timeout(self, served):
        # A batching delay of a minute: the batcher used to wait for every body still in
        # flight up to it, so the lone client's request outlived its 30 s client timeout.
        server = served("--read-timeout", "3", "--max-delay-ms", "60000")
        stalled = _connect(server.url)
        stalled.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 1000\r\n\r\n{\"inputs\": [")
        history = np.ones((1, 16, 2), np.float32)
        for _ in range(5):  # a lone client, while the stalled body is open
            assert server.infer(history)[0] == 200
        assert not select.select([stalled], [], [], 0)[0], "answered while the stalled connection was still open"
        answer = _answer_or_eof(stalled, timeout=15)
        assert answer is not None, "the server kept the stalled connection open"
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and json.loads(body) == {"error": "request not received within 3 s"}
        metrics = server.metrics()
        assert _metric(metrics, 'onnxcast_serve_connections_closed_total{model="m",reason="read_timeout"}') == 1
        assert _metric(metrics, 'onnxcast_serve_requests_total{code="200",model="m",version="1"}') == 5
        assert _metric(metrics, 'onnxcast_serve_requests_total{code="499",model="m",version="1"}') == 1

    def test_many_stalled_sockets_are_closed_within_the_timeout(self, served):
        server = served("--read-timeout", "2")
        sockets = []
        for kind in range(60):
            sock = _connect(server.url)
            if kind % 3 == 1:  # half a request line and headers
                sock.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Le")
            elif kind % 3 == 2:  # headers, then part of the body
                sock.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
            sockets.append(sock)  # kind 0: connected, nothing sent
        assert server.infer(np.ones((1, 16, 2), np.float32))[0] == 200
        still_open = [s for s in sockets if _answer_or_eof(s, timeout=12) is None]
        assert not still_open, f"{len(still_open)} of 60 stalled sockets still open"
        metrics = server.metrics()
        assert _metric(metrics, 'onnxcast_serve_connections_closed_total{model="m",reason="read_timeout"}') == 60
        for sock in sockets:
            sock.close()

    def test_connections_over_the_limit_get_a_503_and_are_closed(self, served):
        server = served("--max-connections", "4")
        held = [_connect(server.url) for _ in range(4)]
        time.sleep(0.3)  # the server has accepted them
        extra = _connect(server.url)
        answer = _answer_or_eof(extra, timeout=10)
        assert answer is not None and answer.startswith(b"HTTP/1.1 503 ")
        assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {
            "error": "over the server's limit of 4 connections; retry later"}
        for sock in held:
            sock.close()
        time.sleep(0.3)
        assert server.infer(np.ones((1, 16, 2), np.float32))[0] == 200


TOKEN = "s3cr3t-t0ken-for-the-test"
ENDPOINTS = ["/v2", "/v2/health/ready", "/v2/models/m", "/v2/models/m/ready", "/v2/models/m/versions/1",
             "/v2/models/m/versions/1/ready", "/metrics", "/openapi.json"]


class TestAuthentication:
    def test_every_endpoint_but_liveness_needs_the_token(self, tmp_path, served):
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        server = served("--token-file", str(token_file), token=TOKEN)
        body = json.dumps(infer_body(np.ones((1, 16, 2), np.float32))).encode()
        for path, data in [*((p, None) for p in ENDPOINTS), ("/v2/models/m/infer", body),
                           ("/v2/models/m/versions/1/infer", body)]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                            {"Authorization": f"Basic {TOKEN}"}):
                status, answer, got = request(server.url + path, data, headers)
                assert status == 401, (path, headers, status)
                assert set(answer) == {"error"} and got["www-authenticate"].startswith('Bearer realm="onnxcast"')
            with urllib.request.urlopen(urllib.request.Request(server.url + path, data, {
                    "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}), timeout=30) as answer:
                assert answer.status == 200, path
        assert request(server.url + "/v2/health/live")[:2] == (200, {"live": True})
        assert _metric(server.metrics(), 'onnxcast_serve_requests_total{code="401",model="m",version=""}') == 8
        assert TOKEN not in server.log.read_text()
        assert TOKEN.encode() not in Path(f"/proc/{server.process.pid}/cmdline").read_bytes()

    def test_tritonclient_sends_the_token_as_a_header(self, served):
        tritonclient_http = pytest.importorskip("tritonclient.http")
        server = served(env={"ONNXCAST_SERVE_TOKEN": TOKEN}, token=TOKEN)
        assert request(server.url + "/v2/models/m")[0] == 401
        client = tritonclient_http.InferenceServerClient(server.url.removeprefix("http://"))
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert client.is_model_ready("m", headers=auth) and not client.is_model_ready("m")
        window = np.ones((2, 16, 2), np.float32)
        tensor = tritonclient_http.InferInput("history", list(window.shape), "FP32")
        tensor.set_data_from_numpy(window)
        result = client.infer("m", [tensor], headers=auth)
        assert result.as_numpy("forecast").shape == (2, 4)
        with pytest.raises(tritonclient_http.InferenceServerException, match="authentication required"):
            client.infer("m", [tensor])
        client.close()
        assert TOKEN.encode() not in Path(f"/proc/{server.process.pid}/cmdline").read_bytes()

    def test_listening_beyond_loopback_without_a_token_is_refused(self, tmp_path):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("ONNXCAST_SERVE_TOKEN", None)
        command = [sys.executable, "-m", "onnxcast", "serve", "--store", str(tmp_path / "store"), "--model", "m",
                   "--host", "0.0.0.0", "--port", str(free_port()), "--dest", str(tmp_path / "dest")]
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
        assert done.returncode == 2
        assert done.stderr.strip() == ("error: --host 0.0.0.0 listens beyond loopback: give a bearer token with "
                                       "--token-file PATH or $ONNXCAST_SERVE_TOKEN (or listen on 127.0.0.1)")

    @pytest.mark.parametrize("content, message", [
        (None, "--token-file '{path}' does not exist"),
        (b"\n  \n", "--token-file '{path}' is empty"),
        ("tök€n".encode(), "--token-file '{path}': the token must be printable ASCII"),
        (b"two words", "the bearer token must be 1 to 4096 printable ASCII characters without spaces"),
    ])
    def test_a_bad_token_file_is_refused_in_one_line(self, tmp_path, capsys, content, message):
        from onnxcast import cli

        path = tmp_path / "token"
        if content is not None:
            path.write_bytes(content)
        assert cli.main(["serve", "--store", str(tmp_path), "--model", "m", "--token-file", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.strip() == "error: " + message.format(path=path)
        if content and content.strip():
            assert content.strip().decode(errors="replace") not in err  # the token is never echoed

    def test_a_token_lets_it_listen_on_every_interface(self, tmp_path, make_run, start_server):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "cloud", version="1")
        server = start_server(store, "--host", "0.0.0.0", env={"ONNXCAST_SERVE_TOKEN": TOKEN}, token=TOKEN)
        server.wait_ready("1")
        assert request(server.url + "/metrics")[0] == 401
        assert server.infer(np.ones((1, 16, 2), np.float32))[0] == 200

    def test_not_ready_answer_names_no_local_path(self, tmp_path, start_server):
        store = tmp_path / "store"
        server = start_server(str(store))
        _wait_for(lambda: "no such channel" in server.log.read_text(), 30, server, "a failed poll")
        for answer in (server.infer(np.ones((1, 16, 2), np.float32)), server.get("/v2/models/m")):
            status, body, _ = answer
            assert status == 503 and str(tmp_path) not in body["error"], body
            assert body["error"] == "model 'm' is not ready: no verified version loaded yet (see the server log)"


class TestFollower:
    def _pointer(self, tmp_path) -> Path:
        return tmp_path / "store/m/channels/cloud.json"

    def _promote_2_after_restoring(self, tmp_path, make_run, pointer: Path, saved: bytes) -> None:
        pointer.unlink()
        staged = pointer.with_name(".restore")
        staged.write_bytes(saved)
        os.replace(staged, pointer)  # what the operator puts back, atomically
        promote(make_run("b"), str(tmp_path / "store"), "m", "cloud", version="2")

    def test_deep_json_pointer_is_counted_and_the_old_model_keeps_serving(self, tmp_path, make_run, served):
        server = served()
        pointer = self._pointer(tmp_path)
        saved = pointer.read_bytes()
        staged = pointer.with_name(".deep")
        staged.write_bytes(b"[" * 100_000 + b"]" * 100_000)
        os.replace(staged, pointer)
        _wait_for(lambda: _poll_errors(server.metrics()) >= 2, 30, server, "two counted poll errors")
        status, body, _ = server.infer(np.ones((1, 16, 2), np.float32))
        assert (status, body["model_version"]) == (200, "1")
        log = server.log.read_text()
        assert "channel poll crashed" not in log and "Traceback" not in log
        assert "keeping version 1" in log
        self._promote_2_after_restoring(tmp_path, make_run, pointer, saved)
        server.wait_ready("2", timeout=30)

    def test_fifo_pointer_is_counted_and_a_later_promotion_is_picked_up(self, tmp_path, make_run, served):
        server = served("--poll-timeout", "1")
        pointer = self._pointer(tmp_path)
        saved = pointer.read_bytes()
        pointer.unlink()
        os.mkfifo(pointer)  # an open() for reading blocks until a writer comes: it never does
        _wait_for(lambda: _poll_errors(server.metrics()) >= 2, 30, server, "two counted poll errors")
        status, body, _ = server.infer(np.ones((1, 16, 2), np.float32))
        assert (status, body["model_version"]) == (200, "1")
        assert server.get("/v2/health/ready")[0] == 200
        self._promote_2_after_restoring(tmp_path, make_run, pointer, saved)
        server.wait_ready("2", timeout=30)
        assert "Traceback" not in server.log.read_text()
