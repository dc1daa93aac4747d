"""The V2 codec and the batcher as small functions (the HTTP behaviour is in test_serve.py)."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import orjson
import pytest

from onnxcast.serving.batching import Batcher
from onnxcast.serving.model import ServedModel
from onnxcast.serving.protocol import Limits, RequestError, decode_request, encode_response

LIMITS = Limits(n_features=2, min_history=16, max_history=24, max_batch=8)


def _binary(history: np.ndarray, **tensor_extra) -> tuple[bytes, str]:
    raw = history.astype("<f4").tobytes()
    header = json.dumps({"inputs": [{"name": "history", "datatype": "FP32", "shape": list(history.shape),
                                     "parameters": {"binary_data_size": len(raw), **tensor_extra}}],
                         "outputs": [{"name": "forecast", "parameters": {"binary_data": True}}]}).encode()
    return header + raw, str(len(header))


class TestProtocol:
    def test_binary_round_trip(self):
        history = np.random.default_rng(0).normal(size=(3, 16, 2)).astype(np.float32)
        body, length = _binary(history)
        request = decode_request(body, length, LIMITS)
        assert request.binary_output and np.array_equal(request.history, history)
        forecast = np.arange(12, dtype=np.float32).reshape(3, 4)
        payload, headers = encode_response("m", "7", "abc", forecast, binary=True)
        size = int(headers["inference-header-content-length"])
        header = orjson.loads(payload[:size])
        assert header["model_version"] == "7" and header["id"] == "abc"
        assert header["outputs"][0]["parameters"]["binary_data_size"] == 48
        assert np.array_equal(np.frombuffer(payload[size:], "<f4").reshape(3, 4), forecast)

    @pytest.mark.parametrize("body, length, message", [
        (b"{}", "x", "Inference-Header-Content-Length 'x' is not an integer"),
        (b"{}", "99", "outside the body's 2 bytes"),
        (*_binary(np.zeros((1, 16, 2), np.float32), binary_data_size=4), "binary_data_size 4 does not match"),
    ])
    def test_binary_errors(self, body, length, message):
        with pytest.raises(RequestError, match=message):
            decode_request(body, length, LIMITS)

    def test_history_range_and_fp64(self):
        body = {"inputs": [{"name": "history", "datatype": "FP64", "shape": [1, 24, 2], "data": [1.5] * 48}]}
        request = decode_request(json.dumps(body).encode(), None, LIMITS)
        assert request.history.dtype == np.float32 and request.history.shape == (1, 24, 2)
        body["inputs"][0].update(shape=[1, 25, 2], data=[1.5] * 50)
        with pytest.raises(RequestError, match="history of 25 step"):
            decode_request(json.dumps(body).encode(), None, LIMITS)

    @pytest.mark.parametrize("shape, size, message", [
        # holds no values (a 0 dimension) but numpy cannot make it: schemathesis found a 500 here
        ([2**62 + 1, 0, 2**62 + 1], 0, "4611686018427387905 feature"),
        ([2**62 + 1, 16, 2], 0, "batch of 4611686018427387905 histories"),
        ([1, 2**62, 2], 0, "history of 4611686018427387904 step"),
        ([0, 16, 2], 0, "batch is 0"),
    ])
    def test_the_shape_is_checked_before_any_data_is_read(self, shape, size, message):
        for tensor in ({"parameters": {"binary_data_size": size}}, {"data": []}):
            body = {"inputs": [{"name": "history", "datatype": "FP16", "shape": shape, **tensor}]}
            with pytest.raises(RequestError, match=message):
                decode_request(json.dumps(body).encode(), None, LIMITS)

    def test_outputs_default_to_every_output_and_the_request_chooses(self):
        history = np.zeros((1, 16, 2), np.float32)
        both = ("forecast", "quantiles")

        def decode(**extra):
            body = json.dumps({"inputs": [{"name": "history", "datatype": "FP32", "shape": [1, 16, 2],
                                           "data": [0.0] * 32}], **extra}).encode()
            return [(o.name, o.binary) for o in decode_request(body, None, LIMITS, both).outputs]

        assert decode() == [("forecast", False), ("quantiles", False)]
        assert decode(outputs=[]) == [("forecast", False), ("quantiles", False)]
        assert decode(parameters={"binary_data_output": True}) == [("forecast", True), ("quantiles", True)]
        assert decode(outputs=[{"name": "quantiles"}]) == [("quantiles", False)]
        assert decode(outputs=[{"name": "quantiles", "parameters": {"binary_data": True}}, {"name": "forecast"}]) \
            == [("quantiles", True), ("forecast", False)]
        with pytest.raises(RequestError, match="unknown output 'q': this model gives 'forecast' and 'quantiles'$"):
            decode(outputs=[{"name": "q"}])
        with pytest.raises(RequestError, match="output 'forecast' is named twice"):
            decode(outputs=[{"name": "forecast"}, {"name": "forecast"}])
        with pytest.raises(RequestError, match="unknown output 'quantiles': this model gives 'forecast'$"):
            decode_request(json.dumps({**infer_json(history), "outputs": [{"name": "quantiles"}]}).encode(), None,
                           LIMITS)

    def test_mixed_binary_and_json_outputs(self):
        """A binary output's bytes follow the header; a JSON one stays in it (as Triton answers)."""
        from onnxcast.serving.protocol import RequestedOutput

        forecast = np.arange(8, dtype=np.float32).reshape(2, 4)
        quantiles = np.arange(40, dtype=np.float32).reshape(2, 4, 5)
        payload, headers = encode_response("m", "1", None, {"forecast": forecast, "quantiles": quantiles},
                                           (RequestedOutput("quantiles", True), RequestedOutput("forecast", False)))
        size = int(headers["inference-header-content-length"])
        header = orjson.loads(payload[:size])
        assert [(o["name"], o["shape"]) for o in header["outputs"]] == [("quantiles", [2, 4, 5]), ("forecast", [2, 4])]
        assert header["outputs"][0]["parameters"] == {"binary_data_size": 160} and "data" not in header["outputs"][0]
        assert header["outputs"][1]["data"] == forecast.ravel().tolist()
        assert np.array_equal(np.frombuffer(payload[size:], "<f4").reshape(2, 4, 5), quantiles)


