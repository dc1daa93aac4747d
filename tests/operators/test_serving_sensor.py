"""ServingReadySensor and its trigger against a real ``onnxcast serve`` on loopback."""

from __future__ import annotations

import asyncio
import json

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from conftest import assert_template_fields_stored_unchanged, make_context
from serve_support import kill, launch

from onnxcast.airflow.serving import ServingReadySensor, ServingReadyTrigger
from onnxcast.rollout.promote import promote

pytestmark = pytest.mark.slow


@pytest.fixture
def service(tmp_path, make_run):
    """``onnxcast serve`` following the cloud channel of a store at version 1."""
    store = str(tmp_path / "store")
    promote(make_run("a"), store, "m", "cloud", version="1")
    server = launch(store, tmp_path)
    server.wait_ready("1")
    yield server
    kill(server)


def _events(trigger: ServingReadyTrigger) -> list[dict]:
    async def collect():
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect())


class TestServingReadySensor:
    def test_template_fields(self):
        values = {"service_url": "{{ params.serving_url }}", "model_name": "{{ params.model_name }}",
                  "version": "{{ v }}", "channels": "{{ c }}"}
        assert_template_fields_stored_unchanged(ServingReadySensor(task_id="t", **values), values)

    def test_nothing_to_wait_for_succeeds_at_once(self):
        context = make_context()
        assert ServingReadySensor(task_id="t", service_url=None, model_name="m", version="1").execute(context) is None
        assert ServingReadySensor(task_id="t", service_url="http://127.0.0.1:9", model_name="m", version="1",
                                  channels={"edge": "moved"}).execute(context) is None
        assert ServingReadySensor(task_id="t", service_url="http://127.0.0.1:9", model_name="m",
                                  version=None).execute(context) is None

    def test_the_log_names_the_channels_as_key_value_pairs(self, capsys):
        """Issue 18 item 16: the task log showed the promotion as a Python dict ({'edge': 'moved'})."""
        ServingReadySensor(task_id="t", service_url="http://127.0.0.1:9", model_name="m", version="3",
                           channels={"edge": "moved", "cloud": "unchanged"}, channel="other").execute(make_context())
        line = next(line for line in capsys.readouterr().out.splitlines() if "was not promoted" in line)
        assert "channels edge=moved, cloud=unchanged" in line
        assert "{" not in line

    def test_serving_version_succeeds_without_deferring(self, service):
        sensor = ServingReadySensor(task_id="t", service_url=service.url, model_name="m", version="1",
                                    channels={"cloud": "moved"})
        assert sensor.execute(make_context()) == "1"

    def test_defers_until_the_new_version_serves(self, service, tmp_path, make_run):
        sensor = ServingReadySensor(task_id="t", service_url=service.url, model_name="m", version="2",
                                    poll_interval=0.2, timeout=60)
        with pytest.raises(TaskDeferred) as deferred:
            sensor.execute(make_context())
        trigger = deferred.value.trigger
        assert trigger.serialize() == ("onnxcast.airflow.serving.ServingReadyTrigger", {
            "service_url": service.url, "model_name": "m", "version": "2", "poll_interval": 0.2, "timeout": 60,
            "serving_conn_id": "onnxcast_serve"})
        promote(make_run("b"), str(tmp_path / "store"), "m", "cloud", version="2")
        (event,) = _events(ServingReadyTrigger(**trigger.serialize()[1]))
        assert event["status"] == "serving" and event["version"] == "2"
        assert sensor.execute_complete(make_context(), event) == "2"

    def test_timeout_fails_with_what_the_service_said(self, service):
        (event,) = _events(ServingReadyTrigger(service_url=service.url, model_name="m", version="9",
                                               poll_interval=0.1, timeout=0.3))
        assert event["status"] == "timeout" and "serving ['1']" in event["detail"]
        sensor = ServingReadySensor(task_id="t", service_url=service.url, model_name="m", version="9", timeout=0.3)
        with pytest.raises(AirflowFailException, match="did not serve m version 9 within 0.3 s"):
            sensor.execute_complete(make_context(), event)


@pytest.fixture
def service_with_token(tmp_path, make_run):
    """``onnxcast serve`` with a bearer token (as it must have beyond loopback), version 1."""
    store = str(tmp_path / "store")
    promote(make_run("a"), store, "m", "cloud", version="1")
    token = "sensor-test-token-5f0c"
    server = launch(store, tmp_path, env={"ONNXCAST_SERVE_TOKEN": token}, token=token)
    server.wait_ready("1")
    yield server
    kill(server)


class TestServingWithAToken:
    """The sensor and its trigger send the token of the ``onnxcast_serve`` connection; without
    it the service answers 401 and the wait says so."""

    def test_the_sensor_uses_the_connections_token(self, service_with_token, monkeypatch):
        monkeypatch.setenv("AIRFLOW_CONN_ONNXCAST_SERVE", json.dumps(
            {"conn_type": "http", "password": service_with_token.token}))
        sensor = ServingReadySensor(task_id="t", service_url=service_with_token.url, model_name="m", version="1",
                                    channels={"cloud": "moved"})
        assert sensor.execute(make_context()) == "1"

    def test_the_trigger_resolves_the_connection_itself(self, service_with_token, monkeypatch):
        monkeypatch.setenv("AIRFLOW_CONN_ONNXCAST_SERVE", json.dumps(
            {"conn_type": "http", "password": service_with_token.token}))
        trigger = ServingReadyTrigger(service_url=service_with_token.url, model_name="m", version="1",
                                      poll_interval=0.1, timeout=5, serving_conn_id="onnxcast_serve")
        assert service_with_token.token not in json.dumps(trigger.serialize())
        (event,) = _events(trigger)
        assert event["status"] == "serving"

    def test_without_the_connection_the_wait_reports_401(self, service_with_token, monkeypatch):
        monkeypatch.delenv("AIRFLOW_CONN_ONNXCAST_SERVE", raising=False)
        (event,) = _events(ServingReadyTrigger(service_url=service_with_token.url, model_name="m", version="1",
                                               poll_interval=0.1, timeout=0.3, serving_conn_id="onnxcast_serve"))
        assert event["status"] == "timeout" and "HTTP 401" in event["detail"]
