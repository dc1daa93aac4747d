"""What logging and registering one run costs a real `mlflow server` with its basic-auth app, in
requests (its access log counts them): every request is authenticated, and on 2 cores a
password check cost 0.33-0.55 s, so 305 requests made `register` take two minutes on the stack
(issue 30 item 4). The registration reads no metric history and batches its tags; the logged
model is still linked to its run and metrics, and the version to the run."""

from __future__ import annotations

import secrets
import time
from collections import Counter

import pytest
from mlflow_http import mlflow_server
from run_fixtures import tiny_lstm_run, tiny_lstm_run_copy  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

USERS = {"pipeline": secrets.token_urlsafe(18)}
# Measured here (2026-12-04, tiny LSTM run, 2 cores under load): 196 requests before, 109 of them
# metrics/get-history and 15 runs/set-tag; 67 after (28 of them artifact uploads).
MAX_REQUESTS = 80


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow-requests"), users=USERS, auth_cache_seconds=60) as running:
        yield running


def test_registering_a_run_reads_no_metric_history_and_batches_its_writes(server, tiny_lstm_run_copy,  # noqa: F811
                                                                         monkeypatch):
    from onnxcast.registry.tracking import client_for, ensure_run, log_pipeline_run, register_model

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "pipeline")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", USERS["pipeline"])
    mark, started = server.mark(), time.monotonic()
    ensure_run(model_name="counted", run_key="dag/run-1", tracking_uri=server.url)  # the task's link
    tracked = log_pipeline_run(tiny_lstm_run_copy, model_name="counted", run_key="dag/run-1", families=["lstm"],
                               tracking_uri=server.url)
    version = register_model(tiny_lstm_run_copy, tracked, model_name="counted", run_key="dag/run-1",
                             tracking_uri=server.url)
    seconds = time.monotonic() - started
    time.sleep(1)  # the access log line of the last request
    calls = server.requests_since(mark)
    counts = Counter(calls)
    print(f"\nlog + register over HTTP with basic auth: {len(calls)} requests in {seconds:.1f} s; "
          f"{counts.most_common(6)}")
    assert not [c for c in calls if "metrics/get-history" in c]
    assert counts["POST /api/2.0/mlflow/runs/set-tag"] <= 2, counts  # tags go in log-batch
    assert len(calls) <= MAX_REQUESTS, counts

    client = client_for(server.url)
    registered = client.get_model_version("counted", version.version)
    child = tracked.family_run_ids["lstm"]
    assert registered.run_id == child and registered.source.startswith("models:/m-")
    model_id = registered.source.removeprefix("models:/")
    logged = client.get_logged_model(model_id)
    assert logged.source_run_id == child and logged.params["spec.lookback"] == "56"
    run = client.get_run(child)
    assert logged.metrics and {m.key for m in logged.metrics} <= set(run.data.metrics)
    assert "fp32.holdout_mae" in {m.key for m in logged.metrics}
    assert [o.model_id for o in run.outputs.model_outputs] == [model_id]
    assert run.data.tags["onnxcast.gates_passed"] == "True" and run.info.status == "FINISHED"
    parent = client.get_run(tracked.parent_run_id)
    assert parent.data.tags["onnxcast.status"] == "passed" and parent.data.tags["onnxcast.model_version"] == "1"
