"""onnxcast_training on the multi-host stack, as a user runs it: real data uploaded to S3, a run
triggered through the REST API with a token, tasks spread over two Celery worker hosts that
share no disk. Afterwards the champion is in the MLflow server, the signed rollout (manifest and
models) in the rollout bucket, and MLflow's artifacts in its own bucket."""

from __future__ import annotations

import time
import uuid

import pytest
import requests
from stack_support import AirflowApi, mlflow_auth, s3_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

RUN_TIMEOUT = 2400  # two tiny families on 2 cores, every task on a worker that re-parses the DAG
MODEL = f"stack-e2e-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def training_run(stack, tmp_path_factory) -> dict:
    """One triggered run, waited for; returns the run and its task instances."""
    from real_series import weekly_co2_csv

    csv = weekly_co2_csv(tmp_path_factory.mktemp("stack-data") / "co2_weekly.csv")
    key = f"co2/{MODEL}.csv"
    s3_client(stack, "pipeline").upload_file(csv, stack["buckets"]["data"], key)
    conf = {
        "data_uri": f"s3://{stack['buckets']['data']}/{key}",
        "families": ["nhits", "dlinear"],
        "horizon": 12,
        "lookback": 56,
        "max_epochs": 2,
        "channels": ["edge", "cloud"],
        "model_name": MODEL,
        "extra_settings": {"hidden_size": 16, "num_layers": 1, "d_model": 16, "n_heads": 2,
                           "latency_repeats": 3, "patience": 2},
    }
    api = AirflowApi(stack, "admin")
    dag = stack["training_dag"]
    response = api.post(f"/api/v2/dags/{dag}/dagRuns", json={"logical_date": None, "conf": conf})
    assert response.status_code == 200, response.text
    run_id = response.json()["dag_run_id"]
    started = time.monotonic()
    while True:
        run = api.get(f"/api/v2/dags/{dag}/dagRuns/{run_id}").json()
        if run["state"] in ("success", "failed"):
            break
        if time.monotonic() - started > RUN_TIMEOUT:
            pytest.fail(f"run {run_id} still {run['state']} after {RUN_TIMEOUT}s")
        time.sleep(10)
    instances = api.get(f"/api/v2/dags/{dag}/dagRuns/{run_id}/taskInstances",
                        params={"limit": 100}).json()["task_instances"]
    table = "\n".join(f"  {_label(t):28} {t['state'] or '-':16} {t['hostname'] or '-'}"
                      for t in sorted(instances, key=lambda t: (t["start_date"] or "~", _label(t))))
    print(f"\n{dag} {run_id}: {run['state']} in {time.monotonic() - started:.0f}s\n{table}")
    return {"run": run, "instances": instances, "api": api, "table": table,
            "seconds": round(time.monotonic() - started)}


def _label(ti: dict) -> str:
    return ti["task_id"] if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]"


def _failure_details(training_run: dict) -> str:
    """The first error lines of each failed task (from the task logs in S3), for the assertion."""
    api, run = training_run["api"], training_run["run"]
    lines = [training_run["table"]]
    for ti in training_run["instances"]:
        if ti["state"] != "failed":
            continue
        path = (f"/api/v2/dags/{run['dag_id']}/dagRuns/{run['dag_run_id']}/taskInstances/{ti['task_id']}"
                f"/logs/{max(ti['try_number'], 1)}")
        log = api.get(path, params={"map_index": ti["map_index"]}, headers={"Accept": "application/json"})
        errors = [e for e in log.json().get("content", []) if e.get("level") == "error"] if log.ok else []
        for error in errors[:2]:
            detail = error.get("error_detail") or [{}]
            lines.append(f"{_label(ti)} on {ti['hostname']}: {error.get('event')}: "
                         f"{detail[0].get('exc_type')}: {str(detail[0].get('exc_value'))[:400]}")
    return "\n".join(lines)


class TestTrainingRunOnTwoWorkerHosts:
    def test_run_succeeded(self, training_run):
        assert training_run["run"]["state"] == "success", _failure_details(training_run)

    def test_tasks_ran_on_both_worker_hosts(self, stack, training_run):
        hostnames = {t["hostname"] for t in training_run["instances"] if t["hostname"]}
        assert {w["hostname"] for w in stack["workers"]} <= hostnames, training_run["table"]

    def test_champion_alias_is_set_in_the_mlflow_server(self, stack, training_run):
        response = requests.get(f"{stack['mlflow_url']}/api/2.0/mlflow/registered-models/alias",
                                params={"name": MODEL, "alias": "champion"}, auth=mlflow_auth(stack, "reader"),
                                timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["model_version"]["name"] == MODEL

    def test_signed_manifest_and_models_are_in_the_rollout_bucket(self, stack, training_run):
        s3 = s3_client(stack, "pipeline")
        bucket = stack["buckets"]["rollout"]
        prefix = f"{stack['onnxcast_settings']['ONNXCAST_STORE_URI'].split(bucket, 1)[1].strip('/')}/{MODEL}/"
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
        manifests = [k for k in keys if k.endswith("/manifest.json")]
        assert manifests, keys
        assert any(k.endswith(".onnx") and "/versions/" in k for k in keys), keys
        assert {f"{prefix}channels/edge.json", f"{prefix}channels/cloud.json"} <= set(keys), keys

    def test_mlflow_artifacts_are_in_the_mlflow_bucket(self, stack, training_run):
        s3 = s3_client(stack, "mlflow")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=stack["buckets"]["mlflow"],
                                                      Prefix="artifacts/").get("Contents", [])]
        assert any(k.endswith("report.json") for k in keys), keys[:20]
        assert any(k.endswith(".onnx") for k in keys), keys[:20]
