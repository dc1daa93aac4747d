"""`make bench-serve`: ``onnxcast serve`` against ``mlflow models serve`` of the same model.

Usage::

    .venv/bin/python bench/serve.py                      # 10 s per cell, concurrency 1, 8, 64
    .venv/bin/python bench/serve.py --duration 2 --quick # smoke mode (seconds)
    .venv/bin/python bench/serve.py --kserve-python .venv-kserve/bin/python   # add KServe's server
    .venv/bin/python bench/serve.py --fleet-only --duration 3   # only the fleet batches (below)

One ONNX forecaster (the production LSTM size: lookback 168, horizon 24, 2 layers of 64, one
column; untrained weights: latency does not depend on them) is promoted to the ``cloud``
channel of a local rollout store and registered in a temporary MLflow registry (SQLite). Both
servers run on loopback; a bounded asyncio load generator (fixed duration, fixed maximum of
requests, one history per request: "many small clients") measures forecasts/s, p50/p99
latency and errors at each concurrency. A last run moves the channel to a second version in
the middle (``onnxcast serve`` only) and records errors and which version answered.
Fleet batches (a global model forecasting a fleet: one request holds many series, batch =
series): one client sends requests of ``--fleet-batches`` histories (1, 64, 1,024, 4,096) to
``onnxcast serve --max-request-batch 4096``, as JSON and as binary tensors (the V2 binary
extension, what tritonclient sends), and reports forecasts/s (series forecast a second)
and the latency of one request. ``--fleet-only`` runs just that and merges it into the
existing results (the other figures keep their own date).
Writes ``bench/serve-results.json`` and ``bench/serve-results.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "bench-forecaster"
LOOKBACK, HORIZON = 168, 24
CONCURRENCY = (1, 8, 64)
FLEET_BATCHES = (1, 64, 1024, 4096)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per cell (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; a cell reports its median "
                        "(lower middle) round (default 2)")
    parser.add_argument("--max-requests", type=int, default=200_000, help="requests per cell at most")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument("--mlflow-workers", default="1,2", help="uvicorn workers of 'mlflow models serve' to run "
                        "(default 1 (MLflow's default) and 2 (one a core))")
    parser.add_argument("--kserve-python", help="a Python with kserve installed: also measure KServe's model server")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "serve-results.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "bench" / "serve-results.md")
    parser.add_argument("--quick", action="store_true", help="smoke mode: concurrency 1 and 8, MLflow 1 worker")
    parser.add_argument("--fleet-batches", default=",".join(map(str, FLEET_BATCHES)),
                        help="histories (series) per request of the fleet runs (default 1,64,1024,4096; empty: none)")
    parser.add_argument("--fleet-only", action="store_true", help="only the fleet runs, merged into the existing "
                        "results files")
    args = parser.parse_args(argv)
    fleet_batches = [int(b) for b in args.fleet_batches.split(",") if b]
    if args.fleet_only:
        work = Path(tempfile.mkdtemp(prefix="onnxcast-bench-serve-"))
        try:
            fleet = fleet_run(work, fleet_batches, args.duration)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        report = json.loads(args.results.read_text()) if args.results.exists() else None
        if report is None:
            print(fleet_markdown(fleet))
            args.results.write_text(json.dumps({"fleet": fleet}, indent=2) + "\n")
            return 0
        report["fleet"] = fleet
        args.results.write_text(json.dumps(report, indent=2) + "\n")
        args.markdown.write_text(markdown(report))
        print(fleet_markdown(fleet))
        return 0
    concurrency = [int(c) for c in args.concurrency.split(",")]
    mlflow_workers = [int(w) for w in args.mlflow_workers.split(",") if w]
    if args.quick:
        concurrency, mlflow_workers, args.rounds = [1, 8], [1], 1
    work = Path(tempfile.mkdtemp(prefix="onnxcast-bench-serve-"))
    try:
        report = run(work, concurrency, mlflow_workers, args)
        if fleet_batches:
            report["fleet"] = fleet_run(work, fleet_batches, args.duration)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.results.write_text(json.dumps(report, indent=2) + "\n")
    args.markdown.write_text(markdown(report))
    print(markdown(report))
    return 0


def run(work: Path, concurrency: list[int], mlflow_workers: list[int], args) -> dict:
    from onnxcast.rollout.promote import promote

    use_throwaway_key(work / "keys")
    model_v1 = make_model(work / "v1.onnx", shift=0.0)
    model_v2 = make_model(work / "v2.onnx", shift=1.0)
    store = work / "store"
    promote(make_report(work / "run-1", model_v1), str(store), MODEL, "cloud", version="1", actor="bench")
    registry = register_in_mlflow(work, model_v1)
    history = np.random.default_rng(0).normal(100, 10, size=(1, LOOKBACK, 1)).astype(np.float32)
    bodies = {
        "onnxcast": (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{
            "name": "history", "datatype": "FP32", "shape": [1, LOOKBACK, 1],
            "data": history.ravel().tolist()}]}).encode()),
        "mlflow": ("/invocations", json.dumps({"inputs": {"history": history.tolist()}}).encode()),
        "kserve": (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{
            "name": "history", "datatype": "FP32", "shape": [1, LOOKBACK, 1],
            "data": history.ravel().tolist()}]}).encode()),
    }
    servers = {"onnxcast": lambda port: start_onnxcast(work, store, port)}
    for workers in mlflow_workers:
        servers[f"mlflow-{workers}w"] = lambda port, w=workers: start_mlflow(work, registry, port, w)
    if args.kserve_python:
        servers["kserve"] = lambda port: start_kserve(args.kserve_python, model_v1, port)
    running: dict[str, tuple[subprocess.Popen, str, bytes]] = {}
    try:
        for name, start in servers.items():  # all up at once; idle ones cost nothing
            port = free_port()
            process = start(port)
            running[name] = (process, f"http://127.0.0.1:{port}", b"")
            try:
                wait_ready(running[name][1], "/health" if name.startswith("mlflow") else "/v2/health/ready", process)
            except RuntimeError:
                for log_file in work.glob(f"*-{port}.log"):
                    print(log_file.read_text()[-3000:], file=sys.stderr)
                raise
            path, body = bodies[name.split("-")[0]]
            running[name] = (process, running[name][1] + path, body)
            run_load(running[name][1], body, 4, 1.0, 1000)  # warm-up
        # Rounds of interleaved cells: a burst of load from other processes on these shared
        # machines hits every server alike; each cell reports its median round.
        cells: dict[tuple[str, int], list[dict]] = {}
        for round_ in range(args.rounds):
            for c in concurrency:
                for name, (_, url, body) in running.items():
                    result = run_load(url, body, c, args.duration, args.max_requests)
                    cells.setdefault((name, c), []).append(result)
                    print(f"round {round_ + 1} {name:>12} c={c:<3} {result['forecasts_per_s']:8.1f}/s "
                          f"p50 {result['p50_ms']:.2f} ms p99 {result['p99_ms']:.2f} ms errors {result['errors']}",
                          flush=True)
    finally:
        for process, _, _ in running.values():
            stop(process)
    rows = []
    for (name, c), results in cells.items():
        ranked = sorted(results, key=lambda r: r["forecasts_per_s"])
        median = ranked[(len(ranked) - 1) // 2]
        rows.append({"server": name, "concurrency": c, **median,
                     "rounds_forecasts_per_s": [r["forecasts_per_s"] for r in results],
                     "errors_all_rounds": sum(r["errors"] for r in results)})
    swap = swap_run(work, store, model_v2, history, bodies["onnxcast"], concurrency=8,
                    duration=max(args.duration, 4.0), max_requests=args.max_requests)
    return {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": machine(),
            "commit": git_commit(), "model": {"family": "lstm", "variant": "fp32", "lookback": LOOKBACK,
                                              "horizon": HORIZON, "n_features": 1, "hidden_size": 64,
                                              "num_layers": 2},
            "duration_s": args.duration, "rounds": args.rounds, "request": "one history [1, 168, 1] per request, JSON",
            "onnxcast_settings": {"max_batch_size": 64, "max_delay_ms": 5, "threads": 1},
            "rows": rows, "ratios": ratios(rows), "swap": swap}


# --- the model and the two registries ------------------------------------------------------

def make_model(path: Path, shift: float) -> Path:
    """The production-size LSTM forecaster, exported by onnxcast; ``shift`` is added to its
    forecast (an Add after the graph) so two versions answer differently."""
    import onnx

    from onnxcast.pipeline.export import export_onnx
    from onnxcast.pipeline.models import ModelSpec, build_model

    spec = ModelSpec(family="lstm", n_features=1, horizon=HORIZON, lookback=LOOKBACK, season=24)
    model = build_model(spec, np.array([100.0]), np.array([10.0]))
    metadata = {"model_family": "lstm", "lookback": LOOKBACK, "horizon": HORIZON, "freq": "h", "target": "y",
                "features": "", "precision": "fp32", "trained_until": f"bench/{shift}",
                "dataset_sha256": "00" * 32}
    export_onnx(model, path, n_features=1, lookback=LOOKBACK, metadata=metadata)
    proto = onnx.load(path)
    for node in proto.graph.node:
        node.output[:] = ["forecast_unshifted" if o == "forecast" else o for o in node.output]
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.float32(shift), "forecast_shift"))
    proto.graph.node.append(onnx.helper.make_node("Add", ["forecast_unshifted", "forecast_shift"], ["forecast"]))
    onnx.save(proto, path)
    return path


def make_report(out: Path, model: Path) -> Path:
    """A run folder with report.json selecting ``model`` for both channels (what promote reads)."""
    target = out / "models" / "lstm" / "onnx" / "fp32.onnx"
    target.parent.mkdir(parents=True)
    shutil.copy(model, target)
    data = target.read_bytes()
    variant = {"name": "fp32", "onnx_path": str(target.relative_to(out)), "sha256": hashlib.sha256(data).hexdigest(),
               "size_bytes": len(data), "opset": 17, "parity_max_abs_diff": 0.0,
               "holdout": {"mae": 1.0, "rmse": 1.0, "smape": 1.0, "mase": 1.0},
               "latency_ms": {"batch1_p50": 0.3, "batch1_p95": 0.4, "batch64_p50": 13.0},
               "gates": {}, "eligible": True, "reasons": []}
    report = {"onnxcast_version": "bench", "created": "2026-11-30T00:00:00Z", "status": "passed",
              "dataset": {"uri": "bench", "sha256": "00" * 32, "rows": 0, "start": "", "end": "", "freq": "h",
                          "target": "y", "features": []},
              "split": {}, "baselines": {"seasonal_naive": {"season": 24, "mae": 1, "rmse": 1, "smape": 1, "mase": 1}},
              "models": [{"family": "lstm", "gates_passed": True, "variants": [variant]}],
              "selected": {"cloud": {"family": "lstm", "variant": "fp32"}}}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return out / "report.json"


def use_throwaway_key(folder: Path) -> None:
    """Sign the bench's promotions with a key made for this run (in its temporary folder, removed
    with it) and let ``onnxcast serve`` trust it: a benchmark needs no release key of the user's,
    and must never sign with one (`make bench-serve` failed with "no signing key" before)."""
    from onnxcast.rollout.signing import SIGNING_KEY_ENV, TRUST_ENV, generate_key

    files = generate_key(folder)
    # promote() here and the `onnxcast serve` subprocesses read these
    os.environ[SIGNING_KEY_ENV] = str(files["private"])
    os.environ[TRUST_ENV] = str(files["root"])


def register_in_mlflow(work: Path, model: Path) -> str:
    """Register ``model`` as version 1 of MODEL in a SQLite MLflow store; returns the tracking URI."""
    import mlflow
    import onnx
    import onnxruntime as ort
    from mlflow.models import infer_signature

    uri = f"sqlite:///{work / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("bench-serve")
    x = np.zeros((2, LOOKBACK, 1), np.float32)
    y = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"history": x})[0]
    with mlflow.start_run():
        mlflow.onnx.log_model(onnx.load(model), name="model", registered_model_name=MODEL,
                              signature=infer_signature({"history": x}, {"forecast": y}),
                              onnx_execution_providers=["CPUExecutionProvider"], save_as_external_data=False)
    return uri


# --- servers -------------------------------------------------------------------------------

def start_onnxcast(work: Path, store: Path, port: int, poll_interval: float = 10.0,
                   extra: tuple[str, ...] = ()) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "onnxcast", "serve", "--store", str(store), "--model", MODEL,
                             "--channel", "cloud", "--port", str(port), "--dest", str(work / f"serve-{port}"),
                             "--poll-interval", str(poll_interval), *extra], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=open(work / f"serve-{port}.log", "w"))


def start_mlflow(work: Path, tracking_uri: str, port: int, workers: int) -> subprocess.Popen:
    mlflow = Path(sys.executable).with_name("mlflow")
    # MLflow execs 'uvicorn' by name: the environment's bin folder must be on PATH.
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "OMP_NUM_THREADS": "1",
           "PATH": os.pathsep.join([str(mlflow.parent), os.environ.get("PATH", "")])}
    return subprocess.Popen([str(mlflow), "models", "serve", "-m", f"models:/{MODEL}/1", "--env-manager", "local",
                             "--host", "127.0.0.1", "-p", str(port), "--workers", str(workers)], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(work / f"mlflow-{port}.log", "w"))


def start_kserve(python: str, model: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen([python, str(ROOT / "bench" / "kserve_server.py"), str(model), MODEL, str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_ready(base: str, path: str, process: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before {base}{path} was ready")
        try:
            with urllib.request.urlopen(base + path, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{base}{path} not ready in {timeout} s")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


# --- the load generator --------------------------------------------------------------------

class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that sends a prepared request and reads the answer
    (status, headers, Content-Length body). Lean on purpose: the load generator shares the
    servers' cores, so every microsecond it spends is taken from the server under test."""

    def __init__(self):
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None or self.waiter.done():
            return
        head = bytes(self.buffer[:end]).decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        body = bytes(self.buffer[end + 4:end + 4 + length])
        del self.buffer[:end + 4 + length]
        self.waiter.set_result((int(head[9:12]), head, body))

    def connection_lost(self, exc):
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection closed"))

    async def send(self, request: bytes, timeout: float = 30.0):
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await asyncio.wait_for(self.waiter, timeout)


