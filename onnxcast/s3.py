"""S3 access shared by reading, fetching, the run store and the rollout store.

Endpoint, region and credentials come from explicit settings (an Airflow ``aws_default``
connection resolved by the Amazon provider, see ``onnxcast.airflow.hooks``) or, when none are
given, from boto3's own chain (``AWS_*`` variables, ``AWS_ENDPOINT_URL``, instance role);
never from code. One client builder (:func:`make_client`) for every S3 user, so timeouts
and retries are the same everywhere and bounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from onnxcast.errors import DataError

if TYPE_CHECKING:
    from onnxcast.rollout.store import S3Settings

# Settings for reads that have no settings argument of their own (the input data of a run):
# set around the call by whoever holds them (the data-check task), None means boto3's chain.
_read_settings: ContextVar[dict[str, Any] | None] = ContextVar("onnxcast_s3_read_settings", default=None)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key/part`` -> (bucket, "key/part")."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in S3 URI {uri!r}")
    return bucket, key


def make_client(settings: S3Settings | None = None):
    """A boto3 S3 client for ``settings`` with bounded timeouts and botocore's standard
    retries (throttling, 5xx and connection errors, with backoff)."""
    import boto3
    from botocore.config import Config

    from onnxcast.rollout.store import S3Settings

    s = settings or S3Settings.from_values({})
    session = boto3.session.Session(aws_access_key_id=s.aws_access_key_id,
                                    aws_secret_access_key=s.aws_secret_access_key,
                                    aws_session_token=s.aws_session_token,
                                    profile_name=s.profile_name, region_name=s.region_name)
    config = Config(retries={"mode": "standard", "max_attempts": s.max_attempts},
                    connect_timeout=s.connect_timeout, read_timeout=s.read_timeout)
    return session.client("s3", endpoint_url=s.endpoint_url, config=config)


@contextmanager
def read_settings(settings: dict[str, Any] | None) -> Iterator[None]:
    """Use ``settings`` (S3Settings keywords) for :func:`get_object_bytes` inside the block."""
    token = _read_settings.set(settings or None)
    try:
        yield
    finally:
        _read_settings.reset(token)


def get_object_bytes(uri: str, limit: int) -> bytes:
    """The object's bytes, refused (DataError) past ``limit``: by its length before the
    download, and by what arrives, since the length is only what the server says."""
    from botocore.exceptions import BotoCoreError, ClientError

    from onnxcast.rollout.store import S3Settings

    bucket, key = split_s3_uri(uri)
    settings = _read_settings.get()
    client = make_client(S3Settings.from_values(settings) if settings else None)
    try:
        response = client.get_object(Bucket=bucket, Key=key)
        size = response.get("ContentLength")
        if isinstance(size, int) and size > limit:
            response["Body"].close()
            raise DataError(f"{uri} is {size:,} bytes, over the limit of {limit:,} bytes for a data file "
                            "(set ONNXCAST_MAX_DATA_BYTES to read larger files)")
        data = response["Body"].read(limit + 1)
        if len(data) > limit:
            raise DataError(f"{uri} is over the limit of {limit:,} bytes for a data file")
        return data
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        raise DataError(f"{uri}: cannot read from S3 ({code})") from None
    except BotoCoreError as exc:
        raise DataError(f"{uri}: cannot reach S3 ({exc})") from None
