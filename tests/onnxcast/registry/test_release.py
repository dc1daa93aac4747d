"""onnxcast.registry.release against a real `mlflow server` with its basic-auth app over HTTP and
a real, signed rollout store: a release moves the channel pointer and the registry aliases
together, or nothing moves and one line says why; the command line goes through it, and the
alias watcher then has nothing to undo (issue 30 item 3)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow_http import FaultyProxy, add_version, aliases, mlflow_server, register_version

pytestmark = pytest.mark.slow

USERS = {"pipeline": secrets.token_urlsafe(18), "reader": secrets.token_urlsafe(18)}
ALIASES = {"edge": "edge", "cloud": "cloud"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow-release"), users=USERS, auth_cache_seconds=60) as running:
        yield running


@pytest.fixture
def login(server, monkeypatch):
    """MLflow's own login variables, as a release manager's shell has them; no retries (an
    unreachable server answers at once)."""
    def as_user(user: str) -> None:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", USERS[user])

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("ONNXCAST_CHANNEL_ALIASES", raising=False)
    as_user("pipeline")
    return as_user


@pytest.fixture
def released(server, login, make_run, tmp_path):
    """A registered model with versions 1 and 2; edge and cloud promoted to v1, then to v2, by
    releases: the aliases edge, cloud and champion on v2."""
    from onnxcast.registry.release import Registry, promote

    base = f"{server.url}/api/2.0/mlflow"
    name, first = register_version(base, server.auth("pipeline"), "release")
    second = add_version(base, server.auth("pipeline"), name, first)
    store = str(tmp_path / "store")
    registry = Registry(server.url, ALIASES)
    for report, version in ((make_run("a"), first), (make_run("b"), second)):
        promote(report, store, name, ["edge", "cloud"], registry=registry, version=version, reason=f"v{version}")
    return {"name": name, "first": first, "second": second, "store": store, "registry": registry, "base": base}


def pointer(store: str, name: str, channel: str = "edge") -> dict:
    return json.loads((Path(store) / name / "channels" / f"{channel}.json").read_text())["signed"]


def model_tags(base: str, auth, name: str) -> dict:
    import requests

    model = requests.get(f"{base}/registered-models/get", params={"name": name}, auth=auth,
                         timeout=30).json()["registered_model"]
    return {t["key"]: t["value"] for t in model.get("tags", [])}


def watcher_requests(server, store: str, name: str) -> list:
    """What the alias watcher would ask for this model now: its decision on this registry and store."""
    from datetime import UTC, datetime

    from onnxcast.registry.alias_rollout import read_registry, read_serving, reconcile
    from onnxcast.registry.tracking import client_for
    from onnxcast.rollout.store import open_store

    states = [s for s in read_registry(client_for(server.url), ALIASES) if s.name == name]
    opened = open_store(store)
    served = read_serving(states, ALIASES, lambda m, c: (opened.read_channel(m, c).value or {}).get("version"))
    return reconcile(states, served, ALIASES, datetime.now(UTC))[0]


class TestPromote:
    def test_a_promotion_moves_the_channel_aliases_and_champion(self, server, released):
        r = released
        assert aliases(r["base"], server.auth("reader"), r["name"]) == {
            "edge": r["second"], "cloud": r["second"], "champion": r["second"]}
        tags = model_tags(r["base"], server.auth("reader"), r["name"])
        assert json.loads(tags["onnxcast.release"])["state"] == "done"
        history = sorted(json.loads(v)["version"] for k, v in tags.items() if k.startswith("onnxcast.champion."))
        assert r["second"] in history  # the champion's moves (one tag per second)
        assert watcher_requests(server, r["store"], r["name"]) == []

    def test_a_store_version_the_registry_does_not_have_moves_nothing(self, released, make_run):
        from onnxcast.registry.release import ReleaseError, promote

        r = released
        before = pointer(r["store"], r["name"])
        with pytest.raises(ReleaseError, match=r"has no version 77, so its aliases \(edge, champion\) cannot follow "
                                               r"the channel to it; nothing moved"):
            promote(make_run("c"), r["store"], r["name"], ["edge"], registry=r["registry"], version="77")
        assert pointer(r["store"], r["name"]) == before
        assert not (Path(r["store"]) / r["name"] / "versions" / "77").exists()  # checked before the upload

    def test_a_registry_request_whose_alias_moved_on_is_superseded(self, released, make_run):
        from onnxcast.registry.release import Superseded, promote

        r = released
        with pytest.raises(Superseded, match=f"alias edge of {r['name']} names v{r['second']} now, "
                                             f"not v{r['first']}") as caught:
            promote(make_run("a"), r["store"], r["name"], ["edge"], registry=r["registry"], version=r["first"],
                    expect_alias=("edge", r["first"]))
        assert caught.value.now == r["second"]
        assert pointer(r["store"], r["name"])["version"] == r["second"]


class TestRollback:
    def test_rollback_moves_pointer_and_aliases_together_and_the_watcher_agrees(self, server, released):
        from onnxcast.registry.release import rollback

        r = released
        release = rollback(r["store"], r["name"], "edge", registry=r["registry"], reason="bad forecasts")
        assert release.line() == (f"{r['name']} channel edge: rolled back from {r['second']} to {r['first']}; "
                                  f"registry aliases edge v{r['second']} -> v{r['first']}, champion v{r['second']} "
                                  f"-> v{r['first']} ({server.url})")
        signed = pointer(r["store"], r["name"])
        assert (signed["version"], signed["action"], signed["rollback"]["version"]) == (r["first"], "rollback",
                                                                                       r["first"])
        assert aliases(r["base"], server.auth("reader"), r["name"]) == {
            "edge": r["first"], "champion": r["first"], "cloud": r["second"]}
        record = json.loads(model_tags(r["base"], server.auth("reader"), r["name"])["onnxcast.release"])
        assert (record["state"], record["action"], record["channels"]["edge"]) == (
            "done", "rollback", {"from": r["second"], "to": r["first"]})
        assert watcher_requests(server, r["store"], r["name"]) == []  # nothing to redeploy

    def test_an_unreachable_registry_moves_nothing(self, released):
        from serve_support import free_port

        from onnxcast.registry.release import Registry, ReleaseError, rollback

        r = released
        before = pointer(r["store"], r["name"])
        gone = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(ReleaseError, match=f"registry {gone}: reading registered model .* failed: unreachable"):
            rollback(r["store"], r["name"], "edge", registry=Registry(gone, ALIASES), reason="incident")
        assert pointer(r["store"], r["name"]) == before

    def test_a_user_who_may_not_edit_the_model_moves_nothing(self, server, released, login):
        from onnxcast.registry.release import ReleaseError, rollback

        r = released
        before = pointer(r["store"], r["name"])
        login("reader")
        with pytest.raises(ReleaseError, match="writing tag onnxcast.release on .* failed: HTTP 403: reader may not"):
            rollback(r["store"], r["name"], "edge", registry=r["registry"], reason="incident")
        assert pointer(r["store"], r["name"]) == before
        assert aliases(r["base"], server.auth("reader"), r["name"])["edge"] == r["second"]

    def test_aliases_that_fail_after_the_pointer_moved_are_restored(self, server, released):
        """The registry refuses the alias move after the check passed: the pointer is moved back
        (a newly signed pointer with a rollback record, so a device that installed v1 meanwhile
        may go back) and the line names what failed and what was restored."""
        from onnxcast.registry.release import Registry, ReleaseError, rollback

        r = released
        proxy = FaultyProxy(server.url, {("POST", "/api/2.0/mlflow/registered-models/alias")})
        try:
            with pytest.raises(ReleaseError) as caught:
                rollback(r["store"], r["name"], "edge", registry=Registry(proxy.url, ALIASES), reason="incident")
        finally:
            proxy.close()
        line = str(caught.value)
        assert "\n" not in line
        assert line.startswith(f"registry {proxy.url}: moving alias edge of {r['name']} to v{r['first']} failed: "
                               "HTTP 403"), line
        assert line.endswith(f"; channel edge restored to v{r['second']}"), line
        signed = pointer(r["store"], r["name"])
        assert (signed["version"], signed["action"], signed["rollback"]["version"]) == (r["second"], "restore",
                                                                                       r["second"])
        assert [e["action"] for e in signed["history"]][-2:] == ["rollback", "restore"]
        assert aliases(r["base"], server.auth("reader"), r["name"]) == {
            "edge": r["second"], "cloud": r["second"], "champion": r["second"]}
        record = json.loads(model_tags(r["base"], server.auth("reader"), r["name"])["onnxcast.release"])
        assert record["state"] == "restored" and "HTTP 403" in record["error"]

    def test_champion_held_by_another_channel_moves_nothing(self, server, released):
        from onnxcast.registry.release import Registry, ReleaseError, rollback

        r = released
        held = Registry(server.url, {"edge": "edge", "cloud": "champion"})
        before = pointer(r["store"], r["name"])
        with pytest.raises(ReleaseError, match="alias champion of .* is channel cloud's alias .* this rollback does "
                                               "not move cloud: moving champion to v1 would redeploy cloud; "
                                               "nothing moved"):
            rollback(r["store"], r["name"], "edge", registry=held, reason="incident")
        assert pointer(r["store"], r["name"]) == before
        kept = rollback(r["store"], r["name"], "edge", registry=held, reason="incident", move_champion=False)
        assert [m.alias for m in kept.aliases] == ["edge"]

    def test_without_a_registry_only_the_pointer_moves_and_says_so(self, server, released):
        from onnxcast.registry.release import rollback

        r = released
        release = rollback(r["store"], r["name"], "edge", registry=None, reason="incident")
        assert release.line().endswith("; channel pointer only: no registry configured (set MLFLOW_TRACKING_URI "
                                       "or pass --tracking-uri to move the aliases too)")
        assert aliases(r["base"], server.auth("reader"), r["name"])["edge"] == r["second"]

    def test_a_model_the_registry_does_not_have_moves_the_pointer_and_says_so(self, server, login, make_run, tmp_path):
        from onnxcast.registry.release import Registry, promote, rollback

        store, registry = str(tmp_path / "store"), Registry(server.url, ALIASES)
        for tag in ("a", "b"):
            promote(make_run(tag), store, "never-registered", ["edge"], registry=registry, version=f"v-{tag}")
        release = rollback(store, "never-registered", "edge", registry=registry, reason="r")
        assert release.moved == ("edge",)
        assert release.line().endswith(f"channel pointer only: 'never-registered' is not a registered model in the "
                                       f"registry at {server.url} (no aliases)")


class TestCommandLine:
    def test_rollback_with_a_registry_moves_the_aliases(self, server, released, monkeypatch, capsys):
        from onnxcast import cli

        r = released
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        code = cli.main(["rollback", "--store", r["store"], "--model", r["name"], "--channel", "edge",
                         "--reason", "bad forecasts"])
        out = capsys.readouterr()
        assert code == 0, out.err
        assert f"rolled back from {r['second']} to {r['first']}; registry aliases edge v{r['second']} -> " \
               f"v{r['first']}, champion v{r['second']} -> v{r['first']}" in out.out
        assert aliases(r["base"], server.auth("reader"), r["name"])["edge"] == r["first"]

    def test_the_console_script_refuses_on_one_line_and_moves_nothing(self, server, released):
        r = released
        before = pointer(r["store"], r["name"])
        env = {**os.environ, "MLFLOW_TRACKING_USERNAME": "reader", "MLFLOW_TRACKING_PASSWORD": USERS["reader"]}
        done = subprocess.run([str(Path(sys.executable).with_name("onnxcast")), "rollback", "--store", r["store"],
                               "--model", r["name"], "--channel", "edge", "--reason", "incident", "--tracking-uri",
                               server.url], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 1, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"error: registry {server.url}: writing tag onnxcast.release on {r['name']} failed: "
                               "HTTP 403: reader may not do that"), line
        assert USERS["reader"] not in done.stderr + done.stdout
        assert pointer(r["store"], r["name"]) == before

    def test_the_console_script_rolls_back_and_the_pointer_only_switch_says_what_it_skipped(self, server, released):
        r = released
        onnxcast = str(Path(sys.executable).with_name("onnxcast"))
        args = ["--store", r["store"], "--model", r["name"], "--reason", "incident", "--tracking-uri", server.url]
        done = subprocess.run([onnxcast, "rollback", "--channel", "edge", *args], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == (f"{r['name']} channel edge: rolled back from {r['second']} to {r['first']}; "
                                       f"registry aliases edge v{r['second']} -> v{r['first']}, champion "
                                       f"v{r['second']} -> v{r['first']} ({server.url})")
        skipped = subprocess.run([onnxcast, "rollback", "--channel", "cloud", "--pointer-only", *args],
                                 capture_output=True, text=True, timeout=300)
        assert skipped.returncode == 0, skipped.stderr
        assert skipped.stdout.strip().endswith("; channel pointer only: --pointer-only: the registry aliases were "
                                               "not moved; an alias watcher that reads them will move the channel "
                                               "back unless they are moved too")
        assert aliases(r["base"], server.auth("reader"), r["name"])["cloud"] == r["second"]


class TestHalfMoved:
    def test_a_promotion_whose_second_channel_loses_a_race_leaves_the_first_as_it_was(self, server, released,
                                                                                      make_run):
        """edge moves, then another writer wins cloud's compare-and-swap: edge is restored and no
        alias moves (before, edge stayed on the new version with the registry on the old one)."""
        from onnxcast.base.errors import ConflictError
        from onnxcast.registry.release import ReleaseError, promote
        from onnxcast.rollout.store import LocalStore

        r = released
        base = f"{server.url}/api/2.0/mlflow"
        third = add_version(base, server.auth("pipeline"), r["name"], r["first"])

        class CloudLosesTheRace(LocalStore):
            def replace_pointer(self, key, value, token):
                if key.endswith("/channels/cloud.json"):
                    raise ConflictError(f"{self.url(key)}: moved by another writer since it was read")
                return super().replace_pointer(key, value, token)

        with pytest.raises(ReleaseError) as caught:
            promote(make_run("c"), CloudLosesTheRace(Path(r["store"])), r["name"], ["edge", "cloud"],
                    registry=r["registry"], version=third, reason="third")
        line = str(caught.value)
        assert "channels/cloud.json: moved by another writer since it was read" in line
        assert line.endswith(f"; channel edge restored to v{r['second']}"), line
        assert (pointer(r["store"], r["name"])["version"], pointer(r["store"], r["name"])["action"]) == (
            r["second"], "restore")
        assert aliases(r["base"], server.auth("reader"), r["name"]) == {
            "edge": r["second"], "cloud": r["second"], "champion": r["second"]}
        record = json.loads(model_tags(r["base"], server.auth("reader"), r["name"])["onnxcast.release"])
        assert record["state"] == "failed" and "another writer" in record["error"]