async def load(url: str, body: bytes, concurrency: int, duration: float, max_requests: int,
               on_response=None) -> dict:
    """``concurrency`` clients, each sending ``body`` back to back on its own connection for
    ``duration`` seconds (at most ``max_requests`` in all). Latency is per request; errors
    are answers other than 200 and requests with no answer."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    request = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    latencies: list[float] = []
    errors: dict[str, int] = {}
    sent = 0
    loop = asyncio.get_running_loop()
    deadline = time.perf_counter() + duration

    async def client():
        nonlocal sent
        connection = None
        while time.perf_counter() < deadline and sent < max_requests:
            sent += 1
            started = time.perf_counter()
            try:
                if connection is None:
                    _, connection = await loop.create_connection(_Connection, parts.hostname, parts.port)
                status, head, payload = await connection.send(request)
            except (OSError, TimeoutError) as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                if connection is not None:
                    connection.transport.close()
                connection = None
                continue
            if status != 200:
                errors[str(status)] = errors.get(str(status), 0) + 1
                continue
            latencies.append(time.perf_counter() - started)
            if on_response is not None:
                on_response(time.perf_counter(), head, payload)
        if connection is not None:
            connection.transport.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ms = np.array(latencies) * 1000 if latencies else np.array([float("nan")])
    return {"requests": sent, "ok": len(latencies), "errors": sum(errors.values()), "error_kinds": errors,
            "seconds": round(elapsed, 3), "forecasts_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3)}


def run_load(*args, **kwargs) -> dict:
    """``load`` on uvloop when it is installed (a cheaper client loop)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(load(*args, **kwargs))
    return uvloop.run(load(*args, **kwargs))


