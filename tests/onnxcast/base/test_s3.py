"""onnxcast.base.s3: one S3Settings reaches every S3 user, one URI parser, one map of botocore
errors that the run store, the rollout store, fetches and data reads word in their own types."""

from __future__ import annotations

import socket

import pytest

from onnxcast.base.s3 import (
    ACCESS_DENIED,
    NO_SUCH_BUCKET,
    NO_SUCH_KEY,
    S3Settings,
    s3_error_code,
    s3_error_kind,
    s3_error_message,
    s3_status,
    split_s3_uri,
)


def client_error(code: str, status: int, message: str = ""):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


@pytest.mark.parametrize("code, status, kind", [
    ("NoSuchKey", 404, NO_SUCH_KEY),
    ("404", 404, NO_SUCH_KEY),  # a HEAD has no body: the status is the code
    ("NoSuchBucket", 404, NO_SUCH_BUCKET),
    ("AccessDenied", 403, ACCESS_DENIED),
    ("InvalidAccessKeyId", 403, ACCESS_DENIED),
    ("SignatureDoesNotMatch", 403, ACCESS_DENIED),
    ("AllAccessDisabled", 403, ACCESS_DENIED),
    ("SlowDown", 503, None),
    ("PreconditionFailed", 412, None),
])
def test_error_map(code, status, kind):
    exc = client_error(code, status, "the message")
    assert (s3_error_code(exc), s3_status(exc), s3_error_kind(exc), s3_error_message(exc)) == \
        (code, status, kind, "the message")


def test_errors_without_an_s3_answer():
    from botocore.exceptions import ClientError, EndpointConnectionError

    unreachable = EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
    assert (s3_error_code(unreachable), s3_status(unreachable), s3_error_kind(unreachable)) == ("", 0, None)
    assert s3_error_code(ValueError("x")) == "" and s3_error_message(ValueError("x")) == ""
    bare = ClientError({"ResponseMetadata": {"HTTPStatusCode": 404}}, "GetObject")  # no Error.Code
    assert (s3_error_code(bare), s3_error_kind(bare)) == ("404", NO_SUCH_KEY)


def test_split_s3_uri():
    assert split_s3_uri("s3://bucket/a/b.csv") == ("bucket", "a/b.csv")
    assert split_s3_uri("s3://bucket") == ("bucket", "")
    with pytest.raises(ValueError, match="no bucket"):
        split_s3_uri("s3:///key")
    with pytest.raises(ValueError, match="not an s3:// URI"):
        split_s3_uri("gs://bucket/key")


def test_each_store_words_the_same_error_its_own_way():
    from onnxcast.base.errors import StoreError
    from onnxcast.rollout.store import S3Store
    from onnxcast.runstore import RunStoreError, S3Backend

    class Refusing:
        def __init__(self, exc):
            self.exc = exc

        def get_object(self, **_):
            raise self.exc

    denied, no_bucket, no_key = (client_error("AccessDenied", 403), client_error("NoSuchBucket", 404),
                                 client_error("NoSuchKey", 404))
    with pytest.raises(RunStoreError, match=r"^s3://b/runs/k: access denied \(read, AccessDenied\); check the "
                                            "aws_default connection's credentials"):
        S3Backend("b", "runs", Refusing(denied)).read("k")
    with pytest.raises(RunStoreError, match=r"^s3://b/runs/k: bucket 'b' does not exist$"):
        S3Backend("b", "runs", Refusing(no_bucket)).read("k")
    with pytest.raises(FileNotFoundError):
        S3Backend("b", "runs", Refusing(no_key)).read("k")

    store = S3Store("b", "p", S3Settings())
    assert isinstance(store._error(denied, "GetObject", "k"), StoreError)
    assert str(store._error(denied, "GetObject", "k")).startswith("s3://b/p/k: access denied (GetObject 403 AccessDenied)")
    assert str(store._error(no_bucket, "PutObject", "k")) == "s3://b/p/k: bucket 'b' does not exist"
    assert str(store._error(client_error("SlowDown", 503, "Reduce your rate"), "PutObject", "k")) == \
        "s3://b/p/k: PutObject failed (SlowDown: Reduce your rate)"


@pytest.fixture
def dead_endpoint() -> S3Settings:
    """Settings of an endpoint nothing listens on (connection refused, no retry)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return S3Settings(endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1", aws_access_key_id="x",
                      aws_secret_access_key="y", max_attempts=1, connect_timeout=1)


def test_explicit_settings_reach_every_s3_user(s3_bucket, dead_endpoint, tmp_path):
    """The environment points at a working S3 (moto); the settings passed point elsewhere:
    each user goes where its settings say, not where the environment does."""
    import boto3

    from onnxcast.base.errors import DataError, StoreError
    from onnxcast.pipeline.reading import read_table
    from onnxcast.registry.fetch import FetchError, read_source_spec
    from onnxcast.rollout.store import open_store
    from onnxcast.runstore import RunStore, RunStoreError, backend_for

    boto3.client("s3").put_object(Bucket=s3_bucket, Key="in/data.csv", Body=b"ds,y\n")
    uri = f"s3://{s3_bucket}/in/data.csv"
    with pytest.raises(DataError, match=rf"^{uri}: cannot reach S3"):
        read_table(uri, s3_settings=dead_endpoint)
    with pytest.raises(FetchError, match=rf"^s3://{s3_bucket}/in/model.json: cannot reach S3"):
        read_source_spec(f"s3://{s3_bucket}/in/", s3_settings=dead_endpoint)
    with pytest.raises(StoreError, match="cannot read from S3"):
        open_store(f"s3://{s3_bucket}/rollout", dead_endpoint).read_pointer("m/channels/edge.json")
    with pytest.raises(RunStoreError, match=rf"^s3://{s3_bucket}/runs/d/r/_steps/x.json: cannot read"):
        RunStore(f"s3://{s3_bucket}/runs", s3_settings=dead_endpoint).open(f"s3://{s3_bucket}/runs/d/r").backend.read(
            "_steps/x.json")
    with pytest.raises(RunStoreError, match="cannot list"):
        backend_for(f"s3://{s3_bucket}/runs", s3_settings=dead_endpoint).list("")
    # and with None, the environment's S3
    assert backend_for(f"s3://{s3_bucket}/in").read("data.csv") == b"ds,y\n"


def test_a_local_rollout_store_takes_no_settings(tmp_path):
    from onnxcast.base.errors import ConfigError
    from onnxcast.rollout.store import open_store

    with pytest.raises(ConfigError, match="a local store takes no settings"):
        open_store(str(tmp_path), S3Settings())
