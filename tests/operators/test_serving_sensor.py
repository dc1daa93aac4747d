"""ServingReadySensor and its trigger against a real ``onnxcast serve`` on loopback."""

from __future__ import annotations

import asyncio

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from conftest import assert_template_fields_stored_unchanged, make_context
from serve_support import kill, launch

from onnxcast.airflow.serving import ServingReadySensor, ServingReadyTrigger
from onnxcast.promote import promote

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
            "service_url": service.url, "model_name": "m", "version": "2", "poll_interval": 0.2, "timeout": 60})
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
