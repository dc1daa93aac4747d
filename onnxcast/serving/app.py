"""The HTTP service: Open Inference Protocol (KServe V2) endpoints over FastAPI + uvicorn,
Prometheus metrics, readiness tied to a verified model, graceful shutdown.

Inference bodies are read and decoded by hand (no per-request pydantic model): the OpenAPI
document still describes them (``openapi_extra``), so clients and fuzzers see the contract.
"""

from __future__ import annotations

import logging
import re
import time
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import (  # module level: FastAPI resolves the handlers' annotations here
    Request,
    Response,
)

from onnxcast.contract import INPUT_NAME, OUTPUT_NAME
from onnxcast.errors import ConfigError
from onnxcast.serving.batching import Batcher, NotReadyError
from onnxcast.serving.model import ChannelFollower, ServedModel
from onnxcast.serving.protocol import (
    HEADER_LENGTH,
    Limits,
    RequestError,
    decode_request,
    encode_response,
    error_body,
)

log = logging.getLogger(__name__)
SERVER_NAME = "onnxcast"
INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
JSON = "application/json"


@dataclass(frozen=True)
class ServeSettings:
    """Settings of ``onnxcast serve``, checked once here."""

    store: str
    model: str
    channel: str = "cloud"
    dest: Path = Path(".onnxcast/serve")
    host: str = "127.0.0.1"
    port: int = 8080
    poll_interval: float = 10.0
    max_batch_size: int = 64
    max_delay_ms: float = 5.0
    threads: int = 1
    min_history: int | None = None  # default: the model's lookback
    max_history: int | None = None
    max_request_batch: int = 1024
    max_body_bytes: int = 64 * 1024 * 1024
    graceful_timeout: float = 30.0
    trust: Path | None = None  # trust root file; None: $ONNXCAST_TRUST or dest/trust/root.json

    def __post_init__(self):
        checks = [("port", self.port, 0, 65535), ("max_batch_size", self.max_batch_size, 1, 1 << 16),
                  ("threads", self.threads, 1, 256), ("max_request_batch", self.max_request_batch, 1, 1 << 20)]
        for name, value, low, high in checks:
            if not low <= value <= high:
                raise ConfigError(f"{name} must be between {low} and {high}, got {value}")
        for name in ("poll_interval", "max_delay_ms", "graceful_timeout"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.min_history is not None and self.min_history < 1:
            raise ConfigError(f"min_history must be >= 1, got {self.min_history}")
        if None not in (self.min_history, self.max_history) and self.max_history < self.min_history:
            raise ConfigError(f"max_history {self.max_history} is below min_history {self.min_history}")


class Metrics:
    """Prometheus series of one service (own registry: several apps may live in one process)."""

    def __init__(self, model: str):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.model = model
        self.requests = Counter("onnxcast_serve_requests", "Inference requests answered, by HTTP code and "
                                "the model version that answered", ["model", "version", "code"], registry=self.registry)
        self.latency = Histogram("onnxcast_serve_request_seconds", "Inference request latency (body read to "
                                 "response)", ["model"], registry=self.registry,
                                 buckets=(.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5))
        self.batch_histories = Histogram("onnxcast_serve_batch_histories", "Histories per ONNX Runtime call",
                                         ["model"], registry=self.registry,
                                         buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.batch_requests = Histogram("onnxcast_serve_batch_requests", "Requests coalesced per ONNX Runtime "
                                        "call", ["model"], registry=self.registry,
                                        buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self.version = Gauge("onnxcast_serve_model_version_info", "1 for the version being served",
                             ["model", "version", "sha256"], registry=self.registry)
        self.swaps = Counter("onnxcast_serve_swaps", "Model versions swapped in", ["model"], registry=self.registry)
        self.poll_errors = Counter("onnxcast_serve_poll_errors", "Channel polls refused or failed (the "
                                   "loaded model keeps serving)", ["model", "error"], registry=self.registry)
        self.ready = Gauge("onnxcast_serve_ready", "1 once a verified model is loaded", ["model"],
                           registry=self.registry)

    def swapped(self, old: ServedModel | None, new: ServedModel) -> None:
        if old is not None:
            self.version.remove(self.model, old.version, old.sha256)
        self.version.labels(self.model, new.version, new.sha256).set(1)
        self.swaps.labels(self.model).inc()
        self.ready.labels(self.model).set(1)

    def batch(self, rows: int, requests: int, version: str) -> None:
        self.batch_histories.labels(self.model).observe(rows)
        self.batch_requests.labels(self.model).observe(requests)


def create_app(settings: ServeSettings, follower: ChannelFollower | None = None):
    """The FastAPI application; ``follower`` defaults to one following ``settings``' channel."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from onnxcast.serving import openapi

    metrics = Metrics(settings.model)
    follower = follower or ChannelFollower(
        settings.store, settings.model, settings.channel, settings.dest, interval=settings.poll_interval,
        threads=settings.threads, on_swap=metrics.swapped, trust=settings.trust,
        on_poll_error=lambda error: metrics.poll_errors.labels(settings.model, error).inc())
    batcher = Batcher(lambda: follower.current, max_batch_size=settings.max_batch_size,
                      max_delay=settings.max_delay_ms / 1000, observe=metrics.batch)

    @asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        follower.start()  # the first poll runs in the follower's thread: live at once, ready when loaded
        log.info("onnxcast serve: %s channel %s from %s on http://%s:%s", settings.model, settings.channel,
                 settings.store, settings.host, settings.port)
        yield
        log.info("shutting down: finishing queued requests")
        follower.stop()
        await batcher.stop()

    app = FastAPI(title="onnxcast serve", version="2", lifespan=lifespan,
                  description="Open Inference Protocol (KServe V2) for onnxcast forecasters", docs_url=None,
                  redoc_url=None)
    app.state.follower, app.state.batcher, app.state.metrics = follower, batcher, metrics

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):  # V2 errors are {"error": ...}
        return Response(error_body(str(exc.detail)), exc.status_code, headers=exc.headers, media_type=JSON)

    def error(status: int, message: str, version: str | None = None) -> Response:
        headers = {"x-model-version": version} if version else None
        return Response(error_body(message), status, headers=headers, media_type=JSON)

    def served(name: str, version: str | None = None) -> ServedModel | Response:
        if name != settings.model:
            return error(404, f"unknown model {name!r}; this server serves {settings.model!r}")
        model = follower.current
        if model is None:
            return error(503, f"model {name!r} is not ready: no verified version loaded yet"
                              + (f" ({follower.last_error})" if follower.last_error else ""))
        if version is not None and version != model.version:
            return error(404, f"version {version!r} of {name!r} is not served; serving {model.version!r}",
                         model.version)
        return model

    @app.get("/v2/health/live", **openapi.health("live"))
    async def live():
        return {"live": True}

    @app.get("/v2/health/ready", **openapi.health("ready"))
    async def ready():
        if follower.current is None:
            return JSONResponse({"ready": False}, 503)
        return {"ready": True}

    @app.get("/v2", **openapi.SERVER_METADATA)
    async def server_metadata():
        return {"name": SERVER_NAME, "version": _onnxcast_version(), "extensions": ["binary_tensor_data"]}

    async def model_metadata(name: str, version: str | None = None):
        model = served(name, version)
        if isinstance(model, Response):
            return model
        return JSONResponse({
            "name": model.name, "versions": [model.version], "platform": "onnxruntime_onnx",
            "inputs": [{"name": INPUT_NAME, "datatype": "FP32", "shape": [-1, -1, model.n_features]}],
            "outputs": [{"name": OUTPUT_NAME, "datatype": "FP32", "shape": [-1, model.horizon]}],
            "parameters": {"channel": settings.channel, "sha256": model.sha256, "artifact": model.artifact,
                           "columns": list(model.columns), "lookback": model.lookback,
                           "horizon": model.horizon, **_limits_of(model, settings).__dict__}},
            headers={"x-model-version": model.version})

    async def model_ready(name: str, version: str | None = None):
        model = served(name, version)
        if isinstance(model, Response):
            return model
        return JSONResponse({"name": name, "ready": True}, headers={"x-model-version": model.version})

    async def handle_infer(name: str, version: str | None, headers: dict[str, str],
                           read_body) -> tuple[int, dict[str, str], bytes]:
        """One inference request: (status, headers, body). ``headers`` have lower-case names."""
        started = time.perf_counter()
        batcher.arriving += 1  # the batcher waits (up to its delay bound) for requests on their way
        arriving = True
        try:
            model = served(name, version)
            if isinstance(model, Response):
                status, payload = model.status_code, model.body
                extra = {k: v for k, v in model.headers.items() if k != "content-length"}
            else:
                length = headers.get("content-length", "")
                if length.isdigit() and int(length) > settings.max_body_bytes:
                    raise RequestError(f"request body of {length} bytes is over the {settings.max_body_bytes} "
                                       "limit", 413)
                body = await read_body()
                decoded = decode_request(body, headers.get(HEADER_LENGTH), _limits_of(model, settings))
                batcher.arriving -= 1
                arriving = False
                forecast, answered_by = await batcher.submit(decoded.history)
                payload, extra = encode_response(name, answered_by, decoded.id, forecast, decoded.binary_output)
                extra["content-type"] = "application/octet-stream" if decoded.binary_output else JSON
                status = 200
        except RequestError as exc:
            status, extra, payload = exc.status, {"x-model-version": model.version}, error_body(str(exc))
        except NotReadyError as exc:
            status, extra, payload = 503, {}, error_body(str(exc))
        finally:
            if arriving:
                batcher.arriving -= 1
        extra.setdefault("content-type", JSON)
        metrics.requests.labels(settings.model, extra.get("x-model-version", ""), str(status)).inc()
        if status == 200:
            metrics.latency.labels(settings.model).observe(time.perf_counter() - started)
        return status, extra, payload

    async def infer(request: Request, name: str, version: str | None = None):
        status, headers, payload = await handle_infer(name, version, dict(request.headers), request.body)
        return Response(payload, status, headers=headers)

    app.state.handle_infer, app.state.max_body_bytes = handle_infer, settings.max_body_bytes
    app.get("/v2/models/{name}", **openapi.MODEL_METADATA)(model_metadata)
    app.get("/v2/models/{name}/versions/{version}", **openapi.MODEL_METADATA)(model_metadata)
    app.get("/v2/models/{name}/ready", **openapi.MODEL_READY)(model_ready)
    app.get("/v2/models/{name}/versions/{version}/ready", **openapi.MODEL_READY)(model_ready)
    app.post("/v2/models/{name}/infer", **openapi.INFER)(infer)
    app.post("/v2/models/{name}/versions/{version}/infer", **openapi.INFER)(infer)

    @app.get("/metrics", **openapi.METRICS)
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def serve(settings: ServeSettings) -> None:
    """Run the service until SIGINT/SIGTERM; then stop accepting, answer what is in flight, exit."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextmanager
        def capture_signals(self):
            with super().capture_signals():
                yield
                # uvicorn re-raises SIGTERM after a graceful shutdown (exit -15); a finished
                # drain is a clean exit for the service, so it ends with 0.
                self._captured_signals.clear()

    app = FastInferPath(create_app(settings))
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=settings.graceful_timeout,
                            loop="auto", http="auto", lifespan="on")
    Server(config).run()


class FastInferPath:
    """ASGI wrapper: ``POST /v2/models/{name}[/versions/{v}]/infer`` goes straight to the
    handler, everything else (and the OpenAPI description of infer) to FastAPI. Skipping
    routing, the Request/Response objects and the middleware stack saves about a third of
    the service's CPU time per small request (docs/serving.md)."""

    def __init__(self, app):
        self.app = app
        self.handle = app.state.handle_infer
        self.max_body_bytes = app.state.max_body_bytes

    async def __call__(self, scope, receive, send):
        match = INFER_PATH.fullmatch(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}

        async def read_body() -> bytes:
            chunks, more, size = [], True, 0
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise RequestError("client went away", 499)
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                if size > self.max_body_bytes:  # chunked bodies carry no Content-Length to check first
                    raise RequestError(f"request body is over the {self.max_body_bytes} bytes limit", 413)
                more = message.get("more_body", False)
            return b"".join(chunks)

        status, extra, payload = await self.handle(match["name"], match["version"], headers, read_body)
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status,
                    "headers": [*raw, (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


def _limits_of(model: ServedModel, settings: ServeSettings) -> Limits:
    low = settings.min_history or model.lookback
    high = settings.max_history or max(low, model.lookback)
    return Limits(model.n_features, low, high, settings.max_request_batch)


def _onnxcast_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onnxcast")
    except PackageNotFoundError:
        return "0"