def infer_json(history: np.ndarray) -> dict:
    return {"inputs": [{"name": "history", "datatype": "FP32", "shape": list(history.shape),
                        "data": history.ravel().tolist()}]}


class _Recorder:
    """A stand-in model that records the batch size of every call."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []

    def run(self, history):
        self.calls.append(history.shape[:2])
        time.sleep(0.01)
        return history[:, -4:, 0] * 1.0


def _model(recorder: _Recorder) -> ServedModel:
    model = ServedModel("m", "1", "a.onnx", "00", None, 16, 4, 2, ("y", "x1"))
    object.__setattr__(model, "run", recorder.run)
    return model


class TestBatcher:
    def test_coalesces_up_to_the_batch_size_and_never_mixes_history_lengths(self):
        recorder = _Recorder()
        model = _model(recorder)

        async def scenario():
            batcher = Batcher(lambda: model, max_batch_size=4, max_delay=0.05)
            await batcher.start()
            histories = [np.full((1, 16 if i % 2 else 20, 2), i, np.float32) for i in range(10)]
            results = await asyncio.gather(*(batcher.submit(h) for h in histories))
            await batcher.stop()
            return histories, results

        histories, results = asyncio.run(scenario())
        for history, (outputs, version) in zip(histories, results, strict=True):
            assert version == "1" and list(outputs) == ["forecast"]
            assert np.array_equal(outputs["forecast"], history[:, -4:, 0])
        assert all(rows <= 4 for rows, _ in recorder.calls) and sum(r for r, _ in recorder.calls) == 10
        assert len(recorder.calls) < 10  # coalesced

    def test_every_output_is_cut_to_its_requests_rows(self):
        """A model with quantiles: each request of a coalesced batch gets its own rows of both."""
        class TwoOutputs:
            def run(self, history, feed=None):
                if feed is not None:  # session.run(names, {"history": x})
                    history = feed["history"]
                    forecast = history[:, -4:, 0] * 1.0
                    return [forecast, forecast[:, :, None] + np.arange(5, dtype=np.float32)]
                raise AssertionError("the batcher runs every output in one call")

        model = ServedModel("m", "1", "a.onnx", "00", TwoOutputs(), 16, 4, 2, ("y", "x1"), levels=(0.1, 0.3, 0.5, 0.7, 0.9))

        async def scenario():
            batcher = Batcher(lambda: model, max_batch_size=8, max_delay=0.05)
            await batcher.start()
            histories = [np.full((1 + i % 2, 16, 2), i, np.float32) for i in range(6)]
            results = await asyncio.gather(*(batcher.submit(h) for h in histories))
            await batcher.stop()
            return histories, results

        histories, results = asyncio.run(scenario())
        for history, (outputs, version) in zip(histories, results, strict=True):
            assert list(outputs) == ["forecast", "quantiles"] and version == "1"
            assert np.array_equal(outputs["forecast"], history[:, -4:, 0])
            assert np.array_equal(outputs["quantiles"], history[:, -4:, 0, None] + np.arange(5))

    def test_a_lone_request_is_not_delayed(self):
        recorder = _Recorder()
        model = _model(recorder)

        async def scenario():
            batcher = Batcher(lambda: model, max_batch_size=64, max_delay=5.0)
            await batcher.start()
            started = time.perf_counter()
            await batcher.submit(np.zeros((1, 16, 2), np.float32))
            elapsed = time.perf_counter() - started
            await batcher.stop()
            return elapsed

        assert asyncio.run(scenario()) < 1.0  # nothing else on its way: no 5 s wait


class TestFollowerTimeout:
    """The channel follower's poll thread and timeout, with a pull that blocks until released
    (as an ``open()`` on a FIFO did): the over-the-wire version is in test_serve_hardening.py."""

    def test_a_stuck_poll_is_counted_never_doubled_and_the_next_one_runs_once_it_returns(self, tmp_path,
                                                                                            monkeypatch, caplog):
        import threading

        from onnxcast.serving import model as served_model

        release, calls, errors = threading.Event(), [], []

        def stuck_pull(*args, **kwargs):
            calls.append(time.monotonic())
            release.wait(30)

        monkeypatch.setattr(served_model, "pull", stuck_pull)
        follower = served_model.ChannelFollower("unused", "m", "cloud", tmp_path, timeout=0.2,
                                                on_poll_error=errors.append)
        follower.poll_with_timeout()
        assert (len(calls), errors) == (1, ["PollTimeout"])
        assert "did not return within 0.2 s" in follower.last_error
        follower.poll_with_timeout()  # the first is still stuck: no second pull beside it
        assert (len(calls), errors) == (1, ["PollTimeout", "PollTimeout"])
        release.set()
        follower._polling.join(5)
        follower.poll_with_timeout()
        assert len(calls) == 2 and len(errors) == 2  # a poll that returns in time is no error
        assert sum("did not return" in r.getMessage() for r in caplog.records) == 1

    def test_an_untyped_poll_error_is_one_counted_line(self, tmp_path, monkeypatch, caplog):
        from onnxcast.serving import model as served_model

        def deep(*args, **kwargs):
            return json.loads(b"[" * 100_000)

        monkeypatch.setattr(served_model, "pull", deep)
        errors = []
        follower = served_model.ChannelFollower("unused", "m", "cloud", tmp_path, on_poll_error=errors.append)
        follower.poll_with_timeout()
        assert errors == ["RecursionError"]
        warnings = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and warnings[0].exc_info is None
        assert "poll failed (RecursionError: maximum recursion depth exceeded" in warnings[0].getMessage()
