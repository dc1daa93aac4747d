"""The HTTP service: Open Inference Protocol (KServe V2) endpoints over FastAPI + uvicorn,
Prometheus metrics, readiness tied to a verified model, graceful shutdown.

Inference bodies are read and decoded by hand (no per-request pydantic model): the OpenAPI
document still describes them (``openapi_extra``), so clients and fuzzers see the contract.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
import time
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import (  # module level: FastAPI resolves the handlers' annotations here
    Request,
    Response,
)
from fastapi.responses import JSONResponse

from onnxcast.base.contract import INPUT_NAME, OUTPUT_NAME, QUANTILES_NAME
from onnxcast.base.errors import ConfigError
from onnxcast.serving import openapi
from onnxcast.serving.batching import Batcher, NotReadyError
from onnxcast.serving.model import ChannelFollower, ServedModel
from onnxcast.serving.protocol import (
    HEADER_LENGTH,
    Limits,
    RequestError,
    decode_request,
    encode_response,
    error_body,
    shown,
)

log = logging.getLogger(__name__)
SERVER_NAME = "onnxcast"
INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
JSON = "application/json"
LIVENESS = "/v2/health/live"  # the one endpoint open without a token: probes need no secret
TOKEN_ENV = "ONNXCAST_SERVE_TOKEN"


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
    # Bearer token every endpoint but the liveness probe requires; None: no authentication,
    # allowed on loopback only. Never printed (repr=False), never taken from the command line.
    token: str | None = field(default=None, repr=False)
    read_timeout: float = 10.0  # seconds a client has to send a whole request (headers and body)
    keep_alive_timeout: float = 5.0  # idle seconds before a keep-alive connection is closed
    max_connections: int = 1024
    poll_timeout: float = 60.0  # seconds a channel poll may take before it is reported as stuck

    def __post_init__(self):
        checks = [("port", self.port, 0, 65535), ("max_batch_size", self.max_batch_size, 1, 1 << 16),
                  ("threads", self.threads, 1, 256), ("max_request_batch", self.max_request_batch, 1, 1 << 20),
                  ("max_connections", self.max_connections, 1, 1 << 20)]
        for name, value, low, high in checks:
            if not low <= value <= high:
                raise ConfigError(f"{name} must be between {low} and {high}, got {value}")
        for name in ("poll_interval", "max_delay_ms", "graceful_timeout"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("read_timeout", "keep_alive_timeout", "poll_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.token is not None and (not 0 < len(self.token) <= 4096 or not self.token.isascii()
                                       or not self.token.isprintable() or " " in self.token):
            raise ConfigError("the bearer token must be 1 to 4096 printable ASCII characters without spaces")
        if self.token is None and not is_loopback(self.host):
            raise ConfigError(f"--host {self.host} listens beyond loopback: give a bearer token with --token-file "
                              f"PATH or ${TOKEN_ENV} (or listen on 127.0.0.1)")
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
        self.closed = Counter("onnxcast_serve_connections_closed", "Connections the server closed: a request "
                              "not received in time, or over the connection limit", ["model", "reason"],
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


def create_app(settings: ServeSettings, follower: ChannelFollower | None = None) -> ServeASGI:
    """The ASGI application (``ServeASGI``: the token check and the infer fast path around the
    FastAPI app, so no caller can serve the endpoints without them); ``follower`` defaults to
    one following ``settings``' channel."""
    from fastapi import FastAPI

    plane = DataPlane(settings, follower)
    app = FastAPI(title="onnxcast serve", version="2", lifespan=plane.lifespan,
                  description="Open Inference Protocol (KServe V2) for onnxcast forecasters", docs_url=None,
                  redoc_url=None)
    V2Endpoints(plane).register(app)
    return ServeASGI(app, plane)


class ModelUnavailable(Exception):
    """The request names a model or version this server does not serve now (404), or no
    verified version is loaded yet (503); ``version`` is the one serving, when there is one."""

    def __init__(self, status: int, message: str, version: str | None = None) -> None:
        super().__init__(message)
        self.status, self.version = status, version

    def headers(self) -> dict[str, str]:
        return {"x-model-version": self.version} if self.version else {}