def swap_run(work: Path, store: Path, model_v2: Path, history: np.ndarray, request: tuple[str, bytes], *,
             concurrency: int, duration: float, max_requests: int) -> dict:
    """Load ``onnxcast serve`` while the channel moves to version 2 halfway; every response is
    checked against the numbers of the version it names."""
    import threading

    import onnxruntime as ort

    from onnxcast.rollout.promote import promote

    expected = {"1": None, "2": None}
    for version, path in (("1", work / "v1.onnx"), ("2", model_v2)):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        expected[version] = session.run(["forecast"], {"history": history})[0].ravel()
    port = free_port()
    process = start_onnxcast(work, store, port, poll_interval=0.5)
    seen: list[tuple[float, str, bool]] = []

    def on_response(at, head, payload):
        body = json.loads(payload)
        version = body["model_version"]
        numbers_match = np.allclose(body["outputs"][0]["data"], expected[version], rtol=1e-5, atol=1e-4)
        seen.append((at, version, numbers_match and f"\r\nx-model-version: {version}\r\n" in head + "\r\n"))

    moved = {}

    def move():
        time.sleep(duration / 2)
        moved["at"] = time.perf_counter()
        promote(make_report(work / "run-2", model_v2), str(store), MODEL, "cloud", version="2", actor="bench")
        moved["promoted_in_s"] = time.perf_counter() - moved["at"]

    try:
        wait_ready(f"http://127.0.0.1:{port}", "/v2/health/ready", process)
        url = f"http://127.0.0.1:{port}{request[0]}"
        mover = threading.Thread(target=move)
        mover.start()
        result = run_load(url, request[1], concurrency, duration, max_requests, on_response)
        mover.join()
    finally:
        stop(process)
    first_v2 = next((at for at, version, _ in seen if version == "2"), None)
    last_v1 = max((at for at, version, _ in seen if version == "1"), default=None)
    return {"concurrency": concurrency, **result,
            "answered_by": {v: sum(1 for _, version, _ in seen if version == v) for v in ("1", "2")},
            "wrong_numbers_or_headers": sum(1 for *_, ok in seen if not ok),
            "first_v2_after_promote_s": None if first_v2 is None else round(first_v2 - moved["at"], 3),
            "last_v1_after_promote_s": None if last_v1 is None else round(last_v1 - moved["at"], 3),
            "poll_interval_s": 0.5}


