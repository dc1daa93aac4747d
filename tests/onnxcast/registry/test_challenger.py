"""The challenger of a finished run in the registry (onnxcast.registry.challenger), without Airflow,
on a local MLflow store: registered once however often it is retried, its report naming the
registered version; a failed gate registers nothing but still logs the run; the decision recorded."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from run_fixtures import tiny_lstm_run, tiny_lstm_run_copy  # noqa: F401  (fixtures)

from onnxcast.base.errors import GateError
from onnxcast.base.files import read_json, write_json
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.registry.challenger import judge_challenger, register_challenger

pytestmark = pytest.mark.slow


@pytest.fixture
def cfg(tiny_lstm_run_copy):  # noqa: F811
    return replace(PipelineConfig.load(Path(tiny_lstm_run_copy) / "config.json"), model_name="challenger-lib")


@pytest.fixture
def tracking_uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def versions(tracking_uri: str, name: str) -> list:
    from onnxcast.registry.tracking import client_for

    return client_for(tracking_uri).search_model_versions(f"name = '{name}'")


def test_a_retry_finds_its_version_and_the_report_names_it(cfg, tracking_uri):
    logged = []
    first = register_challenger(cfg, run_key="dag/run-1", tags={}, tracking_uri=tracking_uri, on_logged=logged.append)
    again = register_challenger(cfg, run_key="dag/run-1", tags={}, tracking_uri=tracking_uri)
    assert (first.version.created, again.version.created) == (True, False)
    assert again.as_xcom()["version"] == first.as_xcom()["version"] and len(versions(tracking_uri, cfg.model_name)) == 1
    assert logged == [first.url]
    mlflow = read_json(cfg.layout.report)["mlflow"]
    assert (mlflow["model"], mlflow["version"], mlflow["parent_run_id"]) == (
        cfg.model_name, first.version.version, first.tracked.parent_run_id)


def test_a_failed_gate_logs_the_run_and_registers_nothing(cfg, tracking_uri):
    family = cfg.models[0]
    validation = read_json(cfg.layout.validation(family))
    write_json(cfg.layout.validation(family), {**validation, "gates_passed": False,
                                               "failures": ["parity 0.1 > 0.0001"]})
    logged = []
    with pytest.raises(GateError, match="parity 0.1"):
        register_challenger(cfg, run_key="dag/run-2", tags={}, tracking_uri=tracking_uri, on_logged=logged.append)
    assert len(logged) == 1 and versions(tracking_uri, cfg.model_name) == []


def test_the_first_challenger_wins_without_a_champion_and_the_decision_is_recorded(cfg, tracking_uri):
    from onnxcast.registry.tracking import client_for

    version = register_challenger(cfg, run_key="dag/run-3", tags={}, tracking_uri=tracking_uri).version.version
    decision = judge_challenger(cfg, version, min_improvement="0.0", tracking_uri=tracking_uri)
    assert decision["promote"] is True and decision["challenger_version"] == version
    assert decision["champion_version"] is None
    tags = client_for(tracking_uri).get_model_version(cfg.model_name, version).tags
    assert tags["onnxcast.decision.promote"] in ("True", "true")
