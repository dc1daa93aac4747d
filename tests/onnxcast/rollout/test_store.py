"""The rollout store's primitives on both backends: write-once objects, compare-and-swap
pointers, and S3 specifics (encryption, checksums, retries, 403/412) over real HTTP."""

from __future__ import annotations

import base64
import hashlib
import threading

import pytest

from onnxcast.base.errors import ConfigError, ConflictError, StoreError, VerificationError
from onnxcast.base.s3 import S3Settings
from onnxcast.rollout.store import LocalStore, S3Store, check_name, open_store


class TestOpenStore:
    def test_local_paths_and_s3_uris(self, tmp_path):
        assert isinstance(open_store(str(tmp_path)), LocalStore)
        assert open_store(f"file://{tmp_path}").uri == str(tmp_path)
        store = open_store("s3://my-bucket/some/prefix/")
        assert isinstance(store, S3Store)
        assert (store.bucket, store.prefix, store.uri) == ("my-bucket", "some/prefix", "s3://my-bucket/some/prefix")

    @pytest.mark.parametrize("uri, message", [
        ("", "store URI is empty"),
        ("gs://bucket/x", "unsupported store URI 'gs://bucket/x'"),
        ("s3://", "'' is not a valid S3 bucket name"),
        ("s3://Bad_Bucket/x", "'Bad_Bucket' is not a valid S3 bucket name"),
    ])
    def test_bad_uri_is_one_clear_line(self, uri, message):
        with pytest.raises(ConfigError, match=message) as info:
            open_store(uri)
        assert "\n" not in str(info.value)

    @pytest.mark.parametrize("settings, message", [
        ({"endpoint": "http://x"}, "unknown S3 store setting"),
        ({"sse": "none"}, "sse='none'"),
        ({"sse_kms_key_id": "k"}, "needs sse='aws:kms'"),
        ({"max_attempts": 0}, "max_attempts must be >= 1"),
    ])
    def test_bad_s3_settings(self, settings, message):
        with pytest.raises(ConfigError, match=message):
            open_store("s3://bucket/x", S3Settings.from_values(settings))

    def test_settings_never_print_credentials(self):
        store = open_store("s3://bucket/x", S3Settings.from_values({"aws_access_key_id": "AKIDSECRET",
                                                             "aws_secret_access_key": "SHHH"}))
        assert "SHHH" not in repr(store.settings) and "AKIDSECRET" not in repr(store.settings)

    def test_sse_from_environment(self, monkeypatch):
        monkeypatch.setenv("ONNXCAST_STORE_SSE", "aws:kms")
        monkeypatch.setenv("ONNXCAST_STORE_SSE_KMS_KEY_ID", "alias/rollout")
        settings = open_store("s3://bucket/x").settings
        assert (settings.sse, settings.sse_kms_key_id) == ("aws:kms", "alias/rollout")

    @pytest.mark.parametrize("name", ["", "..", "a/b", "../x", ".hidden", "a" * 129, "a..b"])
    def test_names_cannot_escape_the_layout(self, name):
        with pytest.raises(ConfigError, match="invalid version name"):
            check_name("version", name)


