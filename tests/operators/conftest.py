"""Operator tests call ``execute(context)`` directly (as the Amazon provider's tests do) with
a small context; connections come through ``AIRFLOW_CONN_*`` variables. One prepared run
directory (tiny LSTM, real example data) is shared by the session and copied per test."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import airflow_support
import pytest

airflow_support.configure()

OPS_SETTINGS = {"data_uri": "example", "horizon": 12, "lookback": 48, "max_epochs": 1, "models": ["lstm"],
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
def prepared_run(tmp_path_factory) -> Path:
    """A run directory after check, train, export, optimize and validate of a tiny LSTM."""
    from operators import (
        CheckDataOperator,
        ExportModelOperator,
        OptimizeModelOperator,
        TrainOrFetchModelOperator,
        ValidateModelOperator,
    )

    root = tmp_path_factory.mktemp("prepared")
    context = make_context(run_id="prepared")
    CheckDataOperator(task_id="check_data", settings=OPS_SETTINGS, run_root=str(root),
                      compare_with_champion=False).execute(context)
    run_dir = context["ti"].xcoms["run_dir"]
    for cls in (TrainOrFetchModelOperator, ExportModelOperator, OptimizeModelOperator, ValidateModelOperator):
        cls(task_id=cls.__name__, run_dir=run_dir, family="lstm").execute(make_context(run_id="prepared"))
    return Path(run_dir)


@pytest.fixture
def run_dir(prepared_run, tmp_path) -> str:
    """A private copy of the prepared run directory."""
    target = tmp_path / "run"
    shutil.copytree(prepared_run, target)
    from onnxcast.config import PipelineConfig

    cfg = PipelineConfig.load(target / "config.json")
    from dataclasses import replace

    replace(cfg, out_dir=str(target)).save(target / "config.json")
    return str(target)
