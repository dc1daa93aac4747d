"""Operator tests call ``execute(context)`` directly (as the Amazon provider's tests do) with
a small context; connections come through ``AIRFLOW_CONN_*`` variables. One finished run
directory (``tiny_lstm_run``: tiny LSTM, real example data) is shared by the session and copied
per test."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import airflow_support
import pytest
from real_series import weekly_co2_csv
from run_fixtures import tiny_lstm_run, tiny_lstm_run_copy  # noqa: F401  (fixtures)

airflow_support.configure()

OPS_SETTINGS = {"data_uri": weekly_co2_csv(), "horizon": 12, "lookback": 56, "max_epochs": 1, "models": ["lstm"],
                "hidden_size": 16, "num_layers": 1, "latency_repeats": 3, "model_name": "ops-forecaster"}


class FakeTaskInstance:
    def __init__(self) -> None:
        self.xcoms: dict = {}

    def xcom_push(self, key: str, value) -> None:
        self.xcoms[key] = value


class OutletEvents(dict):
    def __missing__(self, key):
        self[key] = SimpleNamespace(extra={})
        return self[key]


def make_context(run_id: str = "manual__2026-11-29T00:00:00+00:00", dag_id: str = "operator_tests") -> dict:
    end = datetime(2026, 11, 29, tzinfo=UTC)
    return {"ti": FakeTaskInstance(), "run_id": run_id, "data_interval_end": end, "outlet_events": OutletEvents(),
            "dag_run": SimpleNamespace(dag_id=dag_id, run_after=end, triggering_user_name="tester")}


def assert_template_fields_stored_unchanged(operator, values: dict) -> None:
    """Each templated argument is stored under its own name, unchanged (Amazon provider habit)."""
    for field in operator.template_fields:
        assert hasattr(operator, field), field
        if field in values:
            assert getattr(operator, field) == values[field], field


@pytest.fixture(scope="session")
def prepared_run(tiny_lstm_run) -> Path:  # noqa: F811
    """A run directory after check, train, export, optimize, validate and report (tests/run_fixtures.py)."""
    return tiny_lstm_run


@pytest.fixture
def run_dir(tiny_lstm_run_copy) -> str:  # noqa: F811
    """A private copy of the prepared run directory (a run in a local run store)."""
    return str(tiny_lstm_run_copy)


def commit(run_dir: str | Path, step: str = "test-edit") -> None:
    """Commit what a test changed in ``run_dir`` by hand, as a step of the run (operators
    stage committed files only, and refuse files that differ from their commit)."""
    from onnxcast.runstore import LocalBackend, RunDir

    RunDir(str(run_dir), LocalBackend(run_dir)).publish(step, run_dir)
