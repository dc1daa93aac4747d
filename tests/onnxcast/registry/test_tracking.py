"""onnxcast.registry.tracking against a real MLflow store (SQLite in tmp): runs, registry, aliases."""

from __future__ import annotations

import json
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
        assert json.loads(signature["outputs"])[0]["tensor-spec"]["shape"] == [-1, 12]
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
        assert sorted((h["from_version"], h["version"]) for h in history) == [
            (None, first.version), (first.version, second.version)] or len(history) == 1  # same-second stamps
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
    client_for("http://127.0.0.1:9")
    assert default_tracking_uri() == f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
