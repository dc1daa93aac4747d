"""Shared fixtures of the tracking, fetch and operator tests: one finished tiny LSTM run.

Import the fixtures into a test module or conftest (``from run_fixtures import ...``)."""

from __future__ import annotations

from pathlib import Path

import pytest

# coverage_tolerance 0.2: a one-epoch model's interval coverage is whatever it lands on (87% at 80%
# once the LSTM read patches); these runs test the registry and rollout steps, the coverage gate
# has its own tests (tests/onnxcast/pipeline/test_validate.py, test_intervals.py)
TINY_PIPELINE = {"horizon": 12, "lookback": 56, "max_epochs": 1, "models": ["lstm"], "hidden_size": 16,
                 "num_layers": 1, "latency_repeats": 3, "model_name": "tiny-forecaster", "coverage_tolerance": 0.2}


@pytest.fixture(scope="session")
def tiny_lstm_run(tmp_path_factory) -> Path:
    """A finished pipeline run directory (tiny LSTM on weekly CO2, tests/real_series.py; no Airflow):
    data, model, ONNX variants, validation, report.json and plan.json. Copy before changing."""
    from onnxcast.pipeline import run as pipeline
    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.registry.plan import write_plan

    out = tmp_path_factory.mktemp("tiny-run") / "run"
    from real_series import weekly_co2_csv

    cfg = PipelineConfig.from_dict({**TINY_PIPELINE, "data_uri": weekly_co2_csv(), "out_dir": str(out)})
    pipeline.prepare_data(cfg)
    for step in (pipeline.train_family, pipeline.export_family, pipeline.optimize_family, pipeline.validate_family):
        step(cfg, "lstm")
    pipeline.assemble_report(cfg, ["lstm"])
    write_plan(out, [{"family": "lstm", "source": None, "role": "challenger"}], ["no champion registered"])
    return out


@pytest.fixture
def tiny_lstm_run_copy(tiny_lstm_run, tmp_path) -> Path:
    """A private copy of ``tiny_lstm_run`` whose config points at the copy, committed as one
    step of a run in a local run store (so operators can stage it as Airflow tasks do)."""
    import shutil
    from dataclasses import replace

    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.runstore import LocalBackend, RunDir

    target = tmp_path / "run"
    shutil.copytree(tiny_lstm_run, target)
    cfg = PipelineConfig.load(target / "config.json")
    replace(cfg, out_dir=str(target)).save(target / "config.json")
    RunDir(str(target), LocalBackend(target)).publish("fixture", target)
    return target