class DataPlane:
    """What the endpoints answer, without HTTP: the model the channel follower serves, the
    batcher in front of ONNX Runtime, the metrics, the bearer token (KServe's DataPlane)."""

    def __init__(self, settings: ServeSettings, follower: ChannelFollower | None = None) -> None:
        self.settings = settings
        self.metrics = metrics = Metrics(settings.model)
        self.follower = follower or ChannelFollower(
            settings.store, settings.model, settings.channel, settings.dest, interval=settings.poll_interval,
            threads=settings.threads, on_swap=metrics.swapped, trust=settings.trust, timeout=settings.poll_timeout,
            min_history=settings.min_history,
            on_poll_error=lambda error: metrics.poll_errors.labels(settings.model, error).inc())
        self.batcher = Batcher(lambda: self.follower.current, max_batch_size=settings.max_batch_size,
                               max_delay=settings.max_delay_ms / 1000, observe=metrics.batch)

    @asynccontextmanager
    async def lifespan(self, app):
        settings = self.settings
        await self.batcher.start()
        self.follower.start()  # the first poll runs in the follower's thread: live at once, ready when loaded
        log.info("onnxcast serve: %s channel %s from %s on http://%s:%s", settings.model, settings.channel,
                 settings.store, settings.host, settings.port)
        yield
        log.info("shutting down: finishing queued requests")
        self.follower.stop()
        await self.batcher.stop()

    @property
    def ready(self) -> bool:
        return self.follower.current is not None

    def served(self, name: str, version: str | None = None) -> ServedModel:
        """The model serving ``name`` (at ``version`` when given); ModelUnavailable otherwise."""
        if name != self.settings.model:
            raise ModelUnavailable(404, f"unknown model {shown(name)}; this server serves {self.settings.model!r}")
        model = self.follower.current
        if model is None:  # why is in the log and poll_errors_total: its message names local paths
            raise ModelUnavailable(503, f"model {name!r} is not ready: no verified version loaded yet (see the "
                                        "server log)")
        if version is not None and version != model.version:
            raise ModelUnavailable(404, f"version {shown(version)} of {name!r} is not served; serving "
                                        f"{model.version!r}", model.version)
        return model

    def model_metadata(self, model: ServedModel) -> dict:
        settings = self.settings
        return {
            "name": model.name, "versions": [model.version], "platform": "onnxruntime_onnx",
            "inputs": [{"name": INPUT_NAME, "datatype": "FP32", "shape": [-1, -1, model.n_features]}],
            "outputs": output_metadata(model),
            "parameters": {"channel": settings.channel, "sha256": model.sha256, "artifact": model.artifact,
                           "columns": list(model.columns), "lookback": model.lookback,
                           "horizon": model.horizon, **_limits_of(model, settings).__dict__,
                           "max_body_bytes": settings.max_body_bytes, **fleet_parameters(model.metadata),
                           **({"quantile_levels": list(model.levels)} if model.levels else {})}}

    async def infer(self, name: str, version: str | None, headers: dict[str, str],
                    read_body) -> tuple[int, dict[str, str], bytes]:
        """One inference request: (status, headers, body), counted in the metrics. ``headers``
        have lower-case names."""
        started = time.perf_counter()
        model = None
        try:
            model = self.served(name, version)
            extra, payload = await self._forecast(model, name, headers, read_body)
            status = 200
        except ModelUnavailable as exc:
            status, extra, payload = exc.status, exc.headers(), error_body(str(exc))
        except RequestError as exc:
            status, extra, payload = exc.status, {"x-model-version": model.version}, error_body(str(exc))
        except NotReadyError as exc:
            status, extra, payload = 503, {}, error_body(str(exc))
        except Exception as exc:  # a bug or an ONNX Runtime failure: a V2 500, counted; the trace in the log
            log.exception("inference request failed")
            status, extra = 500, {"x-model-version": model.version} if isinstance(model, ServedModel) else {}
            payload = error_body(f"internal error ({type(exc).__name__}); see the server log")
        extra.setdefault("content-type", JSON)
        self.metrics.requests.labels(self.settings.model, extra.get("x-model-version", ""), str(status)).inc()
        if status == 200:
            self.metrics.latency.labels(self.settings.model).observe(time.perf_counter() - started)
        return status, extra, payload

    async def _forecast(self, model: ServedModel, name: str, headers: dict[str, str],
                        read_body) -> tuple[dict[str, str], bytes]:
        """Read and decode the body, run it in the next batch, encode the answer."""
        limit = self.settings.max_body_bytes
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise RequestError(f"request body of {length} bytes is over the {limit} limit", 413)
        body = await read_body()
        decoded = decode_request(body, headers.get(HEADER_LENGTH), _limits_of(model, self.settings), model.outputs)
        results, answered_by = await self.batcher.submit(decoded.history)
        missing = [o.name for o in decoded.outputs if o.name not in results]
        if missing:  # a new version without that output came in between (a rollback): retry
            raise NotReadyError(f"version {answered_by} has no output {', '.join(missing)}: "
                                "the model changed while the request waited; retry")
        payload, extra = encode_response(name, answered_by, decoded.id, results, decoded.outputs)
        extra["content-type"] = "application/octet-stream" if decoded.binary_output else JSON
        return extra, payload

    def unauthorized(self, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes] | None:
        """None when the request may go on; else the 401 to answer (compared in constant time)."""
        token = self.settings.token
        if token is None:
            return None
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
            return None
        if scheme:
            challenge, message = 'Bearer realm="onnxcast", error="invalid_token"', "the bearer token is not valid"
        else:
            challenge, message = 'Bearer realm="onnxcast"', "authentication required: send Authorization: Bearer <token>"
        return 401, {"www-authenticate": challenge, "content-type": JSON}, error_body(message)


