"""onnxcast.registry.tracking against a real MLflow store (SQLite in tmp): runs, registry, aliases."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from run_fixtures import tiny_lstm_run, tiny_lstm_run_copy  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


@pytest.fixture
def tracking_uri(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"


@pytest.fixture
def registered(tiny_lstm_run_copy, tracking_uri):  # noqa: F811
    from onnxcast.registry.tracking import log_pipeline_run, register_model

    tracked = log_pipeline_run(tiny_lstm_run_copy, model_name="m", run_key="dag/run-1", families=["lstm"],
                               tracking_uri=tracking_uri)
    version = register_model(tiny_lstm_run_copy, tracked, model_name="m", run_key="dag/run-1",
                             tracking_uri=tracking_uri)
    return tracked, version


class TestLogAndRegister:
    def test_retry_reuses_runs_and_version(self, tiny_lstm_run_copy, tracking_uri, registered):  # noqa: F811
        from onnxcast.registry.tracking import client_for, log_pipeline_run, register_model

        tracked, version = registered
        again = log_pipeline_run(tiny_lstm_run_copy, model_name="m", run_key="dag/run-1", families=["lstm"],
                                 tracking_uri=tracking_uri)
        assert again == tracked
        second = register_model(tiny_lstm_run_copy, again, model_name="m", run_key="dag/run-1",
                                tracking_uri=tracking_uri)
        assert (second.version, second.created, version.created) == (version.version, False, True)
        client = client_for(tracking_uri)
        assert len(client.search_model_versions("name = 'm'")) == 1
        assert len(client.search_runs([tracked.experiment_id])) == 2  # parent + lstm child

    def test_version_is_onnx_with_signature_example_and_files(self, registered, tracking_uri, tmp_path):
        import mlflow

        from onnxcast.registry.tracking import client_for

        _, version = registered
        client = client_for(tracking_uri)
        assert str(client.get_model_version_by_alias("m", "challenger").version) == version.version
        info = mlflow.models.get_model_info(version.model_uri)
        assert "onnx" in info.flavors
        signature = info.signature.to_dict()  # JSON strings, as stored in MLmodel
        assert json.loads(signature["inputs"]) == [
            {"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, -1, 1]}, "name": "history"}]
        outputs = json.loads(signature["outputs"])
        assert [(o["name"], o["tensor-spec"]["shape"]) for o in outputs] == [
            ("forecast", [-1, 12]), ("quantiles", [-1, 12, 5])]  # the default five quantile levels
        files = mlflow.artifacts.download_artifacts(version.model_uri, dst_path=str(tmp_path / "dl"))
        names = {p.name for p in __import__("pathlib").Path(files).rglob("*") if p.is_file()}
        assert {"model.onnx", "fp32.onnx", "int8.onnx", "model.pt", "model.json", "report.json",
                "input_example.json"} <= names

    def test_parent_run_has_report_plot_params_and_child_metrics(self, registered, tracking_uri):
        from onnxcast.registry.tracking import client_for

        tracked, version = registered
        client = client_for(tracking_uri)
        parent = client.get_run(tracked.parent_run_id)
        assert parent.info.status == "FINISHED"
        assert parent.data.params["lookback"] == "56" and parent.data.params["quality.max_gap_fraction"]
        assert "baseline.seasonal_naive.mae" in parent.data.metrics
        assert {a.path for a in client.list_artifacts(tracked.parent_run_id)} >= {"report.json", "plots", "ranking.json"}
        ranking = json.loads(Path(client.download_artifacts(tracked.parent_run_id, "ranking.json")).read_text())
        assert {"family", "variant", "eligible"} <= set(ranking["columns"])
        assert len(ranking["data"]) == 4  # every lstm variant is a candidate
        assert [a.path for a in client.list_artifacts(tracked.parent_run_id, "plots")] == [
            "plots/forecast_vs_actual.png"]
        child = client.get_run(tracked.family_run_ids["lstm"])
        assert {"fp32.holdout_mae", "fp32-opt.holdout_mase", "int8.size_bytes", "torch.holdout.mae"} <= set(
            child.data.metrics)
        assert {a.path for a in client.list_artifacts(child.info.run_id, "pytorch")} == {
            "pytorch/model.pt", "pytorch/model.json"}


class TestAliases:
    def test_set_champion_moves_alias_and_keeps_history(self, registered, tiny_lstm_run_copy, tracking_uri):  # noqa: F811
        from onnxcast.registry.tracking import (
            CHAMPION,
            alias_version,
            client_for,
            log_pipeline_run,
            register_model,
            set_champion,
        )

        _, first = registered
        tracked = log_pipeline_run(tiny_lstm_run_copy, model_name="m", run_key="dag/run-2", families=["lstm"],
                                   tracking_uri=tracking_uri)
        second = register_model(tiny_lstm_run_copy, tracked, model_name="m", run_key="dag/run-2",
                                tracking_uri=tracking_uri)
        assert set_champion("m", first.version, record={"by": "t"}, tracking_uri=tracking_uri) is None
        assert set_champion("m", second.version, record={"by": "t"}, tracking_uri=tracking_uri) == first.version
        assert alias_version("m", CHAMPION, tracking_uri) == second.version
        client = client_for(tracking_uri)
        history = [json.loads(v) for k, v in client.get_registered_model("m").tags.items()
                   if k.startswith("onnxcast.champion.")]
        # None sorts first (a bare sort of (None, "1") and ("1", "2") raised TypeError whenever the
        # two promotions fell in different seconds); same-second stamps leave one entry
        moves = sorted(((h["from_version"], h["version"]) for h in history), key=lambda m: (m[0] or "", m[1]))
        assert moves == [(None, first.version), (first.version, second.version)] or len(history) == 1
        assert client.get_model_version("m", first.version).tags["onnxcast.replaced_by"] == second.version

    def test_missing_alias_and_version_name_what_is_missing(self, registered, tracking_uri):
        from onnxcast.registry.tracking import TrackingError, alias_version, resolve_version

        assert alias_version("m", "champion", tracking_uri) is None
        assert alias_version("no-such-model", "champion", tracking_uri) is None
        with pytest.raises(TrackingError, match=r"models:/m: no version 99"):
            resolve_version("m", "99", tracking_uri)
        with pytest.raises(TrackingError, match=r"no alias 'champion'"):
            resolve_version("m", "champion", tracking_uri)


def test_run_url_points_at_the_server_or_the_local_ui():
    from onnxcast.registry.tracking import redact_uri, run_url

    assert run_url("http://mlflow:5000/", "3", "abc") == "http://mlflow:5000/#/experiments/3/runs/abc"
    assert run_url("sqlite:///x.db", "3", "abc", ui_url="http://ui:1") == "http://ui:1/#/experiments/3/runs/abc"
    assert redact_uri("https://user:secret@mlflow:443/x") == "https://mlflow:443/x"


def test_using_one_tracking_uri_does_not_change_the_default(tmp_path, monkeypatch):
    """mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI; a task talking to one server must
    not make the next task (same process, e.g. dag.test) talk to it too."""
    from onnxcast.registry.tracking import client_for, default_tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("ONNXCAST_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    client_for("http://127.0.0.1:9")
    assert default_tracking_uri() == f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    # nor a subprocess started later (bench/serve.py registered to the dead server in one run)
    assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_REGISTRY_URI" not in os.environ


FIGURES = {"coverage_80": 0.78, "coverage_95": 0.93, "width_80": 2.1, "width_95": 3.4, "msis_80": 4.4,
           "msis_95": 6.25, "pinball": 0.31, "crossing": 0.0, "levels": [0.025, 0.1, 0.5, 0.9, 0.975]}


def give_intervals(run: Path) -> Path:
    """Interval figures (hand-made numbers, the report's keys) on every variant, the best baseline
    and the reference, in report.json and validation.json."""
    report = json.loads((run / "report.json").read_text())
    for i, variant in enumerate(report["models"][0]["variants"]):
        variant["holdout"]["intervals"] = {**FIGURES, "msis_95": FIGURES["msis_95"] + i}
    report["baselines"]["seasonal_naive"]["intervals"] = {**FIGURES, "msis_95": 9.5}
    report["reference"]["intervals"] = {**FIGURES, "coverage_95": 0.97, "msis_95": 7.5}
    (run / "report.json").write_text(json.dumps(report))
    (run / "models/lstm/validation.json").write_text(json.dumps(report["models"][0]))
    return run


def test_interval_figures_become_metrics_and_version_tags(tiny_lstm_run_copy, tracking_uri):  # noqa: F811
    from onnxcast.registry.tracking import client_for, log_pipeline_run, register_model

    run = give_intervals(tiny_lstm_run_copy)
    tracked = log_pipeline_run(run, model_name="m", run_key="dag/iv", families=["lstm"], tracking_uri=tracking_uri)
    version = register_model(run, tracked, model_name="m", run_key="dag/iv", tracking_uri=tracking_uri)
    client = client_for(tracking_uri)
    parent = client.get_run(tracked.parent_run_id).data.metrics
    assert (parent["baseline.seasonal_naive.msis_95"], parent["reference.msis_95"], parent["reference.coverage_95"]) \
        == (9.5, 7.5, 0.97)
    child = client.get_run(tracked.family_run_ids["lstm"]).data.metrics
    names = [v["name"] for v in json.loads((run / "report.json").read_text())["models"][0]["variants"]]
    for i, name in enumerate(names):
        assert child[f"{name}.msis_95"] == FIGURES["msis_95"] + i
        assert (child[f"{name}.coverage_80"], child[f"{name}.pinball"]) == (0.78, 0.31)
    tags = client.get_model_version("m", version.version).tags
    assert tags["onnxcast.quantile_levels"] == "0.025,0.1,0.5,0.9,0.975"  # from the ONNX model's metadata
    assert (tags["onnxcast.fp32_coverage_80"], tags["onnxcast.fp32_coverage_95"], tags["onnxcast.fp32_msis_95"]) == (
        "0.78", "0.93", "6.25")


def test_a_real_run_s_interval_figures_become_tags_and_metrics(registered, tracking_uri, tiny_lstm_run_copy):  # noqa: F811
    """The pipeline's own report (not hand-made figures): its intervals reach the version's
    tags and the family run's metrics, their status (issue 30) included."""
    from onnxcast.registry.tracking import client_for

    tracked, version = registered
    tags = client_for(tracking_uri).get_model_version("m", version.version).tags
    assert tags["onnxcast.quantile_levels"] == "0.025,0.1,0.5,0.9,0.975"
    report = json.loads((tiny_lstm_run_copy / "report.json").read_text())
    assert tags["onnxcast.intervals_status"] == report["models"][0]["intervals"]["status"]
    assert tags["onnxcast.intervals_status"] in ("calibrated", "not_judged", "recalibrated")
    assert 0.0 <= float(tags["onnxcast.fp32_coverage_80"]) <= 1.0 and float(tags["onnxcast.fp32_msis_95"]) > 0
    metrics = client_for(tracking_uri).get_run(tracked.family_run_ids["lstm"]).data.metrics
    assert metrics["fp32.msis_95"] == pytest.approx(float(tags["onnxcast.fp32_msis_95"]))


def test_the_forecast_plot_draws_the_80_and_95_bands_from_the_fp32_quantiles(
        tiny_lstm_run_copy, tmp_path, monkeypatch):  # noqa: F811
    """The bands are the fp32 ONNX model's quantiles at the plotted (back-to-back) origins."""
    import matplotlib.axes
    import numpy as np

    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.fleet_data import load_split
    from onnxcast.pipeline.validate import holdout_windows
    from onnxcast.registry.interval_figures import forecast_and_quantiles
    from onnxcast.registry.tracking import plot_forecast

    drawn = []
    original = matplotlib.axes.Axes.fill_between

    def spy(axis, x, low, high, **kwargs):
        drawn.append((kwargs.get("label"), np.asarray(low), np.asarray(high)))
        return original(axis, x, low, high, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", spy)
    path = plot_forecast(tiny_lstm_run_copy, "lstm", tmp_path / "plot.png")
    assert path.stat().st_size > 10_000
    assert [label for label, _, _ in drawn] == ["lstm fp32 95% interval", "lstm fp32 80% interval"]

    cfg = PipelineConfig.load(tiny_lstm_run_copy / "config.json")
    series, split = load_split(tiny_lstm_run_copy / "data" / "fleet", cfg)
    holdout = holdout_windows(cfg, series, split, mase_scale=1.0)
    plotted = [0]
    for i, origin in enumerate(holdout.origins[1:], 1):
        if origin >= holdout.origins[plotted[-1]] + cfg.horizon:
            plotted.append(i)
    _, quantiles, levels = forecast_and_quantiles(tiny_lstm_run_copy / "models/lstm/onnx/fp32.onnx",
                                                  holdout.history[plotted])
    assert levels == (0.025, 0.1, 0.5, 0.9, 0.975)
    np.testing.assert_allclose(drawn[0][1], quantiles[..., 0].ravel(), rtol=1e-6)
    np.testing.assert_allclose(drawn[0][2], quantiles[..., 4].ravel(), rtol=1e-6)
    np.testing.assert_allclose(drawn[1][1], quantiles[..., 1].ravel(), rtol=1e-6)
    assert np.all(drawn[0][2] - drawn[0][1] > drawn[1][2] - drawn[1][1])  # the 95% band holds the 80% one
