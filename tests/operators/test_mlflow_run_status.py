"""A failed or killed task leaves its MLflow runs FAILED or KILLED, never RUNNING; its retry
takes them over again. The callback is the one every onnxcast operator (and the training
DAG's default_args, for the DAG processor) carries."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import make_context


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    import json

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_STATUS", json.dumps({"conn_type": "http", "host": uri}))
    return uri


def statuses(uri: str, run_key: str) -> dict[str, str]:
    from onnxcast.registry.tracking import FAMILY_TAG, ROLE_TAG, RUN_KEY_TAG, client_for

    client = client_for(uri)
    experiment = client.get_experiment_by_name("status-model")
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'")
    return {r.data.tags.get(FAMILY_TAG) or r.data.tags[ROLE_TAG]: r.info.status for r in runs}


def failure_context(run_id: str, *, family: str | None, exception, state: str) -> dict:
    from onnxcast.airflow.steps import TrainOrFetchModelOperator

    context = make_context(run_id=run_id)
    task = TrainOrFetchModelOperator(task_id="train_or_fetch", run_dir="/unused", family=family or "lstm",
                                     mlflow_conn_id="mlflow_status")
    context.update(task=task, exception=exception, params={"model_name": "status-model"},
                   ti=SimpleNamespace(state=state, rendered_map_index=family, task_id="train_or_fetch"))
    return context


def test_every_onnxcast_operator_carries_the_callback_once():
    from onnxcast.airflow.steps import ExportModelOperator, end_mlflow_runs

    op = ExportModelOperator(task_id="x", run_dir="r", family="f", on_failure_callback=end_mlflow_runs)
    assert op.on_failure_callback == [end_mlflow_runs]
    assert op.on_retry_callback == [end_mlflow_runs]


def test_a_failed_try_marks_the_family_run_failed_and_the_retry_takes_it_over(tracking):
    from onnxcast.airflow.steps import end_mlflow_runs
    from onnxcast.registry.tracking import ensure_run

    key = "operator_tests/retry-run"
    ensure_run(model_name="status-model", run_key=key, family="lstm", tracking_uri=tracking)
    end_mlflow_runs(failure_context("retry-run", family="lstm", exception=RuntimeError("boom"), state="up_for_retry"))
    assert statuses(tracking, key) == {"lstm": "FAILED", "pipeline": "RUNNING"}  # other families go on
    ensure_run(model_name="status-model", run_key=key, family="lstm", tracking_uri=tracking)  # the retry
    assert statuses(tracking, key) == {"lstm": "RUNNING", "pipeline": "RUNNING"}


def test_a_worker_killed_on_the_last_try_leaves_both_runs_killed(tracking):
    """No exception in the context: the DAG processor runs the callback after a heartbeat timeout."""
    from onnxcast.airflow.steps import end_mlflow_runs
    from onnxcast.registry.tracking import ensure_run

    key = "operator_tests/killed-run"
    ensure_run(model_name="status-model", run_key=key, family="nhits", tracking_uri=tracking)
    end_mlflow_runs(failure_context("killed-run", family="nhits", exception=None, state="failed"))
    assert statuses(tracking, key) == {"nhits": "KILLED", "pipeline": "KILLED"}


def test_the_callback_never_raises(monkeypatch):
    """An unreachable tracking server is logged, not raised into the callback runner."""
    import json

    from onnxcast.airflow.steps import end_mlflow_runs

    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_STATUS", json.dumps({"conn_type": "http", "host": "http://127.0.0.1:9"}))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    end_mlflow_runs(failure_context("unreachable", family="lstm", exception=RuntimeError("x"), state="failed"))