# --- fleet batches -------------------------------------------------------------------------

def fleet_run(work: Path, batches: list[int], duration: float) -> dict:
    """Forecasts/s of ``onnxcast serve`` when one client sends whole fleets: requests of
    ``batch`` histories [batch, LOOKBACK, 1], JSON and binary, back to back for ``duration``
    seconds each (at least 2 requests, after one warm-up request). Each answer's shape is checked, and the first of each
    cell against ONNX Runtime run in this process on the same histories."""
    import onnxruntime as ort

    from onnxcast.rollout.promote import promote

    use_throwaway_key(work / "fleet-keys")  # never the user's release key
    model = work / "v1.onnx"
    if not model.exists():
        make_model(model, shift=0.0)
    store = work / "fleet-store"
    promote(make_report(work / "fleet-run", model), str(store), MODEL, "cloud", version="1", actor="bench")
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    largest = max(batches)
    port = free_port()
    process = start_onnxcast(work, store, port, extra=("--max-request-batch", str(largest)))
    rows = []
    rng = np.random.default_rng(0)
    try:
        wait_ready(f"http://127.0.0.1:{port}", "/v2/health/ready", process)
        for batch in batches:
            history = rng.normal(100, 10, size=(batch, LOOKBACK, 1)).astype(np.float32)
            expected = session.run(["forecast"], {"history": history})[0]
            for encoding in ("json", "binary"):
                rows.append({"batch": batch, "encoding": encoding,
                             **_fleet_cell(port, history, expected, encoding, duration)})
                r = rows[-1]
                print(f"fleet batch {batch:>5} {encoding:>6} {r['forecasts_per_s']:10.1f} forecasts/s "
                      f"p50 {r['p50_ms']:.1f} ms ({r['requests']} requests, {r['request_bytes']:,} bytes each)",
                      flush=True)
    finally:
        stop(process)
    return {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": machine(),
            "commit": git_commit(), "duration_s": duration, "concurrency": 1,
            "onnxcast_settings": {"max_request_batch": largest, "max_batch_size": 64, "threads": 1},
            "rows": rows}


