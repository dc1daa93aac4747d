"""Airflow for the tests: one throwaway AIRFLOW_HOME/ONNXCAST_HOME per test session.

Airflow reads its settings on first import, so the conftests of tests/dags and
tests/operators call :func:`configure` when they are loaded, before any test imports
airflow. The metadata DB is created once, on first use (:func:`ensure_db`).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from real_series import weekly_co2_csv

REPO = Path(__file__).resolve().parent.parent
_state: dict = {}


def configure() -> Path:
    if "home" not in _state:
        sys.path.insert(0, str(REPO / "scripts"))
        import airflow_env

        home = Path(os.environ.get("ONNXCAST_TEST_HOME") or tempfile.mkdtemp(prefix="onnxcast-tests-"))
        airflow_env.configure(home)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        _state["home"] = home
        _state["env"] = airflow_env
    return _state["home"]


def ensure_db() -> None:
    if not _state.get("db"):
        _state["env"].init_db()
        _state["db"] = True


def task_states(run) -> dict[str, str]:
    """``{"task_id[map_index]": state}`` of a DAG run."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == run.dag_id,
                                                         TaskInstance.run_id == run.run_id)).all()
        return {(t.task_id if t.map_index < 0 else f"{t.task_id}[{t.map_index}]"): str(t.state) for t in tis}


def xcom(run, task_id: str, key: str = "return_value", map_index: int = -1):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalars(select(XComModel).where(
            XComModel.dag_id == run.dag_id, XComModel.run_id == run.run_id, XComModel.task_id == task_id,
            XComModel.key == key, XComModel.map_index == map_index)).first()
        return None if row is None else row.value


TINY = {
    "data_uri": weekly_co2_csv(),  # small real data that tiny models beat the baselines on (tests/real_series.py)
    "horizon": 12,
    "lookback": 56,
    "max_epochs": 2,
    "channels": ["edge", "cloud"],
    "extra_settings": {"hidden_size": 16, "num_layers": 1, "d_model": 16, "n_heads": 2, "latency_repeats": 3,
                       "patience": 2},
}
