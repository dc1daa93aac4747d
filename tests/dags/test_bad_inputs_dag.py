"""The bad-input corpus through the training DAG (Airflow's dag.test on SQLite, MLflow on
SQLite, a local rollout store): each bad file fails the data gate (`check_data` for a fault of
the table, `merge_data` for the series the checks exclude) with the corpus's error, nothing
downstream runs, the GX report is logged to MLflow, and the registry, the rollout
store and the champion are exactly as before."""

from __future__ import annotations

from pathlib import Path

import airflow_support
import pytest
from corpus.bad_inputs import BAD_INPUTS

pytestmark = pytest.mark.slow

MODEL = "bad-input-forecaster"
GATE = ("check_data", "check_series[0]", "merge_data")  # the data gate's tasks of one series, in order
DAG_SETTINGS = ("time_column", "target_column", "feature_columns", "freq", "horizon", "lookback", "trained_until")


def load_dag():
    from airflow.dag_processing.dagbag import DagBag

    airflow_support.ensure_db()
    bag = DagBag(dag_folder=str(airflow_support.REPO / "dags" / "onnxcast_training.py"))
    assert bag.import_errors == {}
    return bag.dags["onnxcast_training"]


def snapshot() -> dict:
    """What a failed run must not change: registry versions, aliases, store files and bytes."""
    from onnxcast.registry.tracking import client_for

    client = client_for()
    versions = sorted(v.version for v in client.search_model_versions(f"name='{MODEL}'"))
    champion = client.get_model_version_by_alias(MODEL, "champion").version
    store = airflow_support.configure() / "rollout" / MODEL
    files = {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}
    return {"versions": versions, "champion": champion, "store": files}


@pytest.fixture(scope="module")
def champion_in_place():
    conf = {**airflow_support.TINY, "families": ["lstm"], "model_name": MODEL, "channels": ["edge"]}
    run = load_dag().test(run_conf=conf)
    assert set(airflow_support.task_states(run).values()) == {"success"}
    return snapshot()


@pytest.fixture(scope="module")
def base_bytes(example_csv) -> bytes:
    return Path(example_csv).read_bytes()


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c.name for c in BAD_INPUTS])
def test_bad_input_fails_the_data_check_and_changes_nothing(case, champion_in_place, base_bytes, tmp_path):
    from onnxcast.registry.tracking import client_for

    path = case.write(tmp_path, base_bytes)
    settings = dict(case.settings)
    conf = {"data_uri": str(path), "model_name": MODEL, "families": ["lstm"], "max_epochs": 1,
            "extra_settings": {"quality": settings.pop("quality")} if "quality" in settings else {}}
    unknown = set(settings) - set(DAG_SETTINGS)
    assert not unknown, f"corpus setting(s) {unknown} have no DAG param: map them here"
    conf.update({k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()})
    run = load_dag().test(run_conf=conf)

    states = airflow_support.task_states(run)
    # the one data gate: a table fault fails check_data, a series the checks exclude merge_data
    failed = [t for t in GATE if states.get(t) == "failed"]
    assert len(failed) == 1, states
    assert not [t for t, s in states.items() if t not in GATE[:GATE.index(failed[0])] and s == "success"], states
    assert states["register"] == "upstream_failed", states  # never ran (nor retried): nothing to register
    assert snapshot() == champion_in_place  # no version, no alias move, no store object or pointer move

    client = client_for()
    experiment = client.get_experiment_by_name(MODEL)
    runs = client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.`onnxcast.run_key` = 'onnxcast_training/{run.run_id}'")
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    assert case.expect in runs[0].data.tags["onnxcast.error"]
    if case.stage == "quality":  # the GX report is there to open from the MLflow UI
        logged = {a.path for a in client.list_artifacts(runs[0].info.run_id, "quality")}
        assert "quality/quality_report.html" in logged
