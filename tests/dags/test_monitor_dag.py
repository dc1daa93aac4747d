"""onnxcast_monitor with Airflow's dag.test() against a version the training DAG trained on the
weekly CO2 weeks up to 1995, registered and promoted to both channels (embedded defaults:
SQLite Airflow and MLflow, a local signed rollout store), judged on 1996-2001: as they are
(healthy: retrain_signal skipped, no asset event) and with a level shift (an onnxcast_retrain
event with the reasons, the monitor run and the version tag in MLflow). Then the training
DAG's schedule and what its check_data takes from such an event."""

from __future__ import annotations

import json
import time

import airflow_support
import pytest

pytestmark = pytest.mark.slow

MODEL = "monitored-forecaster"
TRAINED_UNTIL = "1995-12-31T00:00:00+00:00"


def load_dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    airflow_support.ensure_db()
    bag = DagBag(dag_folder=str(airflow_support.REPO / "dags" / f"{dag_id}.py"))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


def client():
    from onnxcast.registry.tracking import client_for

    return client_for()


def retrain_events(run) -> list:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(select(AssetEvent, AssetModel.name).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                               .where(AssetEvent.source_run_id == run.run_id)).all()
        return [(name, event.source_task_id, dict(event.extra or {})) for event, name in rows]


@pytest.fixture(scope="module", autouse=True)
def _module_release_key(release_key):
    # module fixtures run before the per-test key environment (conftest._release_key_env)
    from pathlib import Path

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONNXCAST_SIGNING_KEY", str(release_key["private"]))
        patch.setenv("ONNXCAST_TRUST", str(release_key["root"]))
        # the healthy run judges on the version's own data (its report's data_uri): a local file
        # the monitor reads only inside ONNXCAST_HOME or the folders named here
        patch.setenv("ONNXCAST_DATA_ROOTS", str(Path(airflow_support.TINY["data_uri"]).parent))
        yield


@pytest.fixture(scope="module")
def deployed():
    """One training run (LSTM, 2 epochs, about a minute): registered and promoted to both channels."""
    conf = {**airflow_support.TINY, "families": ["lstm"], "model_name": MODEL, "trained_until": TRAINED_UNTIL,
            "compare_with_champion": False,
            "extra_settings": {**airflow_support.TINY["extra_settings"], "coverage_tolerance": 0.3}}
    run = load_dag("onnxcast_training").test(run_conf=conf)
    states = airflow_support.task_states(run)
    assert states["promote"] == "success", states
    return str(airflow_support.xcom(run, "register")["version"])


@pytest.fixture(scope="module")
def healthy_run(deployed):
    started = time.monotonic()
    run = load_dag("onnxcast_monitor").test(run_conf={"model_name": MODEL, "channels": ["edge", "cloud"]})
    print(f"onnxcast_monitor dag.test, healthy, 2 channels: {time.monotonic() - started:.1f}s")
    return run


@pytest.fixture(scope="module")
def drifted_run(deployed, tmp_path_factory):
    import pandas as pd

    frame = pd.read_csv(airflow_support.TINY["data_uri"])
    shifted = pd.to_datetime(frame["ds"]) > pd.Timestamp("1998-01-01")
    frame.loc[shifted, "y"] += 4.0  # ppm: a level shift two years after training
    path = tmp_path_factory.mktemp("drifted") / "co2_shifted.csv"
    frame.to_csv(path, index=False)
    started = time.monotonic()
    set_paused("onnxcast_training", False)  # a paused DAG is not queued by asset events (rightly)
    try:
        run = load_dag("onnxcast_monitor").test(run_conf={"model_name": MODEL, "channels": ["edge"],
                                                          "dataset_uri": str(path)})
    finally:
        set_paused("onnxcast_training", True)
    print(f"onnxcast_monitor dag.test, drifted, 1 channel: {time.monotonic() - started:.1f}s")
    return run


def set_paused(dag_id: str, paused: bool) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=paused))


class TestHealthy:
    def test_monitored_and_no_retraining_signal(self, deployed, healthy_run):
        states = airflow_support.task_states(healthy_run)
        assert states == {"monitor": "success", "retrain_signal": "skipped"}, states
        summaries = airflow_support.xcom(healthy_run, "monitor")
        assert [s["channel"] for s in summaries] == ["edge", "cloud"]
        for summary in summaries:
            assert summary["version"] == deployed
            assert summary["degraded"] is False and summary["drift"] == [] and summary["reasons"] == []
            assert summary["origins"] >= 20 and summary["from"].startswith("1996-01")
        assert retrain_events(healthy_run) == []

    def test_version_tag_and_monitor_run(self, deployed, healthy_run):
        summary = airflow_support.xcom(healthy_run, "monitor")[0]
        tags = client().get_model_version(MODEL, deployed).tags
        tag = json.loads(tags["onnxcast.monitor.edge"])
        assert set(tag) == {"at", "mase", "holdout_mase", "holdout_ci", "p_value", "degraded", "drift", "origins",
                            "run_id", "from", "to"}
        assert "onnxcast.monitor.cloud" in tags
        run = client().get_run(summary["run_id"])
        assert run.data.tags["onnxcast.role"] == "monitor"
        assert (run.data.tags["onnxcast.model"], run.data.tags["onnxcast.version"],
                run.data.tags["onnxcast.channel"]) == (MODEL, deployed, "edge")
        assert run.data.metrics["realised_mase"] == pytest.approx(summary["mase"])
        history = client().get_metric_history(summary["run_id"], "origin_mase")
        assert len(history) == summary["origins"]
        assert {a.path for a in client().list_artifacts(summary["run_id"])} >= {"monitor.json", "plots"}


