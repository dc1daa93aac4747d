"""Registry-driven rollout on the multi-host stack: a release manager sets the alias `edge` on
a model version through MLflow's REST API (basic auth, as the MLflow UI does); the alias
watcher in the stack's triggerer asks for it, onnxcast_registry_rollout triggers
onnxcast_promote, whose tasks (gates re-checked) run on the Celery workers, and the channel
pointer in the rollout bucket moves. Prints the delays (docs/airflow.md#registry-driven-rollout).

The version comes from one small single-series training on the stack (onnxcast_promote
stages a single-series version again; the fleet model of test_training_on_stack is not
one), and a second registered version of the same files is the one the alias asks for.

The same version then closes the drift loop (docs/airflow.md#monitoring-and-retraining):
onnxcast_monitor, triggered over the REST API on the training CSV plus three new years, starts
no training run when they are as the process went on; with a level shift its retrain_signal
emits an onnxcast_retrain event, the scheduler starts an asset-triggered onnxcast_training run
with the deployed version's settings and the drifted file, which trains, registers and (when
the challenger wins on the new holdout) promotes. Prints the delays."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest
import requests
from stack_support import AirflowApi, mlflow_auth, mlflow_requests, s3_client

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
            "extra_settings": {"hidden_size": 16, "num_layers": 1, "latency_repeats": 3, "patience": 1,
                               # a one-epoch model's coverage is arbitrary (87% at 80% on this series);
                               # the coverage gate has its own tests (tests/onnxcast/pipeline/test_validate.py)
                               "coverage_tolerance": 0.2}}
    api = AirflowApi(stack, "admin")
    response = api.post(f"/api/v2/dags/{stack['training_dag']}/dagRuns", json={"logical_date": None, "conf": conf})
    assert response.status_code == 200, response.text
    run = _wait_run(api, stack["training_dag"], response.json()["dag_run_id"], RUN_TIMEOUT)
    assert run["state"] == "success", run
    return {"api": api, "run_id": run["dag_run_id"]}


# Issue 30 item 4: `register` took 114-136 s of 251-321 s runs (305 MLflow requests for a run, 109
# metrics/get-history; 0.33-0.55 s of password hashing each). The goal is under 30 s; the test
# fails past a minute, a margin for a loaded CI machine (the figures are printed).
REGISTER_LIMIT = 60.0


def test_register_is_quick_on_the_stack(stack, registered):
    api = registered["api"]
    task = api.get(f"/api/v2/dags/{stack['training_dag']}/dagRuns/{registered['run_id']}/taskInstances/register")
    assert task.status_code == 200, task.text
    task = task.json()
    started, ended = _ts(task["start_date"]), _ts(task["end_date"])
    calls = mlflow_requests(stack, started, ended)
    history = [c for c in calls if "metrics/get-history" in c]
    print(f"\nregister on the stack: {ended - started:.1f} s ({task['hostname']}), {len(calls)} MLflow requests "
          f"in its window, {len(history)} metrics/get-history; the whole training run "
          f"{_run_seconds(api, stack, registered['run_id']):.0f} s")
    assert history == []
    assert ended - started < REGISTER_LIMIT


def _run_seconds(api: AirflowApi, stack, run_id: str) -> float:
    run = api.get(f"/api/v2/dags/{stack['training_dag']}/dagRuns/{run_id}").json()
    return _ts(run["end_date"]) - _ts(run["start_date"])


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


WATCHER_POLLS = 2


def test_command_line_rollback_holds_against_the_watcher(stack, registered):
    """Issue 30 item 3: `onnxcast rollback` printed "rolled back from 2 to 1" and 60 s later the
    channel served 2 again: the watcher read the alias as the desired state. The release manager's
    rollback from a shell (MLflow login in MLFLOW_TRACKING_*, S3 keys in AWS_*, never on the command
    line) moves the alias with the pointer; after two watcher polls the channel still serves the
    rolled-back version and the registry (what the MLflow UI shows) has the alias on it."""
    import subprocess
    import sys
    from pathlib import Path

    base = f"{stack['mlflow_url']}/api/2.0/mlflow"
    release = mlflow_auth(stack, "release")
    edge_version = _edge_reader(stack)
    served = edge_version()
    s3 = s3_client(stack, "pipeline")
    bucket = stack["buckets"]["rollout"]
    prefix = stack["onnxcast_settings"]["ONNXCAST_STORE_URI"].split(bucket, 1)[1].strip("/")
    pointer = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/{MODEL}/channels/edge.json")["Body"].read())
    back = next((e.get("from_version") for e in reversed(pointer["signed"]["history"])
                 if e.get("action") == "promote" and e.get("version") == served and e.get("from_version")), None)
    assert back, f"edge serves v{served} with no earlier version: test_alias_set_over_rest_moves_the_channel first"
    keys = stack["s3_keys"]["pipeline"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "ONNXCAST_", "MLFLOW_", "AWS_"))}
    env.update(AWS_ACCESS_KEY_ID=keys["access_key"], AWS_SECRET_ACCESS_KEY=keys["secret_key"],
               AWS_ENDPOINT_URL=stack["s3_endpoint"], AWS_DEFAULT_REGION=stack["s3_region"],
               AWS_REQUEST_CHECKSUM_CALCULATION="when_required", MLFLOW_TRACKING_URI=stack["mlflow_url"],
               MLFLOW_TRACKING_USERNAME=release[0], MLFLOW_TRACKING_PASSWORD=release[1],
               ONNXCAST_SIGNING_KEY=stack["onnxcast_settings"]["ONNXCAST_SIGNING_KEY"])
    started = time.time()
    done = subprocess.run([str(Path(sys.executable).with_name("onnxcast")), "rollback", "--store",
                           stack["onnxcast_settings"]["ONNXCAST_STORE_URI"], "--model", MODEL, "--channel", "edge",
                           "--reason", "bad forecasts in the field"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    print(f"\nonnxcast rollback on the stack: {line}")
    assert line.startswith(f"{MODEL} channel edge: rolled back from {served} to {back}; registry aliases edge "
                           f"v{served} -> v{back}"), line
    assert release[1] not in done.stdout + done.stderr
    # the watcher reads the registry every ONNXCAST_REGISTRY_POLL_SECONDS (15 s on the stack): wait
    # for two of its reads after the rollback, watching the channel all the while
    polls = []
    deadline = time.monotonic() + 180
    while len(polls) < WATCHER_POLLS + 1 and time.monotonic() < deadline:
        assert edge_version() == back, f"the channel went back to v{edge_version()} after the rollback"
        polls = [c for c in mlflow_requests(stack, started) if c.endswith("/registered-models/search")]
        time.sleep(2)
    assert len(polls) > WATCHER_POLLS, f"the watcher read the registry {len(polls)} time(s) in 180 s"
    time.sleep(5)  # a promote run the last poll asked for would have been queued by now
    assert edge_version() == back
    names = {a: requests.get(f"{base}/registered-models/alias", params={"name": MODEL, "alias": a}, auth=release,
                             timeout=30).json()["model_version"]["version"] for a in ("edge", "champion")}
    assert names == {"edge": back, "champion": back}, names
    runs = registered["api"].get("/api/v2/dags/onnxcast_promote/dagRuns", params={"limit": 100}).json()["dag_runs"]
    again = [r["dag_run_id"] for r in runs if r["dag_run_id"].startswith(f"registry__{MODEL}__edge__")
             and _ts(r["queued_at"]) > started]
    assert again == [], again
    print(f"  {len(polls)} watcher reads of the registry in {time.time() - started:.0f} s; edge still serves "
          f"v{back}, aliases {names}")


# --- the drift loop: monitor -> onnxcast_retrain event -> asset-triggered training -> promotion ---

NEW_WEEKS = 156  # three years after the training data's end: about 45 rolling origins (>= 20 judged)
SHIFT = 8.0  # ppm, from the first new week; +4 ppm was flagged at p=0.041 only (2026-12-02), too near the line
# The retraining run's own training, registration and promotion take ~9 minutes on the stack
# (register alone ~4 min): CI follows the loop until that run has started and its check_data
# took the event's settings (~1 minute; training to promotion is proven by tests/dags); with
# ONNXCAST_STACK_FULL_LOOP=1 the test waits until the channel serves the retrained version
# (the figures in docs/airflow.md were measured so).
FULL_LOOP = os.environ.get("ONNXCAST_STACK_FULL_LOOP") == "1"


def _channel_reader(stack, channel: str):
    s3 = s3_client(stack, "pipeline")
    bucket = stack["buckets"]["rollout"]
    prefix = stack["onnxcast_settings"]["ONNXCAST_STORE_URI"].split(bucket, 1)[1].strip("/")
    key = f"{prefix}/{MODEL}/channels/{channel}.json"
    return lambda: json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())["signed"]["version"]


def _ts(value: str | None) -> float | None:
    from datetime import datetime

    return None if value is None else datetime.fromisoformat(value).timestamp()


def _xcom(api: AirflowApi, dag: str, run_id: str, task: str, key: str = "return_value"):
    response = api.get(f"/api/v2/dags/{dag}/dagRuns/{run_id}/taskInstances/{task}/xcomEntries/{key}")
    assert response.status_code == 200, response.text
    value = response.json()["value"]
    return json.loads(value) if isinstance(value, str) else value


def _states(api: AirflowApi, dag: str, run_id: str) -> dict:
    tis = api.get(f"/api/v2/dags/{dag}/dagRuns/{run_id}/taskInstances", params={"limit": 100}).json()
    return {t["task_id"]: t["state"] for t in tis["task_instances"] if t["map_index"] in (-1, 0)}


def _asset_triggered_training_runs(api: AirflowApi, stack) -> dict:
    runs = api.get(f"/api/v2/dags/{stack['training_dag']}/dagRuns", params={"limit": 100}).json()["dag_runs"]
    return {r["dag_run_id"]: r for r in runs if r["run_type"] == "asset_triggered"}


@pytest.fixture(scope="module")
def loop_data(stack, registered, tmp_path_factory) -> dict:
    """The training CSV with three more years after its end (the deployed version's
    trained_until): as the process went on (the last three years again, raised by their
    growth) and with a +4 ppm level shift from the first new week; both in the data bucket.
    onnxcast_monitor is unpaused (as an operator does; a triggered run of a paused DAG waits)."""
    import numpy as np
    import pandas as pd
    from real_series import weekly_co2_csv

    if not stack["training_dag_unpaused"]:
        pytest.skip("the stack was started with --keep-paused: asset events queue no training run")
    frame = pd.read_csv(weekly_co2_csv(tmp_path_factory.mktemp("loop-data") / "co2_weekly.csv"))
    y = frame["y"].to_numpy()
    growth = y[-52:].mean() - y[-NEW_WEEKS - 52:-NEW_WEEKS].mean()
    last = pd.Timestamp(frame["ds"].iloc[-1])
    new = pd.DataFrame({"ds": [(last + pd.Timedelta(weeks=k + 1)).strftime("%Y-%m-%d") for k in range(NEW_WEEKS)],
                        "y": np.round(y[-NEW_WEEKS:] + growth, 2)})
    s3, bucket = s3_client(stack, "pipeline"), stack["buckets"]["data"]
    uris = {}
    for name, shift in (("healthy", 0.0), ("drifted", SHIFT)):
        path = tmp_path_factory.mktemp(f"loop-{name}") / f"co2_{name}.csv"
        pd.concat([frame, new.assign(y=new["y"] + shift)], ignore_index=True).to_csv(path, index=False)
        key = f"co2/{MODEL}-{name}.csv"
        s3.upload_file(str(path), bucket, key)
        uris[name] = f"s3://{bucket}/{key}"
    api = registered["api"]
    response = api.patch("/api/v2/dags/onnxcast_monitor", json={"is_paused": False})
    assert response.status_code == 200, response.text
    return {**uris, "trained_until": frame["ds"].iloc[-1], "end": new["ds"].iloc[-1]}


def _monitor_run(api: AirflowApi, dataset_uri: str) -> dict:
    conf = {"model_name": MODEL, "channels": ["cloud"], "dataset_uri": dataset_uri}
    response = api.post("/api/v2/dags/onnxcast_monitor/dagRuns", json={"logical_date": None, "conf": conf})
    assert response.status_code == 200, response.text
    return _wait_run(api, "onnxcast_monitor", response.json()["dag_run_id"], 600)


def test_healthy_monitor_run_starts_no_training(stack, registered, loop_data):
    api = registered["api"]
    before = _asset_triggered_training_runs(api, stack)
    run = _monitor_run(api, loop_data["healthy"])
    states = _states(api, "onnxcast_monitor", run["dag_run_id"])
    assert states == {"monitor": "success", "retrain_signal": "skipped"}, (run, states)
    (summary,) = _xcom(api, "onnxcast_monitor", run["dag_run_id"], "monitor")
    print(f"\nhealthy monitor on the stack: cloud v{summary['version']} realised MASE {summary['mase']:.3f} vs "
          f"holdout {summary['holdout_mase']:.3f}, p={summary['p_value']:.3g}, {summary['origins']} origins, "
          f"{summary['seconds']:.1f} s in the task")
    assert summary["degraded"] is False and summary["drift"] == [] and summary["reasons"] == []
    assert summary["origins"] >= 20 and summary["from"] > loop_data["trained_until"]
    events = api.get("/api/v2/assets/events", params={"source_run_id": run["dag_run_id"]}).json()["asset_events"]
    assert events == []
    time.sleep(10)  # the scheduler loops every ~1 s: a run an event queued would be there by now
    assert _asset_triggered_training_runs(api, stack).keys() == before.keys()


def test_drift_retrains_and_promotes_on_the_stack(stack, registered, loop_data):
    api = registered["api"]
    cloud = _channel_reader(stack, "cloud")
    served = cloud()
    before = _asset_triggered_training_runs(api, stack)
    injected = time.time()
    monitor = _monitor_run(api, loop_data["drifted"])
    states = _states(api, "onnxcast_monitor", monitor["dag_run_id"])
    assert states == {"monitor": "success", "retrain_signal": "success"}, (monitor, states)
    (summary,) = _xcom(api, "onnxcast_monitor", monitor["dag_run_id"], "monitor")
    assert summary["version"] == served and summary["reasons"], summary
    events = api.get("/api/v2/assets/events", params={"source_run_id": monitor["dag_run_id"]}).json()["asset_events"]
    assert [e["name"] for e in events] == ["onnxcast_retrain"], events
    extra = events[0]["extra"]
    assert (extra["model"], extra["channel"], extra["version"]) == (MODEL, "cloud", served), extra
    assert extra["conf"]["data_uri"] == loop_data["drifted"] and extra["conf"]["max_epochs"] == 1, extra["conf"]

    training, moved = None, None
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        if moved is None and cloud() != served:
            moved = time.time()
        if training is None:
            new = [r for k, r in _asset_triggered_training_runs(api, stack).items() if k not in before]
            assert len(new) <= 1, new
            training = new[0] if new else None
        else:
            training = api.get(f"/api/v2/dags/{stack['training_dag']}/dagRuns/{training['dag_run_id']}").json()
            if training["state"] in ("success", "failed"):
                break
            if not FULL_LOOP and _states(api, stack["training_dag"], training["dag_run_id"]).get("check_data") \
                    == "success":
                break
        time.sleep(2)
    if training is not None and not FULL_LOOP and training["state"] not in ("success", "failed"):
        check = _xcom(api, stack["training_dag"], training["dag_run_id"], "check_data", "summary")
        trigger = check["trigger"]
        assert (trigger["kind"], trigger["model"], trigger["version"]) == ("retrain", MODEL, served), trigger
        assert trigger["reasons"] == extra["reasons"] and "data_uri" in trigger["settings"], trigger
        assert str(check["end"]).startswith(loop_data["end"]), check
        started = _ts(training["start_date"]) if training.get("start_date") else None
        api.patch(f"/api/v2/dags/{stack['training_dag']}/dagRuns/{training['dag_run_id']}", json={"state": "failed"})
        print(f"\ndrift loop on the stack (to the retraining's check_data; ONNXCAST_STACK_FULL_LOOP=1 for the "
              f"rest): p={summary['p_value']:.3g}, reasons {extra['reasons']}; event "
              f"{_ts(events[0]['timestamp']) - injected:.1f} s, retraining started "
              f"{(started or time.time()) - injected:.1f} s after the drifted monitor run was triggered")
        return
    if moved is None and cloud() != served:  # moved between the last poll and the run's end
        moved = time.time()
    assert training is not None, f"no asset-triggered {stack['training_dag']} run after {RUN_TIMEOUT}s"
    assert training["state"] == "success", (training, _states(api, stack["training_dag"], training["dag_run_id"]))
    run_id = training["dag_run_id"]
    check = _xcom(api, stack["training_dag"], run_id, "check_data", "summary")
    trigger = check["trigger"]
    assert (trigger["kind"], trigger["model"], trigger["version"]) == ("retrain", MODEL, served), trigger
    assert trigger["reasons"] == extra["reasons"] and "data_uri" in trigger["settings"], trigger
    assert str(check["end"]).startswith(loop_data["end"]), check  # trained on the drifted file, to its end
    version = str(_xcom(api, stack["training_dag"], run_id, "register")["version"])
    promoted = _states(api, stack["training_dag"], run_id)["promote"] == "success"
    if promoted:
        assert moved is not None and cloud() == version, (cloud(), version)
    else:
        assert cloud() == served
    times = {"monitor started": _ts(monitor["start_date"]), "monitor done (event)": _ts(events[0]["timestamp"]),
             "training run queued": _ts(training["queued_at"]), "training run started": _ts(training["start_date"]),
             "training run done": _ts(training["end_date"]), "channel moved": moved}
    print(f"\ndrift loop on the stack: monitor (cloud v{served}) realised MASE {summary['mase']:.3f} vs holdout "
          f"{summary['holdout_mase']:.3f}, p={summary['p_value']:.3g}, drift {summary['drift']}; reasons "
          f"{extra['reasons']}\n  drifted monitor run triggered -> "
          + " -> ".join(f"{k} {v - injected:.1f} s" for k, v in times.items() if v is not None)
          + f"\n  retraining run {run_id}: v{version} {'promoted' if promoted else 'kept the champion'}")
