"""S3 access shared by reading and the rollout store. Endpoint, region and credentials come
from the environment (AWS_* variables, AWS_ENDPOINT_URL) or explicit settings, never code."""

from __future__ import annotations

from functools import lru_cache

from onnxcast.errors import DataError


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key/part`` -> (bucket, "key/part")."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in S3 URI {uri!r}")
    return bucket, key


@lru_cache(maxsize=8)
def s3_client(endpoint_url: str | None = None, region_name: str | None = None):
    import boto3
    from botocore.config import Config

    config = Config(retries={"max_attempts": 5, "mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint_url, region_name=region_name, config=config)


def get_object_bytes(uri: str) -> bytes:
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split_s3_uri(uri)
    try:
        return s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        raise DataError(f"{uri}: cannot read from S3 ({code})") from None
    except BotoCoreError as exc:
        raise DataError(f"{uri}: cannot reach S3 ({exc})") from None
