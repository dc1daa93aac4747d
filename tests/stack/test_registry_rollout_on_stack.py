"""Registry-driven rollout on the multi-host stack: a release manager sets the alias `edge` on
a model version through MLflow's REST API (basic auth, as the MLflow UI does); the alias
watcher in the stack's triggerer asks for it, onnxcast_registry_rollout triggers
onnxcast_promote, whose tasks (gates re-checked) run on the Celery workers, and the channel
pointer in the rollout bucket moves. Prints the delays (docs/airflow.md#registry-driven-rollout).

The version comes from one small single-series training on the stack (onnxcast_promote
stages a single-series version again; the fleet model of test_training_on_stack is not
one), and a second registered version of the same files is the one the alias asks for."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import requests
from stack_support import AirflowApi, mlflow_auth, s3_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

MODEL = f"stack-alias-{uuid.uuid4().hex[:6]}"
RUN_TIMEOUT = 1500
MOVE_TIMEOUT = 1200


def _wait_run(api: AirflowApi, dag: str, run_id: str, timeout: float) -> dict:
    started = time.monotonic()
    while True:
        run = api.get(f"/api/v2/dags/{dag}/dagRuns/{run_id}").json()
        if run["state"] in ("success", "failed"):
            return run
        if time.monotonic() - started > timeout:
            pytest.fail(f"{dag} run {run_id} still {run['state']} after {timeout}s")
        time.sleep(5)


@pytest.fixture(scope="module")
def registered(stack, tmp_path_factory) -> dict:
    """One tiny single-series model trained, registered and promoted on the stack (v1)."""
    from real_series import weekly_co2_csv

    csv = weekly_co2_csv(tmp_path_factory.mktemp("alias-data") / "co2_weekly.csv")
    key = f"co2/{MODEL}.csv"
    s3_client(stack, "pipeline").upload_file(csv, stack["buckets"]["data"], key)
    conf = {"data_uri": f"s3://{stack['buckets']['data']}/{key}", "families": ["lstm"], "horizon": 12,
            "lookback": 56, "max_epochs": 1, "channels": ["edge", "cloud"], "model_name": MODEL,
            "extra_settings": {"hidden_size": 16, "num_layers": 1, "latency_repeats": 3, "patience": 1}}
    api = AirflowApi(stack, "admin")
    response = api.post(f"/api/v2/dags/{stack['training_dag']}/dagRuns", json={"logical_date": None, "conf": conf})
    assert response.status_code == 200, response.text
    run = _wait_run(api, stack["training_dag"], response.json()["dag_run_id"], RUN_TIMEOUT)
    assert run["state"] == "success", run
    return {"api": api}


def _edge_reader(stack):
    s3 = s3_client(stack, "pipeline")
    bucket = stack["buckets"]["rollout"]
    prefix = stack["onnxcast_settings"]["ONNXCAST_STORE_URI"].split(bucket, 1)[1].strip("/")
    key = f"{prefix}/{MODEL}/channels/edge.json"
    return lambda: json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())["signed"]["version"]


def _rollout_state(base: str, auth, version: str) -> dict:
    tags = requests.get(f"{base}/model-versions/get", params={"name": MODEL, "version": version}, auth=auth,
                        timeout=30).json()["model_version"].get("tags", [])
    return json.loads({t["key"]: t["value"] for t in tags}.get("onnxcast.rollout.edge", "{}"))


def test_alias_set_over_rest_moves_the_channel(stack, registered):
    base = f"{stack['mlflow_url']}/api/2.0/mlflow"
    pipeline, release = mlflow_auth(stack, "pipeline"), mlflow_auth(stack, "release")
    served = requests.get(f"{base}/registered-models/alias", params={"name": MODEL, "alias": "edge"},
                          auth=release, timeout=30)
    assert served.status_code == 200, served.text  # the training's promotion moved the channel alias too
    served = served.json()["model_version"]
    edge_version = _edge_reader(stack)
    assert edge_version() == served["version"]
    # a second version of the same trained files: one the channel does not serve
    created = requests.post(f"{base}/model-versions/create", auth=pipeline, timeout=30,
                            json={"name": MODEL, "source": served["source"], "run_id": served["run_id"],
                                  # MLflow 3: a logged model's source (models:/<model_id>) needs its id
                                  **({"model_id": served["source"].removeprefix("models:/")}
                                     if served["source"].startswith("models:/") else {})})
    assert created.status_code == 200, created.text
    version = created.json()["model_version"]["version"]
    time.sleep(5)  # a poll finds nothing to do: the alias still names the served version

    api = registered["api"]
    alias_set = time.time()
    moved = requests.post(f"{base}/registered-models/alias", auth=release, timeout=30,
                          json={"name": MODEL, "alias": "edge", "version": version})
    assert moved.status_code == 200, moved.text
    run, started, channel_moved = None, None, None
    deadline = time.monotonic() + MOVE_TIMEOUT
    while time.monotonic() < deadline and channel_moved is None:
        if started is None:
            runs = api.get("/api/v2/dags/onnxcast_promote/dagRuns",
                           params={"order_by": "-run_after", "limit": 50}).json().get("dag_runs", [])
            run = next((r for r in runs if r["dag_run_id"].startswith(f"registry__{MODEL}__edge__v{version}__")),
                       None)
            if run is not None and run.get("start_date"):
                started = time.time()
        if edge_version() == version:
            channel_moved = time.time()
        time.sleep(1)
    assert channel_moved is not None, f"edge still serves v{edge_version()} after {MOVE_TIMEOUT}s (run {run})"
    run = _wait_run(api, "onnxcast_promote", run["dag_run_id"], 300)
    print(f"\nregistry rollout on the stack: alias set -> promote run started {started - alias_set:.1f} s "
          f"-> channel moved {channel_moved - alias_set:.1f} s (promote run {run['dag_run_id']}: {run['state']})")
    assert run["state"] == "success", run
    state = _rollout_state(base, release, version)
    assert (state.get("state"), state.get("source"), state.get("run_id")) == ("deployed", "registry",
                                                                               run["dag_run_id"]), state
    alias = requests.get(f"{base}/registered-models/alias", params={"name": MODEL, "alias": "edge"}, auth=release,
                         timeout=30).json()["model_version"]["version"]
    assert alias == version
    # the dispatcher ran once for it: one promote run, no duplicate
    runs = api.get("/api/v2/dags/onnxcast_promote/dagRuns", params={"limit": 100}).json()["dag_runs"]
    assert len([r for r in runs if r["dag_run_id"].startswith(f"registry__{MODEL}__edge__")]) == 1