class TestPrimitives:
    def test_create_writes_once(self, store_uri):
        store = open_store(store_uri)
        key = store.version_key("m", "v1", "a.onnx")
        assert store.create(key, b"first") is True
        assert store.create(key, b"second") is False
        assert store.read(key) == b"first"
        assert store.read(store.version_key("m", "v1", "missing.onnx")) is None
        assert store.list_versions("m") == ["v1"]

    def test_pointer_compare_and_swap(self, store_uri):
        store = open_store(store_uri)
        key = store.channel_key("m", "edge")
        assert store.read_pointer(key).value is None
        token = store.replace_pointer(key, {"version": "1"}, None)
        with pytest.raises(ConflictError, match="moved by another promotion"):
            store.replace_pointer(key, {"version": "x"}, None)  # it exists now
        token2 = store.replace_pointer(key, {"version": "2"}, token)
        with pytest.raises(ConflictError, match=r"channels/edge.json was moved by another promotion"):
            store.replace_pointer(key, {"version": "stale"}, token)
        pointer = store.read_pointer(key)
        assert pointer.value == {"version": "2"} and pointer.token == token2

    def test_concurrent_swaps_have_one_winner(self, store_uri):
        store = open_store(store_uri)
        key = store.channel_key("m", "edge")
        token = store.replace_pointer(key, {"version": "0"}, None)
        barrier, outcomes = threading.Barrier(8), {}

        def swap(i: int) -> None:
            mine = open_store(store_uri)
            barrier.wait()
            try:
                mine.replace_pointer(key, {"version": str(i + 1)}, token)
                outcomes[i] = "won"
            except ConflictError:
                outcomes[i] = "lost"

        threads = [threading.Thread(target=swap, args=(i,)) for i in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        winners = [i for i, o in outcomes.items() if o == "won"]
        assert len(outcomes) == 8 and len(winners) == 1
        assert store.read_pointer(key).value == {"version": str(winners[0] + 1)}


class TestS3:
    def test_objects_are_encrypted_with_a_sha256_checksum(self, s3_bucket):
        store = open_store(f"s3://{s3_bucket}/p")
        data = b"model bytes"
        store.create("m/versions/1/a.onnx", data)
        head = store.client.head_object(Bucket=s3_bucket, Key="p/m/versions/1/a.onnx", ChecksumMode="ENABLED")
        assert head["ServerSideEncryption"] == "AES256"
        assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()

    def test_kms_encryption_setting(self, s3_bucket):
        store = open_store(f"s3://{s3_bucket}/p", S3Settings.from_values({"sse": "aws:kms", "sse_kms_key_id": "alias/rollout"}))
        store.replace_pointer("m/channels/edge.json", {"version": "1"}, None)
        head = store.client.head_object(Bucket=s3_bucket, Key="p/m/channels/edge.json")
        assert head["ServerSideEncryption"] == "aws:kms"
        assert head["SSEKMSKeyId"].endswith("alias/rollout")

    def test_throttling_and_5xx_are_retried(self, s3_bucket):
        store = open_store(f"s3://{s3_bucket}/p", S3Settings.from_values({"max_attempts": 3}))
        sent = _inject(store, [(503, "SlowDown"), (500, "InternalError")])
        assert store.create("m/versions/1/a.onnx", b"x") is True
        assert len(sent) == 3 and store.read("m/versions/1/a.onnx") == b"x"

    def test_403_is_not_retried(self, s3_bucket):
        store = open_store(f"s3://{s3_bucket}/p", S3Settings.from_values({"max_attempts": 5}))
        sent = _inject(store, [(403, "AccessDenied")])
        with pytest.raises(StoreError, match=r"access denied \(PutObject 403 AccessDenied\)"):
            store.create("m/versions/1/a.onnx", b"x")
        assert len(sent) == 1

    def test_retried_write_that_had_landed_is_not_a_conflict(self, s3_bucket):
        # The first attempt reaches S3 but its answer is lost (a 500 instead); the retry then
        # fails its condition (412). Both primitives recognise their own bytes.
        store = open_store(f"s3://{s3_bucket}/p", S3Settings.from_values({"max_attempts": 3}))
        _inject(store, [(500, "InternalError")], send_first=True)
        assert store.create("m/versions/1/a.onnx", b"x") is False  # "already there", same bytes
        token = store.replace_pointer("m/channels/edge.json", {"version": "1"}, None)
        _inject(store, [(500, "InternalError")], send_first=True)
        store.replace_pointer("m/channels/edge.json", {"version": "2"}, token)
        assert store.read_pointer("m/channels/edge.json").value == {"version": "2"}

    def test_bytes_not_matching_the_stored_checksum_are_refused(self, s3_bucket):
        from botocore.awsrequest import AWSResponse

        store = open_store(f"s3://{s3_bucket}/p")
        store.create("m/versions/1/a.onnx", b"model")
        wrong = base64.b64encode(hashlib.sha256(b"other").digest()).decode()

        def corrupted(request, **_):  # a body damaged in transit, with S3's checksum header
            return AWSResponse(request.url, 200, {"x-amz-checksum-sha256": wrong, "ETag": '"e"',
                                                  "Content-Length": "5"}, _Raw(b"model"))

        store.client.meta.events.register("before-send.s3.GetObject", corrupted)
        with pytest.raises(VerificationError, match="bytes received do not match the checksum S3 stored"):
            store.read("m/versions/1/a.onnx")

    def test_missing_bucket_and_unreachable_endpoint(self, s3_env):
        with pytest.raises(StoreError, match="bucket 'no-such-bucket' does not exist"):
            open_store("s3://no-such-bucket/p").create("m/versions/1/a.onnx", b"x")
        store = open_store("s3://bucket/p", S3Settings.from_values({"endpoint_url": "http://127.0.0.1:9", "max_attempts": 1}))
        with pytest.raises(StoreError, match="cannot read from S3"):
            store.read_pointer("m/channels/edge.json")


def _inject(store, failures: list[tuple[int, str]], send_first: bool = False) -> list[str]:
    """Answer the next PutObject requests with ``failures`` (status, code), then pass
    through. With ``send_first`` the first request reaches the server before failing."""
    from botocore.awsrequest import AWSResponse
    from botocore.httpsession import URLLib3Session

    sent: list[str] = []
    pending = list(failures)

    def before_send(request, **_):
        sent.append(request.url)
        if not pending:
            return None
        status, code = pending.pop(0)
        if send_first and len(sent) == 1:
            URLLib3Session().send(request)
        body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
        return AWSResponse(request.url, status, {"Content-Type": "application/xml"}, _Raw(body))

    store.client.meta.events.register("before-send.s3.PutObject", before_send)
    return sent


class _Raw:
    """The raw body of a fabricated botocore response."""

    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_):
        yield self.body

    def read(self, *_):
        body, self.body = self.body, b""
        return body