def _fleet_cell(port: int, history: np.ndarray, expected: np.ndarray, encoding: str, duration: float) -> dict:
    import http.client

    shape = list(history.shape)
    headers = {"Content-Type": "application/json"}
    if encoding == "json":
        body = json.dumps({"inputs": [{"name": "history", "datatype": "FP32", "shape": shape,
                                       "data": history.ravel().tolist()}]}).encode()
    else:
        header = json.dumps({"inputs": [{"name": "history", "datatype": "FP32", "shape": shape,
                                         "parameters": {"binary_data_size": history.nbytes}}],
                             "outputs": [{"name": "forecast", "parameters": {"binary_data": True}}]}).encode()
        body = header + history.tobytes()
        headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    latencies, checked = [], False
    try:
        connection.request("POST", f"/v2/models/{MODEL}/infer", body, headers)  # warm-up: ORT allocates
        connection.getresponse().read()  # for a new batch size on its first run
        started = time.perf_counter()
        while time.perf_counter() - started < duration or len(latencies) < 2:
            sent = time.perf_counter()
            connection.request("POST", f"/v2/models/{MODEL}/infer", body, headers)
            response = connection.getresponse()
            payload = response.read()
            if response.status != 200:
                raise RuntimeError(f"batch {len(history)} {encoding}: HTTP {response.status}: {payload[:200]!r}")
            latencies.append(time.perf_counter() - sent)
            if not checked:
                if encoding == "json":
                    forecast = np.array(json.loads(payload)["outputs"][0]["data"], np.float32)
                else:
                    size = int(response.getheader("Inference-Header-Content-Length"))
                    forecast = np.frombuffer(payload[size:], dtype="<f4")
                np.testing.assert_allclose(forecast.reshape(expected.shape), expected, rtol=1e-5, atol=1e-4)
                checked = True
    finally:
        connection.close()
    elapsed = time.perf_counter() - started
    ms = np.array(latencies) * 1000
    return {"requests": len(latencies), "request_bytes": len(body), "seconds": round(elapsed, 3),
            "forecasts_per_s": round(len(latencies) * len(history) / elapsed, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 3), "max_ms": round(float(ms.max()), 3)}


