"""The monitor's operators, and check_data in a run the monitor's onnxcast_retrain event
triggered: the event's settings over the param defaults (checked like trigger-form input), the
reason recorded in the run directory (the report's ``trigger``) and on the MLflow run
(``onnxcast.retrain_reason``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import OPS_SETTINGS, assert_template_fields_stored_unchanged, make_context

REASONS = ["edge: realised MASE 1.04 over 101 origins worse than the holdout's 0.547 (one-sided p=0.0234)",
           "edge: input drift in 'y' (change_mean)"]


def triggered(conf: dict, source: tuple = ("onnxcast_monitor", "retrain_signal"), **extra) -> dict:
    from onnxcast.airflow.retraining import RETRAIN

    context = make_context(run_id="asset_triggered__2026-11-29T00:00:00+00:00")
    event = SimpleNamespace(extra={"model": "ops-forecaster", "channel": "edge", "version": "3",
                                   "reasons": REASONS, "conf": conf, **extra},
                            source_dag_id=source[0], source_task_id=source[1])
    context["triggering_asset_events"] = {RETRAIN: [event]}
    return context


def check_data(tmp_path, context):
    from onnxcast.airflow.operators import CheckDataOperator

    op = CheckDataOperator(task_id="check_data", settings=OPS_SETTINGS, run_root=str(tmp_path),
                           compare_with_champion=False)
    op.execute(context)
    return Path(context["ti"].xcoms["run_dir"])


FORGED = [({}, ("onnxcast_monitor", "retrain_signal"), "REST API"),  # extra["from_rest_api"] added below
          (None, ("some_dag", "emit"), "from some_dag.emit"), (None, (None, None), "from None.None")]


class TestRetrainEventSource:
    """Only onnxcast_monitor.retrain_signal asks for a retraining: an event posted through the
    REST API (POST /api/v2/assets/events, asset permissions only) or from another task is refused."""

    @pytest.mark.parametrize(("rest", "source", "fragment"), FORGED)
    def test_forged_events_are_refused_naming_the_event(self, rest, source, fragment):
        from onnxcast.airflow.retraining import retrain_events
        from onnxcast.base.errors import ConfigError

        extra = {"from_rest_api": True} if rest is not None else {}
        with pytest.raises(ConfigError, match=f"refused the onnxcast_retrain event .*{fragment}"):
            retrain_events(triggered({"data_uri": "/srv/other/data.csv"}, source, **extra))

    def test_the_monitors_event_is_taken(self):
        from onnxcast.airflow.retraining import retrain_events

        [event] = retrain_events(triggered({"lookback": 60}))
        assert event["conf"] == {"lookback": 60}

    def test_a_forged_event_fails_check_data_and_trains_nothing(self, tmp_path):
        from airflow.sdk.exceptions import AirflowFailException

        with pytest.raises(AirflowFailException, match="REST API"):
            check_data(tmp_path, triggered({**OPS_SETTINGS, "model_name": "someone-elses"}, from_rest_api=True))
        assert not list(tmp_path.rglob("config.json"))


@pytest.mark.slow  # a real data check and MLflow run per test
class TestRetrainTrigger:
    def test_event_settings_over_defaults_and_reason_recorded(self, tmp_path):
        from onnxcast.registry.tracking import client_for

        conf = {**OPS_SETTINGS, "lookback": 60, "horizon": 8, "trained_until": "1990-01-01", "out_dir": "/elsewhere",
                "no_such_setting": 1}
        context = triggered(conf)
        run_dir = check_data(tmp_path, context)
        config = json.loads((run_dir / "config.json").read_text())
        assert (config["lookback"], config["horizon"]) == (60, 8)
        # never carried: the run's own window end and folder; unknown settings are left out and named
        assert config["trained_until"] == "2026-11-29T00:00:00+00:00" and config["out_dir"] != "/elsewhere"
        trigger = json.loads((run_dir / "trigger.json").read_text())
        assert trigger["reasons"] == REASONS and trigger["version"] == "3"
        assert trigger["left_out"] == ["no_such_setting", "out_dir", "trained_until"]
        assert context["ti"].xcoms["summary"]["trigger"]["reasons"] == REASONS
        url = context["ti"].xcoms["mlflow_run_url"]
        run = client_for().get_run(url.rsplit("/", 1)[1])
        assert run.data.tags["onnxcast.retrain_reason"] == "; ".join(REASONS)

    @pytest.mark.parametrize(("bad", "fragment"), [
        ({"horizon": 0}, "horizon=0"),
        ({"models": ["lstm", "prophet"]}, "models=['lstm', 'prophet']"),
        ({"lookback": "many"}, "lookback='many'"),
    ])
    def test_bad_event_settings_fail_without_retry(self, tmp_path, bad, fragment):
        from airflow.sdk.exceptions import AirflowFailException

        with pytest.raises(AirflowFailException) as err:
            check_data(tmp_path, triggered({**OPS_SETTINGS, **bad}))
        assert fragment in str(err.value) and "retrain event conf" in str(err.value)

    def test_scheduled_run_takes_nothing(self, tmp_path):
        run_dir = check_data(tmp_path, make_context())
        assert not (run_dir / "trigger.json").exists()
        assert json.loads((run_dir / "config.json").read_text())["lookback"] == OPS_SETTINGS["lookback"]


def summary(channel: str, reasons: list[str]) -> dict:
    return {"model": "m", "channel": channel, "version": "7", "p_value": 0.4, "reasons": reasons,
            "conf": {"horizon": 12, "lookback": 56}}


class TestMonitorChannelsOperator:
    def test_template_fields(self):
        from onnxcast.airflow.operators import MonitorChannelsOperator

        values = {"model_name": "{{ params.model_name }}", "channels": "{{ params.channels }}",
                  "dataset_uri": "{{ params.dataset_uri }}", "store_uri": "{{ params.store_uri }}", "trust": "/k"}
        op = MonitorChannelsOperator(task_id="monitor", **values)
        assert set(op.template_fields) == set(values)
        assert_template_fields_stored_unchanged(op, values)

    def test_a_model_with_no_channel_served_fails_naming_it(self, tmp_path):
        """Only edge asked and nothing served: the task fails (one served channel would be judged
        and the unserved one skipped: tests/dags/test_monitor_channels.py)."""
        from airflow.sdk.exceptions import AirflowFailException

        from onnxcast.airflow.operators import MonitorChannelsOperator

        op = MonitorChannelsOperator(task_id="monitor", model_name="nothing-here", channels=["edge"],
                                     store_uri=str(tmp_path))
        with pytest.raises(AirflowFailException) as err:
            op.execute(make_context())
        assert str(err.value) == "nothing-here: no channel of edge serves a version (nothing promoted)"


class TestRetrainSignalOperator:
    def test_nothing_flagged_skips(self):
        from airflow.sdk.exceptions import AirflowSkipException

        from onnxcast.airflow.operators import RETRAIN, RetrainSignalOperator

        op = RetrainSignalOperator(task_id="retrain_signal", results=[summary("edge", []), summary("cloud", [])])
        assert op.outlets == [RETRAIN]
        context = make_context()
        with pytest.raises(AirflowSkipException, match="no channel degraded or drifted"):
            op.execute(context)
        assert dict(context["outlet_events"]) == {}

    def test_flagged_channels_set_the_event_extra(self):
        from onnxcast.airflow.operators import RETRAIN, RetrainSignalOperator

        op = RetrainSignalOperator(task_id="retrain_signal",
                                   results=[summary("edge", []), summary("cloud", ["cloud: input drift in 'y'"])])
        context = make_context()
        extra = op.execute(context)
        assert context["outlet_events"][RETRAIN].extra == extra
        assert (extra["channel"], extra["channels"], extra["reasons"]) == ("cloud", ["cloud"], ["cloud: input drift in 'y'"])
        assert extra["conf"] == {"horizon": 12, "lookback": 56} and extra["version"] == "7"


@pytest.mark.slow  # the shared finished run directory (tests/run_fixtures.py)
def test_report_carries_the_trigger(run_dir):
    """register assembles report.json from the committed run directory: trigger.json (written by
    check_data in a retraining run) becomes its ``trigger``."""
    from onnxcast.airflow.steps import load_config
    from onnxcast.base.files import write_json
    from onnxcast.pipeline.report import validate_report
    from onnxcast.pipeline.run import assemble_report

    cfg = load_config(run_dir)
    assert "trigger" not in assemble_report(cfg)
    trigger = {"kind": "retrain", "reasons": REASONS, "version": "3"}
    write_json(cfg.layout.trigger, trigger)
    report = assemble_report(cfg)
    assert report["trigger"] == trigger
    validate_report(report)
