"""The same training and promotion against real servers over HTTP: an `mlflow server`
process (SQLite backend, proxied artifacts) and the moto S3 server holding the rollout
store. Airflow reaches both through the `mlflow_default` and `aws_default` connections."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import airflow_support
import pytest

pytestmark = pytest.mark.slow

MODEL = "server-forecaster"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a free loopback port, SQLite backend and artifacts in tmp."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    log = open(root / "server.log", "wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "AIRFLOW"))}
    process = subprocess.Popen(
        [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--serve-artifacts",
         "--artifacts-destination", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield url
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()


@pytest.fixture
def connections(mlflow_server, s3_env, s3_bucket, monkeypatch):
    """Airflow connections as production sets them (through AIRFLOW_CONN_* here)."""
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps({"conn_type": "http", "host": mlflow_server}))
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": s3_env, "region_name": "us-east-1"}}))
    return mlflow_server, s3_bucket


def test_training_dag_promotes_through_mlflow_server_and_s3(connections):
    import boto3
    import mlflow
    from airflow.dag_processing.dagbag import DagBag

    tracking, bucket = connections
    airflow_support.ensure_db()
    dag = DagBag(dag_folder=str(airflow_support.REPO / "dags" / "onnxcast_training.py")).dags["onnxcast_training"]
    conf = {**airflow_support.TINY, "families": ["lstm"], "model_name": MODEL,
            "store_uri": f"s3://{bucket}/rollout"}
    run = dag.test(run_conf=conf)
    states = airflow_support.task_states(run)
    assert set(states.values()) == {"success"}, states

    client = mlflow.MlflowClient(tracking_uri=tracking, registry_uri=tracking)
    version = client.get_model_version_by_alias(MODEL, "champion")
    assert str(version.version) == str(airflow_support.xcom(run, "register")["version"])
    artifacts = {a.path for a in client.list_artifacts(version.run_id)}
    assert {"onnx", "pytorch", "validation.json"} <= artifacts
    link = airflow_support.xcom(run, "register", "_link_MlflowRunLink")
    assert link.startswith(f"{tracking}/#/experiments/")

    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    prefix = f"rollout/{MODEL}/versions/{version.version}"
    envelope = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read())
    assert envelope["signatures"], "the manifest is signed (the embedded mode's development key)"
    manifest = envelope["signed"]
    for name, entry in manifest["artifacts"].items():
        obj = s3.get_object(Bucket=bucket, Key=f"{prefix}/{name}")
        assert hashlib.sha256(obj["Body"].read()).hexdigest() == entry["sha256"]
        assert obj["ServerSideEncryption"] == "AES256"
    edge = json.loads(s3.get_object(Bucket=bucket, Key=f"rollout/{MODEL}/channels/edge.json")["Body"].read())["signed"]
    assert edge["version"] == str(version.version)
    assert manifest["mlflow"]["version"] == str(version.version)
    assert "testing" not in json.dumps(manifest["mlflow"])  # no credentials in the manifest