class TestDrifted:
    def test_retraining_event_with_reasons(self, deployed, drifted_run):
        states = airflow_support.task_states(drifted_run)
        assert states == {"monitor": "success", "retrain_signal": "success"}, states
        events = retrain_events(drifted_run)
        assert [(name, task) for name, task, _ in events] == [("onnxcast_retrain", "retrain_signal")]
        extra = events[0][2]
        assert (extra["model"], extra["channel"], extra["version"]) == (MODEL, "edge", deployed)
        assert any("worse than the holdout" in r for r in extra["reasons"])
        assert any("input drift in 'y'" in r for r in extra["reasons"])
        # the deployed version's settings, to be trained again on newer data
        assert extra["conf"]["lookback"] == 56 and extra["conf"]["models"] == ["lstm"]
        assert "trained_until" not in extra["conf"] and "out_dir" not in extra["conf"]
        assert extra["conf"]["data_uri"].endswith("co2_shifted.csv")  # the data the drift was seen in

    def test_event_queues_a_training_run(self, deployed, drifted_run):
        """The metadata DB's view: the event put onnxcast_training (scheduled on the asset) in the
        asset-triggered queue, whence the scheduler creates its run on its next loop."""
        from airflow.models.asset import AssetDagRunQueue, AssetModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            queued = session.execute(select(AssetDagRunQueue.target_dag_id, AssetModel.name)
                                     .join(AssetModel, AssetDagRunQueue.asset_id == AssetModel.id)).all()
        assert ("onnxcast_training", "onnxcast_retrain") in [tuple(row) for row in queued]

    def test_tag_says_degraded(self, deployed, drifted_run):
        tag = json.loads(client().get_model_version(MODEL, deployed).tags["onnxcast.monitor.edge"])
        summary = airflow_support.xcom(drifted_run, "monitor")[0]
        assert tag["degraded"] is True and tag["drift"] == ["y"] and tag["run_id"] == summary["run_id"]

    def test_event_conf_is_a_valid_training_configuration(self, deployed, drifted_run, tmp_path):
        from onnxcast.airflow.retraining import retrain_settings
        from onnxcast.pipeline.config import PipelineConfig

        extra = retrain_events(drifted_run)[0][2]
        taken, left_out = retrain_settings(extra["conf"])
        assert left_out == []
        cfg = PipelineConfig.from_dict({**taken, "out_dir": str(tmp_path)})
        assert (cfg.horizon, cfg.lookback, cfg.models, cfg.trained_until) == (12, 56, ("lstm",), None)


class TestTrainingSchedule:
    def test_weekly_and_on_the_retrain_asset(self):
        from airflow.sdk import Asset

        dag = load_dag("onnxcast_training")
        timetable = dag.timetable
        assert type(timetable).__name__ == "AssetOrTimeSchedule"
        assert timetable.timetable.expression == "0 0 * * 0"  # the weekly run stays
        assert timetable.timetable.run_immediately is not True  # unpausing starts no run at once
        assets = list(dag.timetable.asset_condition.objects)
        assert assets == [Asset(name="onnxcast_retrain", uri="x-onnxcast://retrain")]


class TestMonitorCommand:
    def test_console_script_judges_the_served_model(self, deployed, healthy_run, release_key):
        """`onnxcast monitor` (the console script) runs the same check: healthy data, exit 0."""
        import os
        import subprocess
        import sys
        from pathlib import Path

        store = airflow_support.configure() / "rollout"
        command = [str(Path(sys.executable).parent / "onnxcast"), "monitor", "--store", str(store), "--model", MODEL,
                   "--channel", "edge", "--trust", str(release_key["root"]), "--no-log"]
        started = time.monotonic()
        out = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ.copy())
        print(f"onnxcast monitor (console script): {time.monotonic() - started:.1f}s")
        assert out.returncode == 0, out.stderr[-2000:]
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        assert (summary["version"], summary["degraded"], summary["drift"], summary["run_id"]) == (deployed, False, [],
                                                                                                None)
        assert summary["mase"] == pytest.approx(airflow_support.xcom(healthy_run, "monitor")[0]["mase"])

    def test_console_script_refuses_a_table_past_the_row_limit_from_its_footer(self, deployed, release_key,
                                                                                 tmp_path):
        """`onnxcast monitor --data` reads through the same bounded reader as the pipeline: a
        file whose Parquet footer declares 100 M rows is refused before a row is decoded (the
        report's 1.2 MB file took 5.3 GB in `onnxcast monitor --data`)."""
        import os
        import subprocess
        import sys
        from pathlib import Path

        from corpus.bad_inputs import hundred_million_rows

        data = hundred_million_rows(tmp_path)
        store = airflow_support.configure() / "rollout"
        command = [str(Path(sys.executable).parent / "onnxcast"), "monitor", "--store", str(store), "--model", MODEL,
                   "--channel", "edge", "--trust", str(release_key["root"]), "--no-log", "--data", str(data)]
        out = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ.copy())
        assert out.returncode == 2, out.stderr[-2000:]
        assert "Traceback" not in out.stderr
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and "Parquet file of 100,000,000 rows (by its metadata" in last, last