def fleet_markdown(fleet: dict) -> str:
    lines = ["## Fleet batches (one client, batch = series)", "",
             f"{fleet['date']}, commit {fleet['commit']}, {fleet['machine']}. One client sends requests of "
             f"`batch` histories [batch, {LOOKBACK}, 1] back to back for {fleet['duration_s']:g} s a cell to "
             f"`onnxcast serve --max-request-batch {fleet['onnxcast_settings']['max_request_batch']}` (1 ORT "
             "thread); forecasts/s counts series forecast a second. Same model as above.", "",
             "| batch | encoding | forecasts/s | p50 ms a request | requests | bytes a request |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in fleet["rows"]:
        lines.append(f"| {r['batch']:,} | {r['encoding']} | {r['forecasts_per_s']:,.0f} | {r['p50_ms']:.1f} | "
                     f"{r['requests']} | {r['request_bytes']:,} |")
    return "\n".join(lines) + "\n"


# --- results -------------------------------------------------------------------------------

def ratios(rows: list[dict]) -> dict:
    by = {(r["server"], r["concurrency"]): r for r in rows}
    out = {}
    for (server, c), row in by.items():
        if server == "onnxcast":
            continue
        ours = by.get(("onnxcast", c))
        if ours and row["forecasts_per_s"]:
            out[f"onnxcast/{server} c={c}"] = round(ours["forecasts_per_s"] / row["forecasts_per_s"], 2)
    return out


def markdown(report: dict) -> str:
    if "rows" not in report:  # --fleet-only without earlier results
        return fleet_markdown(report["fleet"])
    lines = [f"# `make bench-serve` ({report['date']})", "",
             f"Machine: {report['machine']}. Commit {report['commit']}. {report['duration_s']:g} s per cell, "
             f"{report['rounds']} interleaved rounds (each cell: its lower-median round; all rounds' forecasts/s in "
             "the last column), "
             f"{report['request']}; model: LSTM fp32, lookback {LOOKBACK}, horizon {HORIZON}. The load generator "
             "runs on the same cores as the servers. Other work shared this machine during the run: "
             "compare only figures of the same run.", "",
             "| server | concurrency | forecasts/s | p50 ms | p99 ms | errors (all rounds) | forecasts/s by round |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in sorted(report["rows"], key=lambda r: (r["concurrency"], r["server"])):
        lines.append(f"| {r['server']} | {r['concurrency']} | {r['forecasts_per_s']:.0f} | {r['p50_ms']:.2f} | "
                     f"{r['p99_ms']:.2f} | {r['errors_all_rounds']} | "
                     f"{', '.join(f'{x:.0f}' for x in r['rounds_forecasts_per_s'])} |")
    lines += ["", "Ratios of forecasts/s (same run): " + ", ".join(f"{k}: {v}x" for k, v in report["ratios"].items()),
              "", "## Channel move in the middle (onnxcast serve)", ""]
    s = report["swap"]
    lines += [f"Concurrency {s['concurrency']}, {s['seconds']:g} s, channel moved from version 1 to 2 halfway "
              f"(poll interval {s['poll_interval_s']} s): {s['ok']} answered, {s['errors']} failed "
              f"({s['error_kinds'] or 'none'}), {s['wrong_numbers_or_headers']} with numbers or header not "
              f"those of the version named; answered by version 1: {s['answered_by']['1']}, version 2: "
              f"{s['answered_by']['2']}; first version-2 answer {s['first_v2_after_promote_s']} s after the "
              f"promotion started, last version-1 answer {s['last_v1_after_promote_s']} s after; "
              f"{s['forecasts_per_s']:.0f} forecasts/s, p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms.", ""]
    if "fleet" in report:
        lines += [fleet_markdown(report["fleet"])]
    return "\n".join(lines)


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average {load:.1f} at start"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
