"""RegistryAliasTrigger against a real `mlflow server` over HTTP and a local rollout store
whose channel pointer is written by a real (signed) promotion."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow_http import register_version
from rollout_support import RecordingRegistry

from onnxcast.airflow.triggers import RegistryAliasTrigger
from onnxcast.registry.alias_rollout import rollout_state

ALIASES = {"edge": "edge", "cloud": "cloud"}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_url(tmp_path_factory):
    """`mlflow server` on a free loopback port (SQLite backend)."""
    root = tmp_path_factory.mktemp("mlflow-alias-server")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "AIRFLOW"))}
    with open(root / "server.log", "wb") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--serve-artifacts",
             "--artifacts-destination", str(root / "artifacts")], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}") from None
            time.sleep(0.5)
    yield url
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:  # a loaded machine: gunicorn's workers slow to stop
        process.kill()
        process.wait(timeout=20)


@pytest.fixture
def registry(mlflow_url, monkeypatch):
    """A registered model with two versions (made over REST), MLflow reached through the
    ``mlflow_default`` connection as in a deployment."""
    import requests

    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps({"conn_type": "http", "host": mlflow_url}))
    base = f"{mlflow_url}/api/2.0/mlflow"
    name, first = register_version(base, None, "alias-watch")
    source = requests.get(f"{base}/model-versions/get", params={"name": name, "version": first},
                          timeout=30).json()["model_version"]
    second = requests.post(f"{base}/model-versions/create", timeout=30,
                           json={"name": name, "source": source["source"], "run_id": source["run_id"]})
    assert second.status_code == 200, second.text
    from onnxcast.registry.tracking import client_for

    return name, first, second.json()["model_version"]["version"], client_for(mlflow_url)


@pytest.fixture
def store(tmp_path, make_run, registry, release_key) -> str:
    """The rollout store, channel edge serving the first version (a signed promotion)."""
    from onnxcast.rollout.promote import promote

    name, first, _, _ = registry
    uri = str(tmp_path / "rollout")
    promote(make_run("a"), uri, name, "edge", version=first, actor="test", reason="first",
            signers=str(release_key["private"]))
    return uri


def mine(payloads: list[dict], name: str) -> list[dict]:
    """The payloads about ``name``: the server holds the other tests' models too (each test's
    store holds only its own model, so theirs look undeployed)."""
    return [p for p in payloads if p["model"] == name]


def trigger(store_uri: str, **kwargs) -> RegistryAliasTrigger:
    return RegistryAliasTrigger(channel_aliases=ALIASES, poll_seconds=1, store_uri=store_uri, **kwargs)


class TestRegistryAliasTrigger:
    def test_serializes_to_what_it_was_given(self, tmp_path):
        path, kwargs = trigger(str(tmp_path)).serialize()
        assert path == "onnxcast.airflow.triggers.RegistryAliasTrigger"
        assert RegistryAliasTrigger(**kwargs).serialize() == (path, kwargs)

    def test_alias_on_the_served_version_fires_nothing(self, registry, store):
        name, first, _, client = registry
        client.set_registered_model_alias(name, "edge", first)
        assert mine(asyncio.run(trigger(store).poll()), name) == []

    def test_alias_set_fires_one_event_and_marks_the_version_pending(self, registry, store):
        name, first, second, client = registry
        client.set_registered_model_alias(name, "edge", second)

        async def first_event():
            async for event in trigger(store).run():
                if event.payload["model"] == name:
                    return event.payload

        payload = asyncio.run(asyncio.wait_for(first_event(), timeout=60))
        assert {k: payload[k] for k in ("model", "channel", "alias", "version", "serving")} == {
            "model": name, "channel": "edge", "alias": "edge", "version": second, "serving": first}
        assert payload["run_id"].startswith(f"registry__{name}__edge__v{second}__")
        state = rollout_state(client.get_model_version(name, second).tags, "edge")
        assert state["state"] == "pending" and state["run_id"] == payload["run_id"]
        # in flight: the next poll asks nothing
        assert mine(asyncio.run(trigger(store).poll()), name) == []

    def test_alias_set_again_on_a_refused_version_is_moved_back(self, registry, store):
        from datetime import UTC, datetime

        from onnxcast.registry.alias_rollout import write_rollout_state

        name, first, second, client = registry
        write_rollout_state(client, name, second, "edge", "refused", reason="validate: parity failed", run_id="r",
                            at=datetime.now(UTC))
        client.set_registered_model_alias(name, "edge", second)
        assert mine(asyncio.run(trigger(store).poll()), name) == []
        assert str(client.get_model_version_by_alias(name, "edge").version) == first

    def test_alias_for_a_channel_without_pointer_is_a_first_deployment(self, registry, store):
        name, first, _, client = registry
        client.set_registered_model_alias(name, "cloud", first)
        payloads = mine(asyncio.run(trigger(store).poll()), name)
        assert [(p["model"], p["channel"], p["version"], p["serving"]) for p in payloads] == [
            (name, "cloud", first, None)]

    def test_a_command_line_rollback_leaves_the_watcher_nothing_to_undo(self, registry, store, make_run,
                                                                        monkeypatch, capsys):
        """Issue 30 item 3: `onnxcast rollback` moved the pointer only, the watcher read the alias as
        the desired state and promoted the rolled-back version again a minute later. The release
        moves the alias with the pointer: two polls later nothing is asked for."""
        from onnxcast import cli

        name, first, second, client = registry
        monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        assert cli.main(["promote", "--report", str(make_run("b")), "--store", store, "--model", name,
                         "--channel", "edge", "--version", second]) == 0
        assert f"registry aliases edge none -> v{second}, champion none -> v{second}" in capsys.readouterr().out
        assert mine(asyncio.run(trigger(store).poll()), name) == []
        assert cli.main(["rollback", "--store", store, "--model", name, "--channel", "edge",
                         "--reason", "bad forecasts"]) == 0
        line = capsys.readouterr().out.strip()
        assert line == (f"{name} channel edge: rolled back from {second} to {first}; registry aliases edge "
                        f"v{second} -> v{first}, champion v{second} -> v{first} ({client.tracking_uri})")
        for _ in range(2):
            assert mine(asyncio.run(trigger(store).poll()), name) == []
        assert str(client.get_model_version_by_alias(name, "edge").version) == first
        assert rollout_state(dict(client.get_model_version(name, first).tags), "edge") is None  # nothing pending

    def test_registry_outage_logs_one_line_and_keeps_polling(self, store, monkeypatch, capsys):
        monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(
            {"conn_type": "http", "host": f"http://127.0.0.1:{_free_port()}"}))
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
        watcher = trigger(store)
        capsys.readouterr()
        assert asyncio.run(watcher.poll()) == []
        assert asyncio.run(watcher.poll()) == []  # still polling; the same outage is not logged again
        out = capsys.readouterr()
        lines = [line for line in (out.out + out.err).splitlines() if "poll failed" in line]
        assert len(lines) == 1 and "registered-models/search" in lines[0]


class FakeRegistry:
    """The two MLflow calls check_request makes, on a fixed registry state."""

    def __init__(self, aliases: dict, tags: dict | None = None):
        self.aliases, self.tags = aliases, tags or {}

    def get_model_version_by_alias(self, name, alias):
        from types import SimpleNamespace

        from mlflow.exceptions import MlflowException

        if alias not in self.aliases:
            raise MlflowException("no such alias", error_code="INVALID_PARAMETER_VALUE")
        return SimpleNamespace(version=self.aliases[alias])

    def get_model_version(self, name, version):
        from types import SimpleNamespace

        return SimpleNamespace(tags=self.tags.get(str(version), {}))


RUN_ID = "registry__demand__edge__v3__20261202T010000Z"


def pending(run_id: str = RUN_ID) -> dict:
    from datetime import UTC, datetime

    from onnxcast.registry.alias_rollout import rollout_tag, state_value

    return {"3": {rollout_tag("edge"): state_value("pending", at=datetime.now(UTC), reason="alias", run_id=run_id)}}


class TestPromoteRequests:
    """The dispatcher's step: asset events -> onnxcast_promote triggers (payloads checked again,
    only the watcher's events, the registry read again)."""

    @staticmethod
    def event(source_dag_id=None, source_task_id=None, extra=None, **payload):
        from types import SimpleNamespace

        base = {"model": "demand", "channel": "edge", "alias": "edge", "version": "3", "serving": "2",
                "requested_at": "20261202T010000Z"}
        return SimpleNamespace(extra=extra if extra is not None else {"from_trigger": True,
                                                                        "payload": {**base, **payload}},
                               source_dag_id=source_dag_id, source_task_id=source_task_id)

    ASKING = FakeRegistry({"edge": "3", "cloud": "3"})

    def test_one_trigger_per_request_with_a_deterministic_run_id(self):
        from onnxcast.airflow.rollout import promote_requests

        out = promote_requests({"asset": [self.event(), self.event(), self.event(channel="cloud", alias="cloud")]},
                               self.ASKING)
        assert [o["trigger_run_id"] for o in out] == [RUN_ID, "registry__demand__cloud__v3__20261202T010000Z"]
        assert out[0]["conf"] == {"model_name": "demand", "version": "3", "channels": ["edge"], "source": "registry",
                                  "alias": "edge", "reason": "alias edge set to v3 in the MLflow registry"}

    @pytest.mark.parametrize("bad", [{"model": "../x"}, {"channel": "gpu"}, {"version": "3; rm"}, {"alias": "a b"},
                                     {"model": None}])
    def test_invalid_payloads_are_dropped(self, bad):
        from onnxcast.airflow.rollout import promote_requests

        assert promote_requests({"asset": [self.event(**bad)]}, self.ASKING) == []

    @pytest.mark.parametrize("forged", [
        # POST /api/v2/assets/events: Airflow adds from_rest_api, whatever the body says
        {"extra": {"from_rest_api": True, "from_trigger": True, "payload": {
            "model": "demand", "channel": "edge", "alias": "edge", "version": "3",
            "requested_at": "20261202T010000Z"}}},
        {"source_dag_id": "some_dag", "source_task_id": "emit"},  # a task's outlet, not the watcher
        {"extra": {"payload": {"model": "demand", "channel": "edge", "alias": "edge", "version": "3",
                               "requested_at": "20261202T010000Z"}}},  # no from_trigger
    ])
    def test_events_not_from_the_watcher_start_nothing(self, forged, caplog):
        from onnxcast.airflow.rollout import promote_requests

        assert promote_requests({"asset": [self.event(**forged)]}, self.ASKING) == []
        assert "ignored an alias event" in caplog.text

    @pytest.mark.parametrize("registry", [FakeRegistry({"edge": "4"}), FakeRegistry({}),
                                          FakeRegistry({"edge": "3"}, pending("registry__demand__edge__v3__other")),
                                          FakeRegistry({"edge": "3"}, {"3": {"onnxcast.rollout.edge": json.dumps(
                                              {"state": "refused", "run_id": RUN_ID})}})])
    def test_a_request_the_registry_no_longer_makes_starts_nothing(self, registry, caplog):
        from onnxcast.airflow.rollout import promote_requests

        assert promote_requests({"asset": [self.event()]}, registry) == []
        assert "no longer asks for it" in caplog.text

    def test_the_pending_tag_of_this_request_passes(self):
        from onnxcast.airflow.rollout import promote_requests

        out = promote_requests({"asset": [self.event()]}, FakeRegistry({"edge": "3"}, pending()))
        assert [o["trigger_run_id"] for o in out] == [RUN_ID]


