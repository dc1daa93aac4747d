"""A fleet run in a real MLflow store (SQLite in tmp): aggregates as metrics, per-series
tables as artifacts, a version that says it is global (docs/design/fleet.md 4.5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fleet_run_fixtures import add_intervals, build_fleet_run, fleet_tracking_uri  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

FAMILIES = {"nhits": 0.8, "dlinear": 0.95}


MODEL = "fleet-log"  # apart from the champion tests' model in the shared store


@pytest.fixture
def tracking_uri(fleet_tracking_uri):  # noqa: F811
    return fleet_tracking_uri


@pytest.fixture
def fleet_run(tmp_path) -> Path:
    return build_fleet_run(tmp_path / "run", skills=FAMILIES, model_name=MODEL)


def test_fleet_run_logs_aggregates_tables_and_a_global_version(fleet_run, tracking_uri, tmp_path):
    import mlflow
    import pandas as pd

    from onnxcast.registry.tracking import client_for, log_pipeline_run, register_model

    report = json.loads((fleet_run / "report.json").read_text())
    tracked = log_pipeline_run(fleet_run, model_name=MODEL, run_key="dag/fleet-1", families=list(FAMILIES),
                               tracking_uri=tracking_uri)
    version = register_model(fleet_run, tracked, model_name=MODEL, run_key="dag/fleet-1",
                             tracking_uri=tracking_uri)
    client = client_for(tracking_uri)
    fleet = report["fleet"]

    parent = client.get_run(tracked.parent_run_id)
    metrics = parent.data.metrics
    assert (metrics["fleet.series"], metrics["fleet.excluded"], metrics["fleet.padded"]) == (60, 2, 1)
    best = fleet["baselines"]["best_naive"]
    assert metrics["fleet.best_naive.mase_mean"] == pytest.approx(best["mase_mean"])
    assert metrics["fleet.best_naive.smape_mean"] == pytest.approx(best["smape_mean"])
    ets = fleet["reference"]["aggregates"]["AutoETS"]
    assert [metrics["fleet.reference.AutoETS.mase_ci95_low"], metrics["fleet.reference.AutoETS.mase_ci95_high"]] == \
        pytest.approx(ets["mase_ci95"])
    assert metrics["fleet.reference.AutoETS.mape_mean"] == pytest.approx(ets["mape_mean"])
    assert parent.data.tags["onnxcast.dataset.series_column"] == "unique_id"
    artifacts = {a.path for a in client.list_artifacts(tracked.parent_run_id)}
    assert {"report.json", "per_series", "per_series.json", "quality"} <= artifacts and "plots" not in artifacts
    assert "quality/series.parquet" in {a.path for a in client.list_artifacts(tracked.parent_run_id, "quality")}
    reference = pd.read_parquet(client.download_artifacts(tracked.parent_run_id, "per_series/reference.parquet",
                                                          str(tmp_path / "dl")))
    assert reference.equals(pd.read_parquet(fleet_run / "data/reference/per_series.parquet"))
    table = json.loads(Path(client.download_artifacts(tracked.parent_run_id, "per_series.json",
                                                      str(tmp_path / "dl"))).read_text())
    assert table["columns"] == ["series", "best_naive.mase", "AutoETS.mase", "nhits.fp32.mase",
                                "dlinear.fp32.mase", "loses"]
    assert len(table["data"]) == 60
    nhits = pd.read_parquet(fleet_run / "models/nhits/per_series.parquet").set_index("series")
    row = table["data"][7]
    assert row[3] == pytest.approx(nhits.loc[row[0], "fp32.mase"])
    assert row[5] is (row[3] > row[1])

    for family in FAMILIES:  # tens of metrics per run, none per series
        run = client.get_run(tracked.family_run_ids[family])
        names = set(run.data.metrics)
        aggregates = fleet["families"][family]
        assert run.data.metrics["fp32.fleet_mase_mean"] == pytest.approx(aggregates["fp32"]["mase_mean"])
        assert run.data.metrics["int8.loses_share"] == pytest.approx(aggregates["int8"]["loses_share"])
        assert {"fp32.fleet_mase_ci95_low", "fp32.fleet_mase_ci95_high", "fp32.fleet_smape_mean",
                "fp32.fleet_mape_mean", "fp32_vs_best_naive.p_value", "fp32_vs_AutoETS.p_value"} <= names
        assert run.data.metrics["fp32_vs_AutoETS.p_value"] == pytest.approx(
            fleet["tests"][family]["vs_reference"]["AutoETS"]["p_value"])
        assert len(names) < 100 and not any(sid in name for sid in nhits.index for name in names)
        assert {a.path for a in client.list_artifacts(run.info.run_id, "per_series")} == {
            f"per_series/{family}.parquet"}
    for name in parent.data.metrics:
        assert not any(sid in name for sid in nhits.index)

    tags = client.get_model_version(MODEL, version.version).tags
    assert (tags["onnxcast.global"], tags["onnxcast.n_series"], tags["onnxcast.series_column"]) == (
        "true", "60", "unique_id")
    assert (tags["onnxcast.metric"], tags["onnxcast.horizon"], tags["onnxcast.freq"]) == ("mase", "18", "MS")
    assert float(tags["onnxcast.fp32_holdout_mae"]) == pytest.approx(
        fleet["families"][version.family]["fp32"]["mase_mean"])
    signature = mlflow.models.get_model_info(version.model_uri).signature.to_dict()
    assert json.loads(signature["inputs"])[0]["tensor-spec"]["shape"] == [-1, -1, 1]
    outputs = json.loads(signature["outputs"])  # a model without a quantiles output: forecast only
    assert [(o["name"], o["tensor-spec"]["shape"]) for o in outputs] == [("forecast", [-1, 18])]


def test_a_fleet_run_from_an_older_layout_logs_what_it_has(fleet_run, tracking_uri):
    """No per-series tables, no reference, no fleet block in validation.json: still logged."""
    from onnxcast.registry.tracking import client_for, log_pipeline_run

    for path in [*fleet_run.glob("models/*/per_series.parquet"), fleet_run / "data/reference/per_series.parquet",
                 fleet_run / "quality/series.parquet"]:
        path.unlink()
    for path in fleet_run.glob("models/*/validation.json"):
        entry = json.loads(path.read_text())
        del entry["fleet"]
        path.write_text(json.dumps(entry))
    report = json.loads((fleet_run / "report.json").read_text())
    del report["fleet"]["reference"], report["fleet"]["tests"]
    (fleet_run / "report.json").write_text(json.dumps(report))

    tracked = log_pipeline_run(fleet_run, model_name=MODEL, run_key="dag/old", families=list(FAMILIES),
                               tracking_uri=tracking_uri)
    client = client_for(tracking_uri)
    parent = client.get_run(tracked.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["fleet.series"] == 60
    assert not any(name.startswith("fleet.reference.") for name in parent.data.metrics)
    assert "per_series" not in {a.path for a in client.list_artifacts(tracked.parent_run_id)}
    child = client.get_run(tracked.family_run_ids["nhits"])
    assert child.data.metrics["fp32.fleet_mase_mean"] == pytest.approx(  # from the report's families
        report["fleet"]["families"]["nhits"]["fp32"]["mase_mean"])
    assert "fp32_vs_best_naive.p_value" not in child.data.metrics


def test_fleet_interval_figures_are_logged_as_aggregates_and_tags(fleet_run, tracking_uri, tmp_path):
    """Means over series of the 80%/95% coverage and MSIS: metrics on the runs, tags on the
    version, the per-series 95% MSIS in the UI table; still never one metric per series."""
    from onnxcast.registry.tracking import client_for, log_pipeline_run, register_model

    add_intervals(fleet_run, {"nhits": 0.8, "dlinear": 1.1})
    report = json.loads((fleet_run / "report.json").read_text())
    fleet = report["fleet"]
    tracked = log_pipeline_run(fleet_run, model_name=MODEL, run_key="dag/fleet-iv", families=list(FAMILIES),
                               tracking_uri=tracking_uri)
    version = register_model(fleet_run, tracked, model_name=MODEL, run_key="dag/fleet-iv", tracking_uri=tracking_uri)
    client = client_for(tracking_uri)
    parent = client.get_run(tracked.parent_run_id).data.metrics
    ets = fleet["reference"]["aggregates"]["AutoETS"]["intervals"]
    assert parent["fleet.reference.AutoETS.msis_95"] == pytest.approx(ets["msis_95"])
    assert parent["fleet.reference.AutoETS.coverage_80"] == pytest.approx(ets["coverage_80"])
    assert parent["fleet.best_naive.msis_95"] == pytest.approx(fleet["baselines"]["best_naive"]["intervals"]["msis_95"])
    for family in FAMILIES:
        child = client.get_run(tracked.family_run_ids[family]).data.metrics
        for variant in ("fp32", "int8"):
            figures = fleet["families"][family][variant]["intervals"]
            assert child[f"{variant}.msis_95"] == pytest.approx(figures["msis_95"])
            assert child[f"{variant}.coverage_95"] == pytest.approx(figures["coverage_95"])
        assert len(child) < 100
    tags = client.get_model_version(MODEL, version.version).tags
    fp32 = fleet["families"][version.family]["fp32"]["intervals"]
    assert float(tags["onnxcast.fp32_msis_95"]) == pytest.approx(fp32["msis_95"])
    assert float(tags["onnxcast.fp32_coverage_80"]) == pytest.approx(fp32["coverage_80"])
    assert "onnxcast.quantile_levels" not in tags  # these test graphs have no quantiles output
    table = json.loads(Path(client.download_artifacts(tracked.parent_run_id, "per_series.json",
                                                      str(tmp_path / "dl"))).read_text())
    assert table["columns"] == ["series", "best_naive.mase", "AutoETS.mase", "nhits.fp32.mase", "dlinear.fp32.mase",
                                "loses", "best_naive.msis_95", "AutoETS.msis_95", "nhits.fp32.msis_95",
                                "dlinear.fp32.msis_95"]
