"""check_data in a run the monitor's onnxcast_retrain event triggered: the event's settings
over the param defaults (checked like trigger-form input), the reason recorded in the run
directory (the report's ``trigger``) and on the MLflow run (``onnxcast.retrain_reason``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import OPS_SETTINGS, make_context

REASONS = ["edge: realised MASE 1.04 over 101 origins worse than the holdout's 0.547 (one-sided p=0.0234)",
           "edge: input drift in 'y' (change_mean)"]


def triggered(conf: dict) -> dict:
    from onnxcast.airflow.retraining import RETRAIN

    context = make_context(run_id="asset_triggered__2026-11-29T00:00:00+00:00")
    event = SimpleNamespace(extra={"model": "ops-forecaster", "channel": "edge", "version": "3",
                                   "reasons": REASONS, "conf": conf})
    context["triggering_asset_events"] = {RETRAIN: [event]}
    return context


def check_data(tmp_path, context):
    from onnxcast.airflow.operators import CheckDataOperator

    op = CheckDataOperator(task_id="check_data", settings=OPS_SETTINGS, run_root=str(tmp_path),
                           compare_with_champion=False)
    op.execute(context)
    return Path(context["ti"].xcoms["run_dir"])


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
