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


class TestPromoteRequests:
    """The dispatcher's step: asset events -> onnxcast_promote triggers (payloads checked again)."""

    @staticmethod
    def event(**payload):
        from types import SimpleNamespace

        base = {"model": "demand", "channel": "edge", "alias": "edge", "version": "3", "serving": "2",
                "requested_at": "20261202T010000Z"}
        return SimpleNamespace(extra={"from_trigger": True, "payload": {**base, **payload}})

    def test_one_trigger_per_request_with_a_deterministic_run_id(self):
        from onnxcast.airflow.rollout import promote_requests

        out = promote_requests({"asset": [self.event(), self.event(), self.event(channel="cloud", alias="cloud")]})
        assert [o["trigger_run_id"] for o in out] == ["registry__demand__edge__v3__20261202T010000Z",
                                                      "registry__demand__cloud__v3__20261202T010000Z"]
        assert out[0]["conf"] == {"model_name": "demand", "version": "3", "channels": ["edge"], "source": "registry",
                                  "alias": "edge", "reason": "alias edge set to v3 in the MLflow registry"}

    @pytest.mark.parametrize("bad", [{"model": "../x"}, {"channel": "gpu"}, {"version": "3; rm"}, {"alias": "a b"},
                                     {"model": None}])
    def test_invalid_payloads_are_dropped(self, bad):
        from onnxcast.airflow.rollout import promote_requests

        assert promote_requests({"asset": [self.event(**bad)]}) == []