class TestWatcherEventsOnARealRegistry:
    def test_only_the_watchers_own_request_for_what_the_alias_names_now(self, registry, store):
        """A real poll's payload passes the dispatcher; the same payload posted through the REST
        API, or after the alias moved on, does not."""
        from types import SimpleNamespace

        from onnxcast.airflow.rollout import promote_requests

        name, first, second, client = registry
        client.set_registered_model_alias(name, "edge", second)
        [payload] = mine(asyncio.run(trigger(store).poll()), name)

        def event(**extra):
            return SimpleNamespace(extra={"from_trigger": True, "payload": payload, **extra}, source_dag_id=None,
                                   source_task_id=None)

        assert [o["trigger_run_id"] for o in promote_requests({"a": [event()]}, client)] == [payload["run_id"]]
        assert promote_requests({"a": [event(from_rest_api=True)]}, client) == []
        client.set_registered_model_alias(name, "edge", first)
        assert promote_requests({"a": [event()]}, client) == []


class PullingTI:
    """A task instance whose XComs other tasks pushed: ``{(task_id, key): value}``."""

    def __init__(self, xcoms: dict) -> None:
        self.xcoms = dict(xcoms)

    def xcom_pull(self, task_ids: str, key: str = "return_value"):
        return self.xcoms.get((task_ids, key))

    def xcom_push(self, key: str, value) -> None:
        self.xcoms[("self", key)] = value


