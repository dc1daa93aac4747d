"""reconcile(): registry aliases + what each channel serves -> promotion requests (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from onnxcast.registry.alias_rollout import (
    ModelState,
    Request,
    parse_channel_aliases,
    promote_run_id,
    reconcile,
    rollout_tag,
    state_value,
)

NOW = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)
ALIASES = {"edge": "edge", "cloud": "cloud"}


def tag(channel: str, state: str, minutes_ago: float = 1) -> dict[str, str]:
    return {rollout_tag(channel): state_value(state, at=NOW - timedelta(minutes=minutes_ago), reason="r",
                                              run_id="x")}


def model(aliases: dict, versions: dict | None = None, name: str = "demand") -> ModelState:
    return ModelState(name, aliases, versions if versions is not None else {v: {} for v in aliases.values()})


class TestReconcile:
    def test_alias_on_another_version_than_the_channel_serves_is_a_request(self):
        requests, notes = reconcile([model({"edge": "3"})], {("demand", "edge"): "2"}, ALIASES, NOW)
        assert requests == [Request("demand", "edge", "edge", "3", "2")] and notes == []

    def test_alias_on_the_served_version_asks_nothing(self):
        assert reconcile([model({"edge": "2", "cloud": "2"})],
                         {("demand", "edge"): "2", ("demand", "cloud"): "2"}, ALIASES, NOW) == ([], [])

    def test_channel_without_a_pointer_yet_is_a_first_deployment(self):
        requests, _ = reconcile([model({"cloud": "1"})], {("demand", "cloud"): None}, ALIASES, NOW)
        assert requests == [Request("demand", "cloud", "cloud", "1", None)]

    def test_channel_that_could_not_be_read_is_left_alone(self):
        assert reconcile([model({"edge": "3"})], {}, ALIASES, NOW) == ([], [])

    def test_fresh_pending_is_not_asked_again_but_a_stale_one_is(self):
        fresh = model({"edge": "3"}, {"3": tag("edge", "pending", minutes_ago=5)})
        stale = model({"edge": "3"}, {"3": tag("edge", "pending", minutes_ago=31)})
        assert reconcile([fresh], {("demand", "edge"): "2"}, ALIASES, NOW) == ([], [])
        assert len(reconcile([stale], {("demand", "edge"): "2"}, ALIASES, NOW)[0]) == 1

    def test_pending_of_another_channel_does_not_block(self):
        state = model({"edge": "3"}, {"3": tag("cloud", "pending")})
        assert len(reconcile([state], {("demand", "edge"): "2"}, ALIASES, NOW)[0]) == 1

    def test_refused_version_is_not_asked_again_and_its_alias_goes_back(self):
        state = model({"edge": "3"}, {"3": tag("edge", "refused", minutes_ago=120)})
        requests, notes = reconcile([state], {("demand", "edge"): "2"}, ALIASES, NOW)
        assert requests == [Request("demand", "edge", "edge", "3", "2", "revert")] and "refused" in notes[0]

    def test_deployed_before_and_rolled_back_is_asked_again(self):
        # the alias is the desired state: a rollback that left the alias on v3 is undone
        state = model({"edge": "3"}, {"3": tag("edge", "deployed")})
        assert len(reconcile([state], {("demand", "edge"): "2"}, ALIASES, NOW)[0]) == 1

    def test_alias_on_a_deleted_version_is_a_note(self):
        state = model({"edge": "7"}, {"7": None})
        requests, notes = reconcile([state], {("demand", "edge"): "2"}, ALIASES, NOW)
        assert requests == [] and "does not exist" in notes[0]

    @pytest.mark.parametrize("name", ["../etc", "a/b", "", "x" * 200, "bad name"])
    def test_untrusted_model_names_never_become_requests(self, name):
        requests, notes = reconcile([model({"edge": "3"}, name=name)], {(name, "edge"): "2"}, ALIASES, NOW)
        assert requests == [] and notes

    @pytest.mark.parametrize("version", ["0", "3a", "-1", "1" * 12, "../1"])
    def test_versions_that_are_not_numbers_are_ignored(self, version):
        requests, notes = reconcile([model({"edge": version})], {("demand", "edge"): "2"}, ALIASES, NOW)
        assert requests == [] and notes

    def test_failed_on_an_outage_is_asked_again_after_the_pending_expiry(self):
        served = {("demand", "edge"): "2"}
        fresh = model({"edge": "3"}, {"3": tag("edge", "failed", minutes_ago=5)})
        stale = model({"edge": "3"}, {"3": tag("edge", "failed", minutes_ago=31)})
        assert reconcile([fresh], served, ALIASES, NOW) == ([], [])
        assert reconcile([stale], served, ALIASES, NOW)[0] == [Request("demand", "edge", "edge", "3", "2")]

    def test_superseded_version_named_again_is_asked_again(self):
        state = model({"edge": "3"}, {"3": tag("edge", "superseded")})
        assert reconcile([state], {("demand", "edge"): "2"}, ALIASES, NOW)[0] == [
            Request("demand", "edge", "edge", "3", "2")]

    def test_unreadable_tag_does_not_block(self):
        state = model({"edge": "3"}, {"3": {rollout_tag("edge"): "{not json"}})
        assert len(reconcile([state], {("demand", "edge"): "2"}, ALIASES, NOW)[0]) == 1


class TestChannelAliases:
    def test_default_and_champion_on_one_channel(self):
        assert parse_channel_aliases(None, ("edge", "cloud")) == {"edge": "edge", "cloud": "cloud"}
        assert parse_channel_aliases("edge=edge, cloud=champion", ("edge", "cloud")) == {
            "edge": "edge", "cloud": "champion"}

    @pytest.mark.parametrize("text, fault", [("edge=latest", "reserved"), ("gpu=x", "gpu"),
                                             ("edge", "<channel>=<alias>"), ("edge=a b", "a b"),
                                             ("edge=a,edge=b", "twice"),
                                             # every trained model gets challenger: it would deploy them all
                                             ("cloud=challenger", "reserved"), ("edge=Challenger", "reserved"),
                                             # a refusal on one channel would move what the other serves
                                             ("edge=prod,cloud=prod", "'prod' is named for channels edge and cloud"),
                                             ("edge=champion,cloud=champion", "one alias drives one channel")])
    def test_bad_settings_name_the_part_at_fault(self, text, fault):
        with pytest.raises(ValueError, match=fault):
            parse_channel_aliases(text, ("edge", "cloud"))


class TestCheckRequest:
    """The registry read again before a request starts a promotion."""

    @staticmethod
    def registry(alias_version, tags=None):
        from types import SimpleNamespace

        from mlflow.exceptions import MlflowException

        def by_alias(name, alias):
            if alias_version is None:
                raise MlflowException("no alias", error_code="INVALID_PARAMETER_VALUE")
            return SimpleNamespace(version=alias_version)

        return SimpleNamespace(get_model_version_by_alias=by_alias,
                               get_model_version=lambda name, version: SimpleNamespace(tags=tags or {}))

    def test_the_watchers_pending_request_passes(self):
        from onnxcast.registry.alias_rollout import check_request

        tags = {rollout_tag("edge"): state_value("pending", at=NOW, reason="r", run_id="run-1")}
        assert check_request(self.registry("3", tags), "demand", "edge", "edge", "3", "run-1") is None
        assert check_request(self.registry("3"), "demand", "edge", "edge", "3", "run-1") is None

    @pytest.mark.parametrize("alias_version, state, run_id, fault", [
        ("4", None, None, "names v4, not v3"), (None, None, None, "names no version"),
        ("3", "pending", "run-0", "not pending for run-1"), ("3", "refused", "run-1", "is refused")])
    def test_what_the_registry_no_longer_asks_for_is_named(self, alias_version, state, run_id, fault):
        from onnxcast.registry.alias_rollout import check_request

        tags = {rollout_tag("edge"): state_value(state, at=NOW, reason="r", run_id=run_id)} if state else {}
        assert fault in check_request(self.registry(alias_version, tags), "demand", "edge", "edge", "3", "run-1")


class TestRunIdAndTag:
    def test_run_id_is_deterministic_and_safe(self):
        first = promote_run_id("demand.v2", "edge", "3", "20261202T010000Z")
        assert first == promote_run_id("demand.v2", "edge", "3", "20261202T010000Z")
        assert first == "registry__demand.v2__edge__v3__20261202T010000Z"
        with pytest.raises(ValueError):
            promote_run_id("../x", "edge", "3", "t")

    def test_tag_value_is_bounded_json(self):
        value = json.loads(state_value("refused", at=NOW, reason="x" * 10_000, run_id="r"))
        assert value["state"] == "refused" and len(value["reason"]) == 1000 and value["at"].startswith("2026-12-02")
