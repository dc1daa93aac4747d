"""The ``mlflow_default`` connection's login reaches MLflow through the only door MLflow has for
it, its basic-auth environment variables (issue 31: no stray os.environ writes): inside
``MlflowHook.login()`` only, put back after: the triggerer's polls, and the whole ``execute`` of an
operator with ``MlflowLoginScope`` (a long-lived worker's next task starts from the variables as
they were). An operator without the scope still gets the login for the rest of its process."""

from __future__ import annotations

import json
import os

import pytest

LOGIN = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


@pytest.fixture
def mlflow_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps({
        "conn_type": "mlflow", "host": "http://127.0.0.1:1", "login": "pipeline", "password": "pw-1"}))
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "someone-else")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)


def test_the_login_is_set_inside_the_block_only_and_put_back_after(mlflow_connection):
    from onnxcast.airflow.hooks import MlflowHook

    hook = MlflowHook()
    assert hook.tracking_uri == "http://127.0.0.1:1"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "someone-else"  # reading the settings sets nothing
    with hook.login():
        assert [os.environ.get(name) for name in LOGIN] == ["pipeline", "pw-1"]
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "someone-else" and "MLFLOW_TRACKING_PASSWORD" not in os.environ


def test_a_failed_block_puts_the_login_back_too(mlflow_connection):
    from onnxcast.airflow.hooks import MlflowHook

    hook = MlflowHook()
    with pytest.raises(ConnectionError), hook.login():
        raise ConnectionError("registry down")
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "someone-else" and "MLFLOW_TRACKING_PASSWORD" not in os.environ


def test_reading_the_settings_sets_no_login(mlflow_connection):
    """Outside a login() block nothing is exported: a task's login never outlives its call."""
    from onnxcast.airflow.hooks import MlflowHook

    assert MlflowHook().get_settings()["tracking_uri"] == "http://127.0.0.1:1"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "someone-else" and "MLFLOW_TRACKING_PASSWORD" not in os.environ


def test_a_connection_without_a_login_sets_nothing(monkeypatch):
    from onnxcast.airflow.hooks import MlflowHook

    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps({"conn_type": "mlflow", "host": "http://127.0.0.1:1"}))
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    hook = MlflowHook()
    with hook.login():
        assert "MLFLOW_TRACKING_USERNAME" not in os.environ
    assert "MLFLOW_TRACKING_USERNAME" not in os.environ


def test_the_alias_watchers_poll_runs_as_the_login_and_leaves_none_behind(mlflow_connection, monkeypatch):
    """The triggerer runs many triggers in one process: a poll's login must not outlive it."""
    import onnxcast.registry.release as release
    from onnxcast.airflow.triggers import RegistryAliasTrigger

    seen = []

    class RegistryDown:
        def __init__(self, tracking_uri, aliases):
            seen.append((tracking_uri, [os.environ.get(name) for name in LOGIN]))
            raise ConnectionError("registry down")

    monkeypatch.setattr(release, "Registry", RegistryDown)
    trigger = RegistryAliasTrigger(channel_aliases={"edge": "edge"}, store_uri="unused")
    with pytest.raises(ConnectionError):
        trigger.poll_sync()
    assert seen == [("http://127.0.0.1:1", ["pipeline", "pw-1"])]
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "someone-else" and "MLFLOW_TRACKING_PASSWORD" not in os.environ


@pytest.mark.parametrize("fails", [False, True])
def test_an_operators_call_runs_as_the_login_and_leaves_the_variables_as_before(mlflow_connection, fails):
    """The next task of the same process (a Celery worker, ``dags test``) must not inherit the
    login: after ``execute``, returned or raised, the variables are as before."""
    from onnxcast.airflow.steps import TrackedOperator

    seen = []

    class Probe(TrackedOperator):
        def execute(self, context):
            seen.append((self.mlflow_hook.tracking_uri, [os.environ.get(name) for name in LOGIN]))
            if fails:
                raise ConnectionError("registry down")
            return "done"

    before = {name: os.environ.get(name) for name in LOGIN}
    op = Probe(task_id="probe")
    if fails:
        with pytest.raises(ConnectionError):
            op.execute({})
    else:
        assert op.execute({}) == "done"
    assert seen == [("http://127.0.0.1:1", ["pipeline", "pw-1"])]
    assert {name: os.environ.get(name) for name in LOGIN} == before == {
        "MLFLOW_TRACKING_USERNAME": "someone-else", "MLFLOW_TRACKING_PASSWORD": None}


def test_every_operator_that_talks_to_mlflow_runs_in_the_scope():
    from onnxcast.airflow import operators
    from onnxcast.airflow.hooks import MlflowLoginScope
    from onnxcast.airflow.steps import TrackedOperator

    tracked = [name for name in dir(operators) if isinstance(getattr(operators, name), type)
               and issubclass(getattr(operators, name), TrackedOperator)]
    for name in ("CheckDataOperator", "TrainOrFetchModelOperator", "ValidateModelOperator", "RegisterModelOperator",
                 "ChampionChallengerOperator", "PromoteModelOperator", "RollbackChannelOperator",
                 "RefreshChannelsOperator", "ReportRolloutOperator", "StageRegisteredVersionOperator",
                 "MonitorChannelsOperator"):
        assert name in tracked, name
    for name in tracked:
        operator = getattr(operators, name)
        assert issubclass(operator, MlflowLoginScope) and operator.execute.logged_in_to_mlflow, name