def with_hook(op):
    from contextlib import nullcontext
    from types import SimpleNamespace

    # never reached; no login (the operator's execute runs inside hook.login())
    op.__dict__["mlflow_hook"] = SimpleNamespace(tracking_uri="http://registry.invalid", login=nullcontext)
    return op


class TestSupersededAndFailed:
    """A late registry run never moves a channel over a newer request; an outage is 'failed'
    (asked again), not a permanent refusal."""

    @staticmethod
    def report(monkeypatch, xcoms: dict, aliases: dict, serving: str = "4"):
        import onnxcast.registry.release as release
        import onnxcast.registry.tracking as tracking
        from onnxcast.airflow.rollout import ReportRolloutOperator

        registry = RecordingRegistry(aliases)
        for module in (tracking, release):  # where the operator and the release look the client up
            monkeypatch.setattr(module, "client_for", lambda uri: registry)
        op = with_hook(ReportRolloutOperator(task_id="report_back", model_name="demand", ref="5", channels=["edge"],
                                             source="registry", alias="edge"))
        monkeypatch.setattr(op, "_serving", lambda channel: serving)
        ti = PullingTI({("stage_version", "return_value"): {"version": "5"}, **xcoms})
        return op, {"ti": ti, "run_id": "registry__demand__edge__v5__x"}, registry

    def test_superseded_run_writes_superseded_and_leaves_the_alias(self, monkeypatch):
        from onnxcast.airflow.rollout import SUPERSEDED_KEY

        op, context, registry = self.report(monkeypatch, {("promote", SUPERSEDED_KEY): "6"}, {"edge": "6"})
        assert op.execute(context)["state"] == "superseded"
        assert registry.tags[("5", "onnxcast.rollout.edge")]["state"] == "superseded"
        assert registry.aliases == {"edge": "6"}

    def test_an_outage_is_failed_and_the_alias_stays(self, monkeypatch):
        from airflow.sdk.exceptions import AirflowFailException

        from onnxcast.airflow.rollout import FAILURE_KEY, FAILURE_KIND_KEY

        xcoms = {("stage_version", FAILURE_KEY): "ConnectionError: MLflow unreachable",
                 ("stage_version", FAILURE_KIND_KEY): "failed"}
        op, context, registry = self.report(monkeypatch, xcoms, {"edge": "5"})
        with pytest.raises(AirflowFailException, match="failed demand v5 for edge: stage_version: ConnectionError"):
            op.execute(context)
        assert registry.tags[("5", "onnxcast.rollout.edge")]["state"] == "failed"
        assert registry.aliases == {"edge": "5"}  # the watcher asks again after the pending expiry

    def test_a_gate_refusal_is_refused_and_the_alias_goes_back(self, monkeypatch):
        from airflow.sdk.exceptions import AirflowFailException

        from onnxcast.airflow.rollout import FAILURE_KEY, FAILURE_KIND_KEY

        xcoms = {("validate", FAILURE_KEY): "gate parity failed", ("validate", FAILURE_KIND_KEY): "refused"}
        op, context, registry = self.report(monkeypatch, xcoms, {"edge": "5"})
        with pytest.raises(AirflowFailException, match="refused demand v5 for edge: validate: gate parity"):
            op.execute(context)
        assert registry.tags[("5", "onnxcast.rollout.edge")]["state"] == "refused"
        assert registry.aliases == {"edge": "4"}

    @pytest.mark.parametrize("exception, kind", [("fail", "refused"), ("conn", "failed")])
    def test_remember_failure_tells_a_refusal_from_an_outage(self, exception, kind):
        from airflow.sdk.exceptions import AirflowFailException

        from onnxcast.airflow.rollout import FAILURE_KIND_KEY, remember_failure

        ti = PullingTI({})
        error = AirflowFailException("gate failed") if exception == "fail" else ConnectionError("refused by host")
        remember_failure({"exception": error, "ti": ti})
        assert ti.xcoms[("self", FAILURE_KIND_KEY)] == kind
