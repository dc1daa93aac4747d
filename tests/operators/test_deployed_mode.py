"""Outside the embedded mode nothing falls back to a local folder or store: a missing setting
or connection fails the task naming it. With the settings, tasks hand files to each other
through an S3 run store reached through ``aws_default`` (moto's S3 server over HTTP here;
the two-worker stack test does it on SeaweedFS with tasks on two hosts)."""

from __future__ import annotations

import json

import pytest
from conftest import OPS_SETTINGS, make_context


@pytest.fixture
def deployed(monkeypatch):
    monkeypatch.setenv("ONNXCAST_MODE", "deployed")
    for name in ("ONNXCAST_RUN_ROOT", "ONNXCAST_STORE_URI", "AIRFLOW_CONN_AWS_DEFAULT", "AIRFLOW_CONN_MLFLOW_DEFAULT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def aws_connection(s3_server, monkeypatch):
    """aws_default as a deployment sets it: keys and the endpoint in the connection only."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": s3_server, "region_name": "us-east-1"}}))
    return s3_server


def test_the_repository_config_is_the_embedded_mode(monkeypatch):
    from onnxcast.airflow import settings

    monkeypatch.delenv("ONNXCAST_MODE", raising=False)
    assert settings.mode() == "embedded"  # airflow.cfg: [onnxcast] mode = embedded
    monkeypatch.setenv("ONNXCAST_MODE", "production")
    assert settings.mode() == "deployed"  # anything but "embedded" is strict


def test_no_run_root_fails_the_data_check_naming_the_setting(deployed):
    from airflow.sdk.exceptions import AirflowFailException

    from onnxcast.airflow.operators import CheckDataOperator

    op = CheckDataOperator(task_id="check_data", settings=OPS_SETTINGS, compare_with_champion=False)
    with pytest.raises(AirflowFailException, match="no run store configured: set ONNXCAST_RUN_ROOT"):
        op.execute(make_context())


def test_no_mlflow_connection_fails_instead_of_a_local_sqlite_store(deployed):
    from airflow.sdk.exceptions import AirflowFailException

    from onnxcast.airflow.hooks import MlflowHook

    with pytest.raises(AirflowFailException, match="no Airflow connection 'mlflow_default'"):
        MlflowHook().get_settings()


def test_no_aws_connection_fails_instead_of_the_environment(deployed):
    from airflow.sdk.exceptions import AirflowFailException

    from onnxcast.airflow.hooks import S3SettingsHook

    with pytest.raises(AirflowFailException, match="no Airflow connection 'aws_default' for S3"):
        S3SettingsHook().get_settings()


def test_no_store_uri_fails_the_promotion_settings(deployed):
    from airflow.sdk.exceptions import AirflowFailException

    from onnxcast.airflow.settings import store_uri

    with pytest.raises(AirflowFailException, match="no rollout store configured"):
        store_uri(None)
    assert store_uri("s3://bucket-a/store") == "s3://bucket-a/store"


def test_aws_default_is_resolved_by_the_amazon_provider(deployed, aws_connection):
    from onnxcast.airflow.hooks import S3SettingsHook

    settings = S3SettingsHook().get_settings()
    assert settings.endpoint_url == aws_connection and settings.region_name == "us-east-1"
    assert settings.aws_access_key_id == "testing"


@pytest.mark.slow
def test_tasks_hand_files_to_each_other_through_an_s3_run_store(deployed, aws_connection, monkeypatch, tmp_path):
    """The data gate (check_data, check_series, merge_data) on one "host", train on another: each
    with its own scratch, sharing only the bucket. Also the input data is read through aws_default."""
    import boto3

    from onnxcast.airflow.operators import (
        CheckDataOperator,
        CheckSeriesOperator,
        MergeDataOperator,
        TrainOrFetchModelOperator,
    )

    client = boto3.client("s3", endpoint_url=aws_connection, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    client.create_bucket(Bucket="runs-bucket")
    with open(OPS_SETTINGS["data_uri"], "rb") as f:
        client.put_object(Bucket="runs-bucket", Key="input/co2.csv", Body=f.read())
    monkeypatch.setenv("ONNXCAST_RUN_ROOT", "s3://runs-bucket/runs")
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(
        {"conn_type": "http", "host": f"sqlite:///{tmp_path / 'mlflow.db'}"}))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "host-a"))
    (tmp_path / "host-a").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    context = make_context(dag_id="s3_runs")
    check = CheckDataOperator(task_id="check_data", settings={**OPS_SETTINGS, "data_uri": "s3://runs-bucket/input/co2.csv"},
                              compare_with_champion=False)
    assert check.execute(context) == [0]  # one series: one shard
    run_url = context["ti"].xcoms["run_dir"]
    assert run_url.startswith("s3://runs-bucket/runs/s3_runs/")
    CheckSeriesOperator(task_id="check_series", run_dir=run_url, shard=0).execute(make_context(dag_id="s3_runs"))
    MergeDataOperator(task_id="merge_data", run_dir=run_url, shards=[0]).execute(make_context(dag_id="s3_runs"))
    assert list((tmp_path / "host-a").iterdir()) == []  # scratch removed after publishing

    monkeypatch.setenv("TMPDIR", str(tmp_path / "host-b"))
    (tmp_path / "host-b").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)
    train = TrainOrFetchModelOperator(task_id="train_or_fetch", run_dir=run_url, family="lstm")
    assert train.execute(make_context(dag_id="s3_runs"))["source"] == "trained"
    keys = {o["Key"] for o in client.list_objects_v2(Bucket="runs-bucket", Prefix="runs/")["Contents"]}
    prefix = run_url.removeprefix("s3://runs-bucket/")
    assert {f"{prefix}/_steps/check_data.json", f"{prefix}/_steps/train_or_fetch.lstm.json",
            f"{prefix}/config.json", f"{prefix}/models/lstm/model.pt"} <= keys
    marker = json.loads(client.get_object(Bucket="runs-bucket", Key=f"{prefix}/_steps/train_or_fetch.lstm.json")
                        ["Body"].read())
    assert set(marker["files"]) == {"models/lstm/model.pt", "models/lstm/model.json"}


@pytest.mark.slow
def test_the_ensemble_task_on_another_host_combines_what_the_training_tasks_published(
        deployed, aws_connection, monkeypatch, tmp_path):
    """The ensemble on a host that trained nothing (its own empty scratch, only the bucket shared):
    it stages the members the train_or_fetch tasks published, and the export on a fourth host
    finds the ensemble it published."""
    import tempfile

    import boto3

    from onnxcast.airflow.operators import (
        CheckDataOperator,
        CheckSeriesOperator,
        EnsembleOperator,
        ExportModelOperator,
        MergeDataOperator,
        TrainOrFetchModelOperator,
    )

    def on_host(name: str) -> None:
        (tmp_path / name).mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp_path / name))
        monkeypatch.setattr(tempfile, "tempdir", None)

    boto3.client("s3", endpoint_url=aws_connection, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="ensemble-runs")
    monkeypatch.setenv("ONNXCAST_RUN_ROOT", "s3://ensemble-runs/runs")
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(
        {"conn_type": "http", "host": f"sqlite:///{tmp_path / 'mlflow.db'}"}))
    on_host("host-a")
    context = make_context(dag_id="s3_ensemble")
    settings = {**OPS_SETTINGS, "models": ["dlinear", "nhits", "ensemble"], "model_name": "ops-ensemble"}
    CheckDataOperator(task_id="check_data", settings=settings, compare_with_champion=False).execute(context)
    run_url = context["ti"].xcoms["run_dir"]
    CheckSeriesOperator(task_id="check_series", run_dir=run_url, shard=0).execute(make_context(dag_id="s3_ensemble"))
    merge = MergeDataOperator(task_id="merge_data", run_dir=run_url, shards=[0])
    assert merge.execute(make_context(dag_id="s3_ensemble")) == ["dlinear", "nhits"]  # trained in parallel
    on_host("host-b")
    for family in ("dlinear", "nhits"):
        TrainOrFetchModelOperator(task_id="train_or_fetch", run_dir=run_url, family=family).execute(
            make_context(dag_id="s3_ensemble"))
    on_host("host-c")
    made = EnsembleOperator(task_id="ensemble", run_dir=run_url).execute(make_context(dag_id="s3_ensemble"))
    assert made == ["dlinear", "nhits", "ensemble"]
    assert list((tmp_path / "host-c").iterdir()) == []  # scratch removed after publishing
    marker = json.loads(boto3.client("s3", endpoint_url=aws_connection, aws_access_key_id="testing",
                                     aws_secret_access_key="testing", region_name="us-east-1").get_object(
        Bucket="ensemble-runs", Key=f"{run_url.removeprefix('s3://ensemble-runs/')}/_steps/ensemble.json")["Body"].read())
    assert set(marker["files"]) == {"models/ensemble/model.pt", "models/ensemble/model.json"}
    on_host("host-d")
    exported = ExportModelOperator(task_id="export", run_dir=run_url, family="ensemble").execute(
        make_context(dag_id="s3_ensemble"))
    assert exported["onnx_path"] == "models/ensemble/onnx/fp32.onnx"


def test_aws_default_can_assume_a_role(deployed, aws_connection, monkeypatch):
    """role_arn in aws_default: the Amazon provider asks STS (moto's server here) for temporary
    keys, and every S3 client onnxcast builds uses them, session token included."""
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": aws_connection, "region_name": "us-east-1",
                  "role_arn": "arn:aws:iam::123456789012:role/onnxcast-pipeline",
                  "service_config": {"sts": {"endpoint_url": aws_connection}}}}))
    from onnxcast.airflow.hooks import S3SettingsHook

    hook = S3SettingsHook()
    settings = hook.get_settings()
    assert settings.aws_access_key_id != "testing"  # the role's temporary keys, not the connection's
    assert settings.aws_session_token
    hook.s3_client().list_buckets()  # the temporary keys work against the S3 endpoint
