"""What an onnxcast_promote run writes back on the model version (onnxcast.registry.registry_rollout
.report_rollout), without Airflow: deployed, refused (a registry-sourced run's alias goes back to
what the channel serves), failed (an outage: the alias stays for the watcher to ask again),
superseded; and which task's failure is named. What the alias watcher asks for (watch_once)."""

from __future__ import annotations

import pytest
from rollout_support import RecordingRegistry

from onnxcast.registry.registry_rollout import (
    PromoteRun,
    RolloutRefused,
    report_rollout,
    watch_once,
)
from onnxcast.registry.release import Registry


@pytest.fixture
def registry():
    registry = Registry("http://registry.invalid", {"edge": "edge", "cloud": "cloud"})
    registry._client = RecordingRegistry({"edge": "5"})  # noqa: SLF001 - a recording client in place of MLflow's
    return registry


def report(registry, run: PromoteRun, *, channels=("edge",), serving=None, source="registry", alias="edge"):
    return report_rollout(registry, "demand", "5", list(channels), run, run_id="registry__demand__edge__v5__x",
                          source=source, alias=alias, serving=lambda channel: (serving or {}).get(channel))


def state(registry, channel: str = "edge") -> dict:
    return registry.client.tags[("5", f"onnxcast.rollout.{channel}")]


class TestReportRollout:
    def test_a_promoted_channel_is_deployed(self, registry):
        run = PromoteRun(promoted={"channels": {"edge": "moved"}}, staged_version="5")
        assert report(registry, run)["state"] == "deployed"
        assert state(registry)["state"] == "deployed" and state(registry)["reason"] == "promoted"
        assert registry.client.aliases == {"edge": "5"}

    def test_a_refusal_writes_refused_and_moves_the_alias_back_to_what_the_channel_serves(self, registry):
        run = PromoteRun(failures={"validate": ("gate parity failed", "refused")}, staged_version="5")
        with pytest.raises(RolloutRefused, match="refused demand v5 for edge: validate: gate parity failed"):
            report(registry, run, serving={"edge": "4"})
        assert state(registry)["state"] == "refused"
        assert registry.client.aliases == {"edge": "4"}

    def test_a_refusal_on_a_channel_that_serves_nothing_deletes_the_alias(self, registry):
        run = PromoteRun(failures={"promote": ("conflict", "refused")}, staged_version="5")
        with pytest.raises(RolloutRefused):
            report(registry, run)
        assert registry.client.aliases == {}

    def test_a_manual_run_refused_leaves_the_aliases_alone(self, registry):
        run = PromoteRun(failures={"promote": ("conflict", "refused")}, staged_version="5")
        with pytest.raises(RolloutRefused):
            report(registry, run, serving={"edge": "4"}, source=None, alias=None)
        assert state(registry)["state"] == "refused" and registry.client.aliases == {"edge": "5"}

    def test_an_outage_is_failed_and_the_alias_stays(self, registry):
        run = PromoteRun(failures={"stage_version": ("ConnectionError: MLflow unreachable", "failed")},
                         staged_version="5")
        with pytest.raises(RolloutRefused, match="failed demand v5 for edge: stage_version: ConnectionError"):
            report(registry, run, serving={"edge": "4"})
        assert state(registry)["state"] == "failed"
        assert registry.client.aliases == {"edge": "5"}

    def test_no_failure_recorded_is_an_outage_not_a_refusal(self, registry):
        """A killed task, an upstream that never ran: nothing refused the version."""
        with pytest.raises(RolloutRefused, match="failed demand v5 for edge: the promotion did not complete"):
            report(registry, PromoteRun(staged_version="5"), serving={"edge": "4"})
        assert state(registry)["state"] == "failed"

    def test_a_channel_another_run_moved_to_the_version_is_deployed(self, registry):
        run = PromoteRun(failures={"promote": ("conflict: the pointer moved", "refused")}, staged_version="5")
        assert report(registry, run, serving={"edge": "5"})["state"] == "deployed"
        assert state(registry)["reason"].startswith("the channel serves it (this run: promote: conflict")
        assert registry.client.aliases == {"edge": "5"}

    def test_superseded_writes_superseded_on_every_channel_and_leaves_the_alias(self, registry):
        registry.client.aliases = {"edge": "6"}
        out = report(registry, PromoteRun(superseded="6", staged_version="5"), channels=("edge", "cloud"))
        assert out == {"model": "demand", "version": "5", "channels": ["edge", "cloud"], "state": "superseded"}
        assert state(registry, "cloud")["state"] == "superseded"
        assert state(registry)["reason"] == "alias edge moved on to v6 first"
        assert registry.client.aliases == {"edge": "6"}

    def test_one_channel_refused_of_two_fails_naming_it(self, registry):
        run = PromoteRun(promoted={"channels": {"edge": "moved"}}, staged_version="5")
        with pytest.raises(RolloutRefused, match="refused demand v5 for cloud: the promotion did not move"):
            report(registry, run, channels=("edge", "cloud"), serving={"cloud": "4"}, source=None, alias=None)
        assert (state(registry)["state"], state(registry, "cloud")["state"]) == ("deployed", "refused")

    def test_a_numbered_ref_names_the_version_when_nothing_was_staged(self, registry):
        run = PromoteRun(promoted={"channels": {"edge": "moved"}})
        assert report(registry, run)["version"] == "5"


