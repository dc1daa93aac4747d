"""The releases the DAG tasks ask for (onnxcast.registry.release), without Airflow, on a real signed
local store and no registry (the pointer only): a promotion after the champion/challenger decision,
a rollback a retried task makes once, a refresh of the channels that exist."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from run_fixtures import tiny_lstm_run, tiny_lstm_run_copy  # noqa: F401  (fixtures)

from onnxcast.base.errors import ConfigError
from onnxcast.registry.release import (
    GatesRechecked,
    NotPromoted,
    checked_decision,
    promote,
    promote_run,
    refresh_channels,
    rollback,
    rollback_once,
)


def pointer(store: Path, channel: str = "edge") -> dict:
    return json.loads((store / "m" / "channels" / f"{channel}.json").read_text())["signed"]


def never(what: str):
    def called():
        raise AssertionError(f"{what} was opened, though the release never got that far")

    return called


@pytest.fixture
def store(tmp_path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def promoted(make_run, store) -> Path:
    """Versions 1, 2 and 3 promoted to edge one after the other."""
    for version in ("1", "2", "3"):
        promote(make_run(version), str(store), "m", ["edge"], registry=None, version=version, reason=f"v{version}")
    return store


class TestDecision:
    def test_no_decision_asked_for_is_none(self):
        assert checked_decision("{{ ti.xcom_pull('decide') }}", required=False) is None

    @pytest.mark.parametrize("given", [None, "{'promote': True}", {"promote": "yes"}, {"reason": "better"}])
    def test_anything_but_the_decision_refuses_to_promote(self, given):
        with pytest.raises(ConfigError, match="refusing to promote: decision must be the champion/challenger "
                                              "result.*render_template_as_native_obj"):
            checked_decision(given, required=True)

    def test_the_decision_passes(self):
        decision = {"promote": False, "reason": "the champion is better"}
        assert checked_decision(decision, required=True) is decision


class TestPromoteRun:
    def test_a_kept_champion_promotes_nothing_and_opens_neither_store_nor_key(self, make_run):
        cfg = SimpleNamespace(run_dir=make_run("a").parent, model_name="m")
        with pytest.raises(NotPromoted, match="not promoted: the champion is better"):
            promote_run(cfg, never("the store"), ["edge"], registry=None, version="1",
                        decision={"promote": False, "reason": "the champion is better"}, signers=never("the key"))

    def test_a_won_decision_promotes_with_its_reason(self, make_run, store):
        cfg = SimpleNamespace(run_dir=make_run("a").parent, model_name="m")
        release = promote_run(cfg, lambda: str(store), ["edge", "cloud"], registry=None, version="7",
                              decision={"promote": True, "reason": "challenger better (p=0.01)"}, actor="tester")
        assert release.moved == ("edge", "cloud") and release.version == "7"
        assert release.manifest == f"{store}/m/versions/7/manifest.json" and Path(release.manifest).is_file()
        assert pointer(store)["history"][-1]["reason"] == "challenger better (p=0.01)"

    def test_the_given_reason_wins_over_the_decisions(self, make_run, store):
        cfg = SimpleNamespace(run_dir=make_run("a").parent, model_name="m")
        promote_run(cfg, str(store), ["edge"], registry=None, version="7", reason="hotfix",
                    decision={"promote": True, "reason": "better"})
        assert pointer(store)["history"][-1]["reason"] == "hotfix"


class TestRollbackOnce:
    def test_a_retried_rollback_does_not_walk_further_back(self, promoted):
        first = rollback_once(str(promoted), "m", "edge", registry=None, actor="airflow:run/1", reason="bad")
        again = rollback_once(str(promoted), "m", "edge", registry=None, actor="airflow:run/1", reason="bad")
        assert (first.channels, first.moved, first.repeated) == ({"edge": ("3", "2")}, ("edge",), False)
        assert (again.channels, again.moved, again.repeated) == ({"edge": ("3", "2")}, (), True)
        assert pointer(promoted)["version"] == "2"

    def test_another_rollback_still_moves(self, promoted):
        rollback_once(str(promoted), "m", "edge", registry=None, actor="airflow:run/1", reason="bad")
        other = rollback_once(str(promoted), "m", "edge", registry=None, actor="airflow:run/2", reason="bad")
        assert other.moved == ("edge",) and pointer(promoted)["version"] == "1"

    def test_a_rollback_someone_else_made_after_is_not_taken_for_this_one(self, promoted):
        rollback_once(str(promoted), "m", "edge", registry=None, actor="airflow:run/1", reason="bad")
        rollback(str(promoted), "m", "edge", registry=None, to_version="3", actor="oncall", reason="was fine")
        again = rollback_once(str(promoted), "m", "edge", registry=None, actor="airflow:run/1", reason="bad")
        assert again.moved == ("edge",) and not again.repeated


class TestRefreshChannels:
    def test_only_channels_that_exist_are_re_signed(self, promoted):
        before = pointer(promoted)
        done = refresh_channels(str(promoted), "m", ["edge", "cloud"], expires_days="2", actor="tester")
        assert done["cloud"] is None
        signed = pointer(promoted)
        assert done["edge"].signed["counter"] == signed["counter"] > before["counter"]
        assert signed["version"] == before["version"] == "3"

    def test_no_channel_to_refresh_needs_no_key(self, store):
        assert refresh_channels(str(store), "m", "edge", signers=never("the key")) == {"edge": None}


def test_a_kept_champion_needs_no_registry_either(make_run):
    cfg = SimpleNamespace(run_dir=make_run("a").parent, model_name="m")
    with pytest.raises(NotPromoted):
        promote_run(cfg, never("the store"), ["edge"], registry=never("the registry"), version="1",
                    decision={"promote": False, "reason": "kept"}, signers=never("the key"))


def test_a_retried_rollback_opens_neither_key_nor_registry(promoted):
    rollback_once(str(promoted), "m", "edge", registry=None, actor="airflow:run/1", reason="bad")
    again = rollback_once(str(promoted), "m", "edge", registry=never("the registry"), actor="airflow:run/1",
                          reason="bad", signers=never("the key"))
    assert again.repeated and again.line() == "m channel edge: already at 2; channel pointer only: an earlier try " \
                                              "made this rollback"


@pytest.mark.slow
class TestGatesRechecked:
    """A staged version's report is rebuilt from its validation before promotion (onnxcast_promote)."""

    @pytest.fixture
    def staged_cfg(self, tiny_lstm_run_copy):  # noqa: F811
        from onnxcast.base.files import write_json
        from onnxcast.pipeline.config import PipelineConfig

        cfg = PipelineConfig.load(Path(tiny_lstm_run_copy) / "config.json")
        write_json(cfg.layout.staged, {"mlflow": {"model": "m", "version": "4"}})
        return cfg

    def test_a_passing_run_is_promoted_with_the_staged_versions_registry_entry(self, staged_cfg, store):
        release = promote_run(staged_cfg, str(store), ["edge"], registry=None, version="4", reassemble=True)
        assert release.moved == ("edge",)
        assert json.loads(staged_cfg.layout.report.read_text())["mlflow"] == {"model": "m", "version": "4"}

    def test_a_failed_gate_refuses_the_promotion_in_one_line(self, staged_cfg, store):
        from onnxcast.base.files import read_json, write_json

        for family in staged_cfg.models:
            path = staged_cfg.layout.validation(family)
            write_json(path, {**read_json(path), "gates_passed": False, "failures": ["parity 0.1 > 0.0001"]})
        with pytest.raises(GatesRechecked) as caught:
            promote_run(staged_cfg, never("the store"), ["edge"], registry=None, version="4", reassemble=True)
        assert str(caught.value) == ("gates re-checked and failed: validation gate(s) failed: "
                                     f"{staged_cfg.models[0]}: parity 0.1 > 0.0001")