class V2Endpoints:
    """The KServe V2 REST endpoints over a DataPlane, registered on a FastAPI app; errors are
    mapped to V2 error bodies in one place (``register``'s exception handlers)."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def register(self, app) -> None:
        from starlette.exceptions import HTTPException as StarletteHTTPException

        app.add_exception_handler(StarletteHTTPException, http_error)
        app.add_exception_handler(ModelUnavailable, model_unavailable)
        app.add_exception_handler(Exception, server_error)
        app.get("/v2/health/live", **openapi.health("live"))(self.live)
        app.get("/v2/health/ready", **openapi.health("ready"))(self.ready)
        app.get("/v2", **openapi.SERVER_METADATA)(self.server_metadata)
        paths = ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")
        for path in paths:
            app.get(path, **openapi.MODEL_METADATA)(self.model_metadata)
        for path in paths:
            app.get(f"{path}/ready", **openapi.MODEL_READY)(self.model_ready)
        for path in paths:
            app.post(f"{path}/infer", **openapi.INFER)(self.infer)
        app.get("/metrics", **openapi.METRICS)(self.prometheus)

    async def live(self):
        return {"live": True}

    async def ready(self):
        return {"ready": True} if self.plane.ready else JSONResponse({"ready": False}, 503)

    async def server_metadata(self):
        return {"name": SERVER_NAME, "version": _onnxcast_version(), "extensions": ["binary_tensor_data"]}

    async def model_metadata(self, name: str, version: str | None = None):
        model = self.plane.served(name, version)
        return JSONResponse(self.plane.model_metadata(model), headers={"x-model-version": model.version})

    async def model_ready(self, name: str, version: str | None = None):
        model = self.plane.served(name, version)
        return JSONResponse({"name": name, "ready": True}, headers={"x-model-version": model.version})

    async def infer(self, request: Request, name: str, version: str | None = None):
        status, headers, payload = await self.plane.infer(name, version, dict(request.headers), request.body)
        return Response(payload, status, headers=headers)

    async def prometheus(self):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(self.plane.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def http_error(request: Request, exc: Exception) -> Response:
    """V2 errors are ``{"error": ...}``: FastAPI's own 404/405/422 too."""
    return Response(error_body(str(exc.detail)), exc.status_code, headers=exc.headers, media_type=JSON)


async def model_unavailable(request: Request, exc: Exception) -> Response:
    return Response(error_body(str(exc)), exc.status, headers=exc.headers() or None, media_type=JSON)


async def server_error(request: Request, exc: Exception) -> Response:
    """A bug: still a V2 error, never a traceback."""
    return Response(error_body(f"internal error ({type(exc).__name__}); see the server log"), 500, media_type=JSON)


