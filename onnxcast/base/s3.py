"""S3 access shared by reading, fetching, the run store and the rollout store.

Endpoint, region and credentials come from explicit settings (an Airflow ``aws_default``
connection resolved by the Amazon provider, see ``onnxcast.airflow.hooks``) or, when none are
given, from boto3's own chain (``AWS_*`` variables, ``AWS_ENDPOINT_URL``, instance role);
never from code. Every S3 user (input data, fetches, the run store, the rollout store) takes
one ``S3Settings | None`` (None: boto3's chain), builds its client with :func:`make_client`
(timeouts and retries the same everywhere and bounded), splits ``s3://`` URIs with
:func:`split_s3_uri`, and classifies botocore errors with :func:`s3_error_code`,
:func:`s3_status` and :func:`s3_error_kind`, wording them in its own exception type.

Top-level imports: the standard library and onnxcast.base only (boto3 inside functions).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from onnxcast.base import environment
from onnxcast.base.errors import ConfigError, DataError

SSE_ALGORITHMS = ("AES256", "aws:kms")
# The kinds of S3 error the stores tell apart (s3_error_kind); any other error is reported by its code.
ACCESS_DENIED, NO_SUCH_BUCKET, NO_SUCH_KEY = "access-denied", "no-such-bucket", "no-such-key"
_ACCESS_DENIED_CODES = ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch")
_NO_SUCH_KEY_CODES = ("NoSuchKey", "404")


@dataclass(frozen=True)
class S3Settings:
    """Connection and write settings of an S3 store. None means: boto3's default chain
    (environment, shared config, instance role), as an Airflow ``aws_default`` connection
    passes them through."""

    endpoint_url: str | None = None
    region_name: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    profile_name: str | None = None
    sse: str = "AES256"
    sse_kms_key_id: str | None = None
    max_attempts: int = 5  # botocore "standard" retries: throttling, 5xx, connection errors
    connect_timeout: float = 10.0
    read_timeout: float = 60.0

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> S3Settings:
        """Validate ``values`` (unknown keys refused by name); SSE falls back to the env."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown S3 store setting(s): {', '.join(unknown)}")
        values = {k: v for k, v in values.items() if v is not None}
        if "sse" not in values:
            values["sse"] = environment.value("ONNXCAST_STORE_SSE")
        if "sse_kms_key_id" not in values:
            values["sse_kms_key_id"] = environment.get("ONNXCAST_STORE_SSE_KMS_KEY_ID")
        settings = cls(**values)
        if settings.sse not in SSE_ALGORITHMS:
            raise ConfigError(f"S3 store setting sse={settings.sse!r}: expected one of {list(SSE_ALGORITHMS)}")
        if settings.sse_kms_key_id and settings.sse != "aws:kms":
            raise ConfigError("S3 store setting sse_kms_key_id needs sse='aws:kms'")
        if settings.max_attempts < 1:
            raise ConfigError(f"S3 store setting max_attempts must be >= 1, got {settings.max_attempts}")
        return settings

    def __repr__(self) -> str:  # never print credentials
        return f"S3Settings(endpoint_url={self.endpoint_url!r}, region_name={self.region_name!r}, sse={self.sse!r})"


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

    s = settings or S3Settings.from_values({})
    session = boto3.session.Session(aws_access_key_id=s.aws_access_key_id,
                                    aws_secret_access_key=s.aws_secret_access_key,
                                    aws_session_token=s.aws_session_token,
                                    profile_name=s.profile_name, region_name=s.region_name)
    config = Config(retries={"mode": "standard", "max_attempts": s.max_attempts},
                    connect_timeout=s.connect_timeout, read_timeout=s.read_timeout)
    return session.client("s3", endpoint_url=s.endpoint_url, config=config)


class ReadWords(NamedTuple):
    """How :func:`get_object_bytes` words its refusals: ``str.format`` templates over ``uri``,
    ``limit``, ``size`` (the length the server gave), ``code`` (:func:`s3_error_code`) and
    ``exc`` (a BotoCoreError). ``missing``: for a missing key or bucket (None: ``failed``)."""

    too_large: str
    over: str
    failed: str
    unreachable: str = "{uri}: cannot reach S3 ({exc})"
    missing: str | None = None


DATA_FILE_WORDS = ReadWords(
    too_large="{uri} is {size:,} bytes, over the limit of {limit:,} bytes for a data file "
              "(set ONNXCAST_MAX_DATA_BYTES to read larger files)",
    over="{uri} is over the limit of {limit:,} bytes for a data file",
    failed="{uri}: cannot read from S3 ({code})",
)


def get_object_bytes(uri: str, limit: int, s3_settings: S3Settings | None = None, *,
                     error: type[Exception] = DataError, words: ReadWords = DATA_FILE_WORDS) -> bytes:
    """The object's bytes, refused (``error``, worded by ``words``) past ``limit``: by its
    length before the download, and by what arrives, since the length is only what the
    server says."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split_s3_uri(uri)
    client = make_client(s3_settings)
    try:
        response = client.get_object(Bucket=bucket, Key=key)
        size = response.get("ContentLength")
        if isinstance(size, int) and size > limit:
            response["Body"].close()
            raise error(words.too_large.format(uri=uri, size=size, limit=limit))
        data = response["Body"].read(limit + 1)
        if len(data) > limit:
            raise error(words.over.format(uri=uri, limit=limit))
        return data
    except ClientError as exc:
        code = s3_error_code(exc) or "error"
        missing = words.missing is not None and s3_error_kind(exc) in (NO_SUCH_KEY, NO_SUCH_BUCKET)
        raise error((words.missing if missing else words.failed).format(uri=uri, code=code)) from None
    except BotoCoreError as exc:
        raise error(words.unreachable.format(uri=uri, exc=exc)) from None


# --- the one map of botocore errors: each caller words its own exception from these ------

def s3_error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ClientError (``NoSuchKey``, ``AccessDenied``, ``404``
    for a bodiless answer), else its HTTP status as text; "" for an error without an S3
    response (a BotoCoreError: connection refused, timeout)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    code = (response.get("Error") or {}).get("Code") or (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return str(code) if code else ""


def s3_error_message(exc: BaseException) -> str:
    """The message S3 sent with the error ("" if none)."""
    response = getattr(exc, "response", None)
    return str((response.get("Error") or {}).get("Message") or "") if isinstance(response, dict) else ""


def s3_status(exc: BaseException) -> int:
    """The HTTP status of a botocore ClientError (0 when there is none)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return 0
    return int((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)


def s3_error_kind(exc: BaseException) -> str | None:
    """:data:`NO_SUCH_KEY`, :data:`NO_SUCH_BUCKET` or :data:`ACCESS_DENIED` (HTTP 403, or a
    code that means bad or missing rights or credentials), else None."""
    code = s3_error_code(exc)
    if code in _NO_SUCH_KEY_CODES:
        return NO_SUCH_KEY
    if code == "NoSuchBucket":
        return NO_SUCH_BUCKET
    if s3_status(exc) == 403 or code in _ACCESS_DENIED_CODES:
        return ACCESS_DENIED
    return None
