"""onnxcast.registry.fetch: a model from the MLflow registry, an S3 prefix (moto over HTTP) or a
folder lands in a run directory as train_family would have left it; bad sources fail clearly."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import pytest
from run_fixtures import tiny_lstm_run, tiny_lstm_run_copy  # noqa: F401  (fixtures)

from onnxcast.base.s3 import S3Settings

pytestmark = pytest.mark.slow


def same_weights(a: Path, b: Path) -> bool:
    import torch

    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.fixture
def registry(tiny_lstm_run_copy, tmp_path):  # noqa: F811
    from onnxcast.registry.tracking import log_pipeline_run, register_model

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracked = log_pipeline_run(tiny_lstm_run_copy, model_name="f", run_key="k", families=["lstm"], tracking_uri=uri)
    version = register_model(tiny_lstm_run_copy, tracked, model_name="f", run_key="k", tracking_uri=uri)
    return uri, version


class TestFromMlflow:
    @pytest.mark.parametrize("ref", ["models:/f@challenger", "models:/f/1"])
    def test_fetch_by_alias_or_version(self, registry, tiny_lstm_run, tmp_path, ref):  # noqa: F811
        from onnxcast.registry.fetch import fetch_model, read_source_spec

        uri, _ = registry
        assert read_source_spec(ref, tracking_uri=uri)["family"] == "lstm"
        fetched = fetch_model(ref, tmp_path / "models" / "lstm", tracking_uri=uri, expect={"horizon": 12})
        assert (fetched.family, fetched.source["version"]) == ("lstm", "1")
        assert same_weights(tmp_path / "models/lstm/model.pt", tiny_lstm_run / "models/lstm/model.pt")

    @pytest.mark.parametrize("ref, message", [("models:/f@champion", "no alias 'champion'"),
                                              ("models:/f/7", "no version 7"),
                                              ("models:/nothing@champion", "no alias")])
    def test_missing_alias_or_version(self, registry, tmp_path, ref, message):
        from onnxcast.registry.fetch import FetchError, fetch_model

        with pytest.raises(FetchError, match=message):
            fetch_model(ref, tmp_path / "m", tracking_uri=registry[0])
        assert not (tmp_path / "m").exists()

    def test_a_model_for_another_horizon_is_refused(self, registry, tmp_path):
        from onnxcast.registry.fetch import FetchError, fetch_model

        with pytest.raises(FetchError, match="horizon is 12, this run needs 24"):
            fetch_model("models:/f/1", tmp_path / "m", tracking_uri=registry[0], expect={"horizon": 24})

    def test_stage_version_lays_out_the_run_again(self, registry, tiny_lstm_run, tmp_path):  # noqa: F811
        from onnxcast.registry.fetch import stage_version

        staged = stage_version("f", "challenger", tmp_path / "staged", tracking_uri=registry[0])
        assert (staged["version"], staged["family"]) == ("1", "lstm")
        for name in ("fp32", "fp32-opt", "int8"):
            assert (tmp_path / f"staged/models/lstm/onnx/{name}.onnx").read_bytes() == \
                (tiny_lstm_run / f"models/lstm/onnx/{name}.onnx").read_bytes()
        assert (tmp_path / "staged/data/fleet/values.npy").exists()


    @pytest.mark.parametrize("where", ["absolute", "parent"])
    def test_stage_version_refuses_report_paths_outside_the_run_dir(self, tiny_lstm_run_copy, tmp_path, where):  # noqa: F811
        """A registered report is input: an onnx_path that is absolute or climbs out of the
        run directory must not make the promote DAG write wherever the worker can."""
        import json

        from onnxcast.registry.fetch import FetchError, stage_version
        from onnxcast.registry.tracking import log_pipeline_run, register_model

        outside = tmp_path / "outside"
        report_path = tiny_lstm_run_copy / "report.json"
        report = json.loads(report_path.read_text())
        variant = report["models"][0]["variants"][0]
        name = Path(variant["onnx_path"]).name
        variant["onnx_path"] = str(outside / name) if where == "absolute" else f"../../outside/{name}"
        report_path.write_text(json.dumps(report))
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        tracked = log_pipeline_run(tiny_lstm_run_copy, model_name="f", run_key="k", families=["lstm"], tracking_uri=uri)
        register_model(tiny_lstm_run_copy, tracked, model_name="f", run_key="k", tracking_uri=uri)
        staged = tmp_path / "runs" / "staged"
        with pytest.raises(FetchError, match="outside the run directory|not a relative path inside the run directory"):
            stage_version("f", "1", staged, tracking_uri=uri)
        assert not outside.exists()
        assert not staged.exists()  # checked before anything was written


class TestFromS3:
    def upload(self, bucket: str, endpoint: str, run: Path, prefix: str, weights: bytes | None = None) -> None:
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.put_object(Bucket=bucket, Key=f"{prefix}/model.pt",
                      Body=weights if weights is not None else (run / "models/lstm/model.pt").read_bytes())
        s3.put_object(Bucket=bucket, Key=f"{prefix}/model.json", Body=(run / "models/lstm/model.json").read_bytes())

    def test_fetch_state_dict_and_config(self, s3_bucket, s3_env, tiny_lstm_run, tmp_path):  # noqa: F811
        from onnxcast.registry.fetch import fetch_model

        self.upload(s3_bucket, s3_env, tiny_lstm_run, "models/v1")
        fetched = fetch_model(f"s3://{s3_bucket}/models/v1/", tmp_path / "lstm",
                              s3_settings=S3Settings(endpoint_url=s3_env))
        assert fetched.source == {"kind": "s3", "uri": f"s3://{s3_bucket}/models/v1/"}
        assert same_weights(tmp_path / "lstm/model.pt", tiny_lstm_run / "models/lstm/model.pt")

    def test_missing_object(self, s3_bucket, s3_env, tmp_path):
        from onnxcast.registry.fetch import FetchError, fetch_model

        with pytest.raises(FetchError, match=rf"s3://{s3_bucket}/nothing/model.pt: not found"):
            fetch_model(f"s3://{s3_bucket}/nothing", tmp_path / "m", s3_settings=S3Settings(endpoint_url=s3_env))

    def test_pickled_code_is_refused(self, s3_bucket, s3_env, tiny_lstm_run, tmp_path):  # noqa: F811
        from onnxcast.registry.fetch import FetchError, fetch_model

        class Payload:
            def __reduce__(self):
                return (print, ("pwned",))

        buffer = io.BytesIO()
        pickle.dump(Payload(), buffer)
        self.upload(s3_bucket, s3_env, tiny_lstm_run, "evil", weights=buffer.getvalue())
        with pytest.raises(FetchError, match="weights_only=True"):
            fetch_model(f"s3://{s3_bucket}/evil/", tmp_path / "m", s3_settings=S3Settings(endpoint_url=s3_env))
        assert not (tmp_path / "m" / "model.pt").exists()


def test_unusable_source_uri():
    from onnxcast.registry.fetch import FetchError, parse_source

    with pytest.raises(FetchError, match="expected models:/<name>@<alias>"):
        parse_source("models:/only-a-name")
    with pytest.raises(FetchError, match="expected models:/..., s3://"):
        parse_source("http://example.com/model.pt")