def serve(settings: ServeSettings) -> None:
    """Run the service until SIGINT/SIGTERM; then stop accepting, answer what is in flight, exit."""
    import uvicorn

    from onnxcast.serving.connections import guarded_protocol

    class Server(uvicorn.Server):
        @contextmanager
        def capture_signals(self):
            with super().capture_signals():
                yield
                # uvicorn re-raises SIGTERM after a graceful shutdown (exit -15); a finished
                # drain is a clean exit for the service, so it ends with 0.
                self._captured_signals.clear()

    app = create_app(settings)
    metrics = app.metrics
    protocol = guarded_protocol(read_timeout=settings.read_timeout, max_connections=settings.max_connections,
                                on_close=lambda reason: metrics.closed.labels(settings.model, reason).inc())
    # limit_concurrency is uvicorn's own bound on connections + tasks (a plain-text 503); the
    # guard above refuses connections first, so this only catches tasks outliving theirs.
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=settings.graceful_timeout,
                            timeout_keep_alive=settings.keep_alive_timeout,
                            limit_concurrency=settings.max_connections + 1,
                            loop="auto", http=protocol, lifespan="on")
    Server(config).run()


class ServeASGI:
    """ASGI wrapper around the FastAPI app: the bearer-token check for every endpoint but
    the liveness probe, and the fast path:
    ``POST /v2/models/{name}[/versions/{v}]/infer`` goes straight to the handler, everything
    else (and the OpenAPI description of infer) to FastAPI. Skipping routing, the
    Request/Response objects and the middleware stack saves about a third of the service's
    CPU time per small request (docs/serving.md)."""

    def __init__(self, app, plane: DataPlane):
        self.app = app
        self.handle = plane.infer
        self.unauthorized = plane.unauthorized
        self.metrics: Metrics = plane.metrics
        self.max_body_bytes = plane.settings.max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        match = INFER_PATH.fullmatch(scope["path"]) if scope["method"] == "POST" else None
        refused = None if scope["path"] == LIVENESS else self.unauthorized(headers)
        if refused is not None:
            if match is not None:  # every inference answer is counted, refused ones included
                self.metrics.requests.labels(self.metrics.model, "", "401").inc()
            return await _respond(send, *refused)
        if match is None:
            return await self.app(scope, receive, send)

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

        await _respond(send, *await self.handle(match["name"], match["version"], headers, read_body))


async def _respond(send, status: int, extra: dict[str, str], payload: bytes) -> None:
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [*raw, (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1): nobody else can connect."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another name: it may resolve to any interface


def output_metadata(model: ServedModel) -> list[dict]:
    """The V2 tensor metadata of the model's outputs: ``forecast [-1, horizon]`` and, with
    quantiles, ``quantiles [-1, horizon, Q]`` (the levels are in the model's parameters:
    V2 tensor metadata holds only name, datatype and shape)."""
    shapes = {OUTPUT_NAME: [-1, model.horizon], QUANTILES_NAME: [-1, model.horizon, len(model.levels)]}
    return [{"name": name, "datatype": "FP32", "shape": shapes[name]} for name in model.outputs]


def fleet_parameters(metadata: dict[str, str]) -> dict:
    """What a client of a global (fleet) model needs from its ONNX metadata: ``global``
    (onnxcast.global), ``n_series`` it was trained over and its ``series_column``, for the
    model metadata's parameters; the keys a model does not have are left out. A fleet is
    served as batch = series: one request's ``history`` holds one row per series."""
    out: dict = {}
    if "global" in metadata:
        out["global"] = metadata["global"].strip().lower() == "true"
    if metadata.get("n_series", "").isdigit():
        out["n_series"] = int(metadata["n_series"])
    if metadata.get("series_column"):
        out["series_column"] = metadata["series_column"][:100]
    return out


def _limits_of(model: ServedModel, settings: ServeSettings) -> Limits:
    # --min-history never goes below what the version takes (load_installed logged it once)
    low = max(settings.min_history or model.lookback, model.min_history)
    high = settings.max_history or max(low, model.lookback)
    return Limits(model.n_features, low, high, settings.max_request_batch)


def _onnxcast_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onnxcast")
    except PackageNotFoundError:
        return "0"