class TestFailureNamed:
    def test_the_first_task_in_order_that_recorded_a_failure_is_named(self):
        run = PromoteRun(failures={"promote": ("late", "failed"), "validate": ("gate", "refused"),
                                   "stage_version": (None, None)})
        assert run.failure() == ("validate: gate", "refused")

    def test_a_failure_without_its_kind_counts_as_a_refusal(self):
        assert PromoteRun(failures={"promote": ("conflict", None)}).failure() == ("promote: conflict", "refused")


class TestWatchOnce:
    """One look of the alias watcher (watch_once), on a local MLflow store and a signed local store."""

    @pytest.fixture
    def watched(self, tmp_path, make_run):
        from onnxcast.registry.tracking import client_for
        from onnxcast.rollout.store import open_store

        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        client = client_for(uri)
        client.create_registered_model("watched")
        for _ in range(2):
            client.create_model_version("watched", source=str(tmp_path), run_id=None)
        store = tmp_path / "store"
        promote_pointer_only(make_run("a"), str(store), "1")
        return Registry(uri, {"edge": "edge", "cloud": "cloud"}), open_store(str(store)), client

    def test_an_alias_ahead_of_its_channel_is_requested_once_and_marked_pending(self, watched):
        from datetime import UTC, datetime

        from onnxcast.registry.alias_rollout import rollout_state

        registry, store, client = watched
        client.set_registered_model_alias("watched", "edge", "2")
        now = datetime(2026, 12, 5, 1, 0, tzinfo=UTC)
        payloads, notes = watch_once(registry, store, now)
        assert [(p["model"], p["channel"], p["version"], p["run_id"]) for p in payloads] == [
            ("watched", "edge", "2", "registry__watched__edge__v2__20261205T010000Z")]
        assert notes[-1] == "watched@edge names v2, channel edge serves v1: promotion requested"
        assert rollout_state(client.get_model_version("watched", "2").tags, "edge")["state"] == "pending"
        assert watch_once(registry, store, now)[0] == []  # pending: not asked again

    def test_an_alias_on_what_the_channel_serves_asks_nothing(self, watched):
        registry, store, client = watched
        client.set_registered_model_alias("watched", "edge", "1")
        assert watch_once(registry, store)[0] == []

    def test_an_alias_set_again_on_a_refused_version_goes_back_to_what_the_channel_serves(self, watched):
        from datetime import UTC, datetime

        from onnxcast.registry.alias_rollout import state_value

        registry, store, client = watched
        client.set_model_version_tag("watched", "2", "onnxcast.rollout.edge",
                                     state_value("refused", at=datetime.now(UTC), reason="gate", run_id="r"))
        client.set_registered_model_alias("watched", "edge", "2")
        payloads, notes = watch_once(registry, store)
        assert payloads == [] and "alias edge moved back to v1" in " ".join(notes)
        assert str(client.get_model_version_by_alias("watched", "edge").version) == "1"


def promote_pointer_only(report, store: str, version: str) -> None:
    from onnxcast.registry.release import promote

    promote(report, store, "watched", ["edge"], registry=None, version=version, reason="first")
