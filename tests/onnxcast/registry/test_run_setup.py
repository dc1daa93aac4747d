"""What a training run starts from (onnxcast.registry.run_setup), without Airflow: the plan of its
families and whether the registry's champion is evaluated beside them, and the record of the
retraining it answers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import onnxcast.registry.run_setup as run_setup
from onnxcast.base.errors import ConfigError
from onnxcast.base.files import read_json
from onnxcast.registry.fetch import FetchError
from onnxcast.registry.plan import read_plan
from onnxcast.registry.run_setup import (
    ChallengerSourceError,
    parse_extra_settings,
    plan_run,
    record_retraining,
    retraining_events,
    run_config,
)


@pytest.fixture
def cfg(tmp_path):
    return SimpleNamespace(run_dir=tmp_path, model_name="demand", models=("lstm", "transformer"), horizon=24,
                           n_features=2)


@pytest.fixture
def registry(monkeypatch):
    """A registry whose champion is v4, forecasting ``spec`` (horizon and features)."""
    state = {"champion": "4", "spec": {"family": "lstm", "horizon": 24, "n_features": 2}, "read": []}

    def alias_version(model, alias, tracking_uri=None):
        return state["champion"] if alias == "champion" else None

    def read_source_spec(uri, *, tracking_uri=None, s3_settings=None):
        state["read"].append((uri, s3_settings))
        if uri.startswith("s3://missing"):
            raise FetchError(f"{uri}: no model there")
        return dict(state["spec"])

    monkeypatch.setattr(run_setup, "alias_version", alias_version)
    monkeypatch.setattr(run_setup, "read_source_spec", read_source_spec)
    return state


class TestPlan:
    def test_a_comparable_champion_runs_beside_the_challengers(self, cfg, registry):
        plan = plan_run(cfg, tracking_uri="sqlite:///x.db")
        assert plan.families == ["lstm", "transformer", "champion"]
        assert plan.champion == {"version": "4", "source": "models:/demand/4"} and plan.notes == []
        written = read_plan(cfg.run_dir)
        assert written["families"][-1] == {"family": "champion", "source": "models:/demand/4", "role": "champion",
                                           "version": "4"}
        assert written["incomparable_champion"] is None

    def test_a_champion_of_another_horizon_is_recorded_and_not_evaluated(self, cfg, registry):
        registry["spec"]["horizon"] = 12
        plan = plan_run(cfg)
        assert plan.families == ["lstm", "transformer"] and plan.champion is None
        assert plan.notes == ["champion v4 is not comparable ({'horizon': 12} vs {'horizon': 24, 'n_features': 2})"]
        assert read_plan(cfg.run_dir)["incomparable_champion"] == {"version": "4", "differences": {"horizon": [12, 24]}}

    def test_no_champion_registered_is_noted(self, cfg, registry):
        registry["champion"] = None
        assert plan_run(cfg).notes == ["no champion registered for demand"]

    def test_comparison_off_asks_the_registry_nothing(self, cfg, registry):
        plan = plan_run(cfg, compare_with_champion=False)
        assert plan.families == ["lstm", "transformer"] and plan.notes == ["comparison with the champion is off"]
        assert registry["read"] == []

    def test_the_ensemble_is_planned_last_and_combines_the_other_families(self, cfg, registry):
        from onnxcast.registry.plan import challengers, combined, made_families, trained_apart

        cfg.models = ("lstm", "ensemble", "transformer")
        plan = plan_run(cfg, compare_with_champion=True)
        assert plan.families == ["lstm", "transformer", "ensemble", "champion"]
        written = read_plan(cfg.run_dir)
        assert written["families"][2] == {"family": "ensemble", "source": None, "role": "challenger",
                                          "combines": ["lstm", "transformer"]}
        # the training DAG trains the others in parallel, then its ensemble task makes the ensemble
        assert trained_apart(written) == ["lstm", "transformer", "champion"] and combined(written) == ["ensemble"]
        assert made_families(cfg.run_dir) == ["lstm", "transformer", "ensemble", "champion"]
        skipped = cfg.run_dir / "models" / "ensemble" / "skipped.json"  # fewer than two members trained
        skipped.parent.mkdir(parents=True)
        skipped.write_text('{"family": "ensemble", "reason": "needs at least two"}')
        assert made_families(cfg.run_dir) == ["lstm", "transformer", "champion"]
        assert challengers(cfg.run_dir) == ["lstm", "transformer"]

    def test_a_fetched_model_replaces_the_trained_families_and_settings_are_read_only_then(self, cfg, registry):
        settings = SimpleNamespace(endpoint="http://s3")
        plan = plan_run(cfg, fetch_from="s3://bucket/model", compare_with_champion=False,
                        s3_settings=lambda: settings)
        assert plan.families == ["lstm"]
        assert read_plan(cfg.run_dir)["families"] == [{"family": "lstm", "source": "s3://bucket/model",
                                                       "role": "challenger"}]
        assert registry["read"] == [("s3://bucket/model", settings)]

    def test_trained_families_never_ask_for_s3_settings(self, cfg, registry):
        def no_settings():
            raise AssertionError("S3 settings resolved for a run that fetches nothing")

        assert plan_run(cfg, fetch_from="None", compare_with_champion=False, s3_settings=no_settings).families == [
            "lstm", "transformer"]

    def test_an_unreadable_model_to_fetch_is_its_own_error(self, cfg, registry):
        with pytest.raises(ChallengerSourceError, match="s3://missing/model: no model there"):
            plan_run(cfg, fetch_from="s3://missing/model")


class TestRetrainingRecord:
    def test_the_newest_event_names_the_trigger_and_every_reason_is_kept(self, tmp_path):
        events = [{"model": "demand", "channel": "edge", "version": "3", "reasons": ["drift: load"]},
                  {"model": "demand", "channel": "cloud", "version": "4", "reasons": ["degraded: p=0.001"]}]
        trigger = record_retraining(tmp_path, events, {"horizon": 24, "lookback": 96}, ["out_dir"])
        assert trigger == {"kind": "retrain", "asset": "onnxcast_retrain", "model": "demand", "channel": "cloud",
                           "version": "4", "reasons": ["drift: load", "degraded: p=0.001"],
                           "settings": ["horizon", "lookback"], "left_out": ["out_dir"], "events": 2}
        assert read_json(tmp_path / "trigger.json") == trigger


class TestRetrainingEvents:
    @staticmethod
    def event(extra=None, source=("onnxcast_monitor", "retrain_signal")):
        return SimpleNamespace(extra={"model": "demand", "reasons": ["drift"]} if extra is None else extra,
                               source_dag_id=source[0], source_task_id=source[1])

    def test_the_monitors_events_are_taken(self):
        assert retraining_events([self.event(), self.event({"model": "other"})]) == [
            {"model": "demand", "reasons": ["drift"]}, {"model": "other"}]

    @pytest.mark.parametrize("forged, why", [
        ({"extra": {"from_rest_api": True, "model": "demand"}}, "posted through the REST API"),
        ({"extra": "not a mapping"}, "posted through the REST API"),
        ({"source": ("some_dag", "emit")}, "from some_dag.emit, not onnxcast_monitor.retrain_signal"),
    ])
    def test_a_forged_event_alone_trains_nothing(self, forged, why):
        with pytest.raises(ConfigError, match=f"refused the onnxcast_retrain event that triggered this run "
                                              f"\\({why}\\)"):
            retraining_events([self.event(**forged)])

    def test_a_forged_event_beside_the_monitors_is_left_out(self):
        assert retraining_events([self.event(source=("x", "y")), self.event()]) == [
            {"model": "demand", "reasons": ["drift"]}]

    def test_no_event_is_a_scheduled_run(self):
        assert retraining_events([]) == []


class TestRunConfig:
    SETTINGS = {"data_uri": "data.csv", "target_column": "y", "freq": "h", "horizon": 12, "lookback": 48,
                "model_name": "demand", "max_epochs": None, "series_column": "None"}

    def test_the_forms_settings_win_over_extra_and_a_retraining_event_over_both(self, tmp_path):
        cfg = run_config({**self.SETTINGS, "horizon": 24}, extra_settings='{"horizon": 6, "n_heads": 2}',
                         retrain={"lookback": 96}, run_dir=tmp_path, default_end="2026-12-01T00:00:00+00:00")
        assert (cfg.horizon, cfg.n_heads, cfg.lookback) == (24, 2, 96)
        assert cfg.out_dir == str(tmp_path) and cfg.trained_until == "2026-12-01T00:00:00+00:00"

    def test_the_training_end_given_wins_over_the_settings_and_the_interval(self, tmp_path):
        settings = {**self.SETTINGS, "trained_until": "2026-06-01T00:00:00+00:00"}
        assert run_config(settings, run_dir=tmp_path, default_end="2026-12-01").trained_until == \
            "2026-06-01T00:00:00+00:00"
        assert run_config(settings, run_dir=tmp_path, trained_until="2026-03-01T00:00:00+00:00",
                          default_end="2026-12-01").trained_until == "2026-03-01T00:00:00+00:00"

    def test_the_example_data_names_the_shipped_file(self, tmp_path):
        from onnxcast.pipeline.config import EXAMPLE_DATA, data_source

        cfg = run_config({**self.SETTINGS, "data_uri": EXAMPLE_DATA}, run_dir=tmp_path)
        assert cfg.data_uri == data_source(EXAMPLE_DATA) != EXAMPLE_DATA

    @pytest.mark.parametrize("extra, message", [
        ("n_heads=0", "extra_settings must be a JSON object, got 'n_heads=0'"),
        (["n_heads"], "extra_settings must be a mapping of setting to value, got list"),
    ])
    def test_extra_settings_that_are_not_a_mapping_are_refused(self, tmp_path, extra, message):
        with pytest.raises(ConfigError, match=message):
            run_config(self.SETTINGS, extra_settings=extra, run_dir=tmp_path)

    def test_a_bad_setting_is_named(self, tmp_path):
        with pytest.raises(ConfigError, match="horizon"):
            run_config({**self.SETTINGS, "horizon": 0}, run_dir=tmp_path)

    @pytest.mark.parametrize("empty", [None, "", "None"])
    def test_no_extra_settings(self, empty):
        assert parse_extra_settings(empty) == {}
