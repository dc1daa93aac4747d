"""Trusted rollout: someone who can write the rollout store (any Airflow worker) but holds
no release key cannot make a device install or keep anything the release keys did not
sign. Every attack on a local store and on a real S3 server (SeaweedFS): refused on one
line, the old model still served, no traceback."""

from __future__ import annotations

import io
import json
import os
import time

import numpy as np
import pytest
from rollout_support import one_error_line, raw_get, raw_put

from onnxcast import cli
from onnxcast.base.errors import ConfigError, RefusedError, StoreError
from onnxcast.base.files import sha256_bytes
from onnxcast.rollout.edge import predict, pull
from onnxcast.rollout.promote import promote, refresh
from onnxcast.rollout.signing import (
    generate_key,
    load_signer,
    make_root,
    read_public_key,
    sign_envelope,
    sign_root,
)
from onnxcast.rollout.store import check_name, dump_json, open_store

EDGE = "m/channels/edge.json"


@pytest.fixture(params=["local", "seaweedfs"])
def store(request, tmp_path):
    """A rollout store URI: a local folder, and a bucket on a real SeaweedFS S3 server."""
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("seaweedfs_store_uri")


@pytest.fixture
def history_csv(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "history.csv"
    lines = ["ds,y,x1"] + [f"{i},{100 + 10 * np.sin(i / 3) + rng.normal():.4f},{5 + rng.normal():.4f}"
                           for i in range(40)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def device(tmp_path, history_csv):
    """A device folder and a check that it still serves the forecasts it served before."""
    dest = tmp_path / "device"

    class Device:
        path = dest
        forecasts: np.ndarray | None = None

        def remember(self):
            self.forecasts = predict(dest, history_csv, out=io.StringIO()).forecast

        def still_serves(self, version: str):
            assert (dest / "current").readlink().as_posix() == f"versions/{version}"
            assert np.array_equal(predict(dest, history_csv, out=io.StringIO()).forecast, self.forecasts)

    return Device()


def keys(tmp_path, name: str) -> dict:
    return generate_key(tmp_path / "keys" / name)






def edge_cli(store: str, dest, *extra: str) -> int:
    return cli.main(["edge", "pull", "--store", store, "--model", "m", "--channel", "edge", "--dest", str(dest),
                     *extra])


def without_writer_checks(monkeypatch) -> None:
    """Write as a store writer with its own tools would: no check against the published root."""
    from onnxcast.rollout.promote import PublishedRoot

    monkeypatch.setattr(PublishedRoot, "read", classmethod(lambda cls, store, *signers: cls(None, None)))




class TestStoreWriterWithoutKeys:
    def test_swapped_model_with_rewritten_digests_is_refused(self, store, make_run, tiny_onnx, device, capsys):
        """The first attack of the issue: another valid model, digests rewritten in the manifest
        and the pointer. The signatures no longer cover what they sign."""
        promote(make_run("a"), store, "m", "edge", version="1")
        pull(store, "m", "edge", device.path)
        device.remember()
        promote(make_run("b"), store, "m", "edge", version="2")
        evil = make_run("evil").parent / "models/lstm/onnx/fp32-opt.onnx"
        evil_bytes = evil.read_bytes()
        raw_put(store, "m/versions/2/lstm-fp32-opt.onnx", evil_bytes)
        manifest = json.loads(raw_get(store, "m/versions/2/manifest.json"))
        entry = manifest["signed"]["artifacts"]["lstm-fp32-opt.onnx"]
        entry.update(sha256=sha256_bytes(evil_bytes), size_bytes=len(evil_bytes))
        manifest_bytes = dump_json(manifest)
        raw_put(store, "m/versions/2/manifest.json", manifest_bytes)
        pointer = json.loads(raw_get(store, EDGE))
        pointer["signed"].update(sha256=sha256_bytes(evil_bytes), length=len(evil_bytes),
                                 manifest={"sha256": sha256_bytes(manifest_bytes), "length": len(manifest_bytes)},
                                 manifest_sha256=sha256_bytes(manifest_bytes))
        raw_put(store, EDGE, dump_json(pointer))

        assert edge_cli(store, device.path) == 1
        one_error_line(capsys, "channels/edge.json: signed by 0 of the 1 release key(s) required; refusing it "
                               "(still serving version 1)")
        device.still_serves("1")

    def test_swapped_model_under_an_untouched_pointer_is_refused(self, store, make_run, device):
        promote(make_run("a"), store, "m", "edge", version="1")
        pull(store, "m", "edge", device.path)
        device.remember()
        promote(make_run("b"), store, "m", "edge", version="2")
        manifest = json.loads(raw_get(store, "m/versions/2/manifest.json"))
        manifest["signed"]["created_by"] = "x" * len(manifest["signed"]["created_by"])  # same length, other bytes
        raw_put(store, "m/versions/2/manifest.json", dump_json(manifest))
        with pytest.raises(RefusedError, match=r"manifest.json: sha256 \w+ \(\d+ bytes\) does not match the signed"):
            pull(store, "m", "edge", device.path)
        device.still_serves("1")

    def test_unsigned_pointer_is_refused(self, store, make_run, device, capsys):
        promote(make_run("a"), store, "m", "edge", version="1")
        pull(store, "m", "edge", device.path)
        device.remember()
        promote(make_run("b"), store, "m", "edge", version="2")
        raw_put(store, EDGE, dump_json(json.loads(raw_get(store, EDGE))["signed"]))  # signatures stripped
        assert edge_cli(store, device.path) == 1
        one_error_line(capsys, "channels/edge.json: not signed metadata (no 'signed' object); refusing it")
        device.still_serves("1")

    def test_forged_pointer_signed_by_another_key_is_refused(self, store, make_run, device, tmp_path, capsys,
                                                              monkeypatch):
        promote(make_run("a"), store, "m", "edge", version="1")
        pull(store, "m", "edge", device.path)
        device.remember()
        attacker = keys(tmp_path, "attacker")
        # The attacker promotes a whole version with their own key: every digest is right
        # (with a writer of their own: onnxcast's refuses a pointer its keys did not sign).
        without_writer_checks(monkeypatch)
        promote(make_run("b"), store, "m", "edge", version="2", signers=[attacker["private"]])
        assert edge_cli(store, device.path) == 1
        one_error_line(capsys, "channels/edge.json: signed by 0 of the 1 release key(s) required; refusing it")
        device.still_serves("1")

    def test_replayed_older_pointer_is_refused_and_watch_reports_it(self, store, make_run, device, capsys):
        """The second attack: the channel pointed back at an older genuine version, its
        history gone (an older, validly signed pointer replayed)."""
        promote(make_run("a"), store, "m", "edge", version="1")
        old_pointer = raw_get(store, EDGE)
        promote(make_run("b"), store, "m", "edge", version="2")
        pull(store, "m", "edge", device.path)
        device.remember()
        raw_put(store, EDGE, old_pointer)
        assert edge_cli(store, device.path, "--watch", "--interval", "0", "--max-polls", "2") == 1
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 2
        for n, line in enumerate(lines, start=1):
            assert line.startswith(f"poll {n}: refused, keeping the current model: ")
            assert "is older than" in line and "(a replayed pointer); refusing it (still serving version 2)" in line
        device.still_serves("2")

    def test_expired_pointer_is_refused(self, store, make_run, device, capsys):
        """Freeze: the store keeps serving a pointer (the writer stopped signing, or an
        attacker holds the old one back); once it expires, the device stops trusting it."""
        # 6 s: the first pull must come before the expiry even on a loaded machine (2 s did not)
        promote(make_run("a"), store, "m", "edge", version="1", expires_days=6 / 86400)
        expired_by = time.monotonic() + 6.3  # the expiry was signed before promote returned
        pull(store, "m", "edge", device.path)
        device.remember()
        time.sleep(max(0.0, expired_by - time.monotonic()))
        assert edge_cli(store, device.path) == 1
        err = one_error_line(capsys, "channels/edge.json: expired at ")
        assert "(a frozen or stale channel); refusing it (still serving version 1)" in err
        device.still_serves("1")
        refresh(store, "m", "edge")  # the release keys re-sign: a new counter and expiry, same version
        assert pull(store, "m", "edge", device.path).changed is False

    def test_file_longer_than_its_signed_length_is_refused_without_reading_it_all(self, store, make_run, device):
        promote(make_run("a"), store, "m", "edge", version="1")
        pull(store, "m", "edge", device.path)
        device.remember()
        promote(make_run("b"), store, "m", "edge", version="2")
        genuine = raw_get(store, "m/versions/2/lstm-fp32-opt.onnx")
        raw_put(store, "m/versions/2/lstm-fp32-opt.onnx", genuine + b"\0" * (8 << 20))
        reads = []
        original = type(open_store(store)).read

        def spy(self, key, max_bytes=None):
            data = original(self, key, max_bytes)
            reads.append((key, max_bytes, None if data is None else len(data)))
            return data

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(type(open_store(store)), "read", spy)
            with pytest.raises(RefusedError, match=rf"lstm-fp32-opt.onnx: longer than its signed length of "
                                                   rf"{len(genuine)} bytes \(stopped reading\); refusing version 2"):
                pull(store, "m", "edge", device.path)
        assert ("m/versions/2/lstm-fp32-opt.onnx", len(genuine), len(genuine) + 1) in reads
        device.still_serves("1")

    def test_forged_root_is_refused(self, store, make_run, device, tmp_path, capsys):
        promote(make_run("a"), store, "m", "edge", version="1")
        pull(store, "m", "edge", device.path)
        device.remember()
        attacker = keys(tmp_path, "attacker")
        raw_put(store, "root/2.root.json", (attacker["root"].read_bytes()).replace(b'"version": 1', b'"version": 2'))
        pointer = json.loads(raw_get(store, EDGE))
        pointer["signed"]["root_version"] = 2  # unverified hint: it leads the device to the forged root
        raw_put(store, EDGE, dump_json(pointer))
        assert edge_cli(store, device.path) == 1
        one_error_line(capsys, "root/2.root.json: root version 2 is signed by 0 of the 1 root key(s)")
        device.still_serves("1")


    def test_removed_root_named_by_the_pointer_is_refused(self, store, make_run, device, tmp_path, capsys):
        """After a rotation, deleting the new root does not make the device accept what the
        new keys signed without it, nor what the old keys sign."""
        old, new = keys(tmp_path, "old"), keys(tmp_path, "new")
        promote(make_run("a"), store, "m", "edge", version="1", signers=[old["private"]])
        pull(store, "m", "edge", device.path, trust=old["root"])
        device.remember()
        root2 = tmp_path / "root2.json"
        assert cli.main(["keys", "root", "--out", str(root2), "--previous", str(old["root"]),
                         "--root-key", str(new["public"]), "--release-key", str(new["public"]),
                         "--sign-with", str(old["private"]), "--sign-with", str(new["private"])]) == 0
        assert cli.main(["keys", "publish-root", "--store", store, "--root", str(old["root"])]) == 0
        assert cli.main(["keys", "publish-root", "--store", store, "--root", str(root2)]) == 0
        promote(make_run("b"), store, "m", "edge", version="2", signers=[new["private"]])
        assert json.loads(raw_get(store, EDGE))["signed"]["root_version"] == 2
        if store.startswith("s3://"):
            s3 = open_store(store)
            s3.client.delete_object(Bucket=s3.bucket, Key=f"{s3.prefix}/root/2.root.json")
        else:
            (open_store(store).root / "root/2.root.json").unlink()
        capsys.readouterr()
        assert edge_cli(store, device.path, "--trust", str(old["root"])) == 1
        one_error_line(capsys, "root/2.root.json: missing, though the channel pointer names root version 2")
        device.still_serves("1")


class TestRollbackRecords:
    def test_signed_rollback_is_accepted_and_a_forged_one_is_not(self, store, make_run, device, capsys):
        promote(make_run("a"), store, "m", "edge", version="1")
        pull(store, "m", "edge", device.path)
        promote(make_run("b"), store, "m", "edge", version="2")
        pull(store, "m", "edge", device.path)
        device.remember()
        assert cli.main(["rollback", "--store", store, "--model", "m", "--channel", "edge", "--reason", "bad"]) == 0
        assert "rolled back from 2 to 1" in capsys.readouterr().out
        result = pull(store, "m", "edge", device.path)
        assert (result.changed, result.version, result.previous) == (True, "1", "2")
        assert refresh(store, "m", "edge")["rollback"]["version"] == "1"  # the record survives a re-sign
        assert pull(store, "m", "edge", device.path).changed is False
        promote(make_run("c"), store, "m", "edge", version="3")
        assert pull(store, "m", "edge", device.path).version == "3"

    def test_going_back_without_a_rollback_record_is_refused(self, store, make_run, device):
        """Even a release key promoting an old version again cannot move devices back
        silently: going back needs the rollback record that `onnxcast rollback` signs."""
        report_a = make_run("a")
        promote(report_a, store, "m", "edge", version="1")
        pull(store, "m", "edge", device.path)
        promote(make_run("b"), store, "m", "edge", version="2")
        pull(store, "m", "edge", device.path)
        device.remember()
        promote(report_a, store, "m", "edge", version="1")  # a promotion, not a rollback
        with pytest.raises(RefusedError, match="goes back from version 2 to 1, which this device verified before, "
                                               "without a signed rollback record"):
            pull(store, "m", "edge", device.path)
        device.still_serves("2")


class TestKeys:
    def test_threshold_two_of_three_with_one_key_compromised(self, store, make_run, device, tmp_path, capsys,
                                                              monkeypatch):
        k1, k2, k3 = (keys(tmp_path, n) for n in ("k1", "k2", "k3"))
        public = [read_public_key(k["public"]) for k in (k1, k2, k3)]
        signers = [load_signer(str(k["private"])) for k in (k1, k2, k3)]
        root_file = tmp_path / "root-2of3.json"
        root_file.write_bytes(sign_root(make_root(public, public, root_threshold=2, release_threshold=2), signers[:2]))
        promote(make_run("a"), store, "m", "edge", version="1", signers=signers[:2])
        pull(store, "m", "edge", device.path, trust=root_file)
        device.remember()
        # k3 is stolen: alone it signs a complete new version and its pointer (its own writer).
        without_writer_checks(monkeypatch)
        promote(make_run("evil"), store, "m", "edge", version="2", signers=[signers[2]])
        assert edge_cli(store, device.path, "--trust", str(root_file)) == 1
        one_error_line(capsys, "channels/edge.json: signed by 1 of the 2 release key(s) required; refusing it")
        device.still_serves("1")
        # A pointer with k3's signature twice still counts one key.
        pointer = json.loads(raw_get(store, EDGE))
        pointer["signatures"] = pointer["signatures"] * 2
        raw_put(store, EDGE, dump_json(pointer))
        with pytest.raises(RefusedError, match="signed by 1 of the 2"):
            pull(store, "m", "edge", device.path, trust=root_file)

    def test_rotation_reaches_devices_and_the_revoked_key_is_refused(self, store, make_run, device, tmp_path, capsys,
                                                                     monkeypatch):
        old, new = keys(tmp_path, "old"), keys(tmp_path, "new")
        promote(make_run("a"), store, "m", "edge", version="1", signers=[old["private"]])
        assert cli.main(["edge", "trust", "--dest", str(device.path), "--root", str(old["root"])]) == 0
        capsys.readouterr()
        assert pull(store, "m", "edge", device.path, trust=None).version == "1"
        device.remember()
        # Rotate: root 2 names only the new key, signed by the old root key and the new one.
        root2 = tmp_path / "root2.json"
        assert cli.main(["keys", "root", "--out", str(root2), "--previous", str(old["root"]),
                         "--root-key", str(new["public"]), "--release-key", str(new["public"]),
                         "--sign-with", str(old["private"]), "--sign-with", str(new["private"])]) == 0
        assert cli.main(["keys", "publish-root", "--store", store, "--root", str(old["root"])]) == 0
        assert cli.main(["keys", "publish-root", "--store", store, "--root", str(root2)]) == 0
        capsys.readouterr()
        promote(make_run("b"), store, "m", "edge", version="2", signers=[new["private"]])
        monkey_env = os.environ.pop("ONNXCAST_TRUST")  # the device trusts what it holds, nothing else
        try:
            assert pull(store, "m", "edge", device.path).version == "2"
            assert json.loads((device.path / "trust/root.json").read_text())["signed"]["version"] == 2
            device.remember()
            # onnxcast's own writer refuses to sign with the revoked key (it checks the published root)...
            assert cli.main(["promote", "--report", str(make_run("evil")), "--store", store, "--model", "m",
                             "--channel", "edge", "--version", "3", "--signing-key", str(old["private"])]) == 2
            one_error_line(capsys, "are 0 of the 1 key(s) trust root version 2 requires to sign channel pointers")
            # ...and a writer without that check (an attacker's) signs a new version: devices refuse it.
            without_writer_checks(monkeypatch)
            promote(make_run("evil"), store, "m", "edge", version="3", signers=[old["private"]])
            assert edge_cli(store, device.path) == 1
            one_error_line(capsys, "channels/edge.json: signed by 0 of the 1 release key(s) required")
            device.still_serves("2")
        finally:
            os.environ["ONNXCAST_TRUST"] = monkey_env

    def test_keys_generate_writes_a_private_key_only_its_owner_reads(self, tmp_path, capsys):
        assert cli.main(["keys", "generate", "--out", str(tmp_path / "k")]) == 0
        out = capsys.readouterr().out
        assert oct((tmp_path / "k/signing.key").stat().st_mode & 0o777) == "0o600"
        assert (tmp_path / "k/signing.pub").exists() and (tmp_path / "k/root.json").exists()
        assert "PRIVATE KEY" not in out and (tmp_path / "k/signing.key").read_text() not in out
        assert cli.main(["keys", "generate", "--out", str(tmp_path / "k")]) == 2
        one_error_line(capsys, "a key is already there; refusing to overwrite it")

    def test_missing_key_and_trust_are_clear_errors(self, tmp_path, make_run, monkeypatch, capsys):
        monkeypatch.delenv("ONNXCAST_SIGNING_KEY")
        monkeypatch.delenv("ONNXCAST_TRUST")
        store = str(tmp_path / "store")
        assert cli.main(["promote", "--report", str(make_run("a")), "--store", store, "--model", "m",
                         "--channel", "edge"]) == 2
        one_error_line(capsys, "no signing key: set ONNXCAST_SIGNING_KEY or pass --signing-key")
        assert not (tmp_path / "store").exists()
        assert edge_cli(store, tmp_path / "device") == 2
        one_error_line(capsys, "no trust root; pass --trust FILE, set ONNXCAST_TRUST")


class TestPathsAndNames:
    def test_symlinked_version_folder_is_not_followed(self, tmp_path, make_run):
        store = tmp_path / "store"
        outside = tmp_path / "outside"
        outside.mkdir()
        (store / "m" / "versions").mkdir(parents=True)
        (store / "m" / "versions" / "1").symlink_to(outside)
        with pytest.raises(StoreError, match="'1' is a symlink or not a folder; the store never follows symlinks"):
            promote(make_run("a"), str(store), "m", "edge", version="1")
        assert list(outside.iterdir()) == []
        with pytest.raises(StoreError, match="never follows symlinks"):  # nor reads through it
            open_store(str(store)).read("m/versions/1/manifest.json")

    def test_symlinked_file_is_not_read(self, tmp_path):
        store = open_store(str(tmp_path / "store"))
        store.create("m/versions/1/manifest.json", b"{}")
        (tmp_path / "secret").write_bytes(b"secret")
        os.symlink(tmp_path / "secret", tmp_path / "store/m/versions/1/x.onnx")
        with pytest.raises(StoreError, match="it is a symlink; the store never follows symlinks"):
            store.read("m/versions/1/x.onnx")

    @pytest.mark.parametrize("name", ["7\n", "7\r", "a\nb", " 7", "7/"])
    def test_names_match_in_full(self, name):
        with pytest.raises(ConfigError, match="invalid version name"):
            check_name("version", name)

    def test_pointer_of_another_channel_is_refused(self, tmp_path, make_run, device):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "edge,cloud", version="1")
        pull(store, "m", "edge", device.path)
        device.remember()
        raw_put(store, EDGE, raw_get(store, "m/channels/cloud.json"))
        with pytest.raises(RefusedError, match="signed for 'm' channel 'cloud', not 'm' channel 'edge'"):
            pull(store, "m", "edge", device.path)
        device.still_serves("1")


def test_sign_envelope_covers_every_field(release_key):
    signer = load_signer(str(release_key["private"]))
    envelope = sign_envelope({"_type": "onnxcast/channel", "a": [1, 2.5, "x"]}, [signer])
    assert envelope["signatures"][0]["keyid"] == signer.public_key.keyid


@pytest.fixture
def kms_key_id(monkeypatch):
    """An ECC_NIST_P256 SIGN_VERIFY key in moto's KMS (in process). moto signs a DIGEST
    message as if it were the raw message (hashing it again); real KMS signs the digest,
    which securesystemslib's AWSSigner sends, so the fixture teaches moto that."""
    import base64
    import json as _json

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, utils
    from moto import mock_aws
    from moto.kms.responses import KmsResponse

    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    original = KmsResponse.sign

    def sign(self):
        if self._get_param("MessageType") != "DIGEST":
            return original(self)
        key = self.kms_backend.describe_key(self._get_param("KeyId"))
        signature = key.private_key.private_key.sign(self._get_param("Message"),
                                                     ec.ECDSA(utils.Prehashed(hashes.SHA256())))
        return _json.dumps({"KeyId": key.arn, "Signature": base64.b64encode(signature).decode(),
                            "SigningAlgorithm": self._get_param("SigningAlgorithm")})

    monkeypatch.setattr(KmsResponse, "sign", sign)
    with mock_aws():
        import boto3

        key = boto3.client("kms").create_key(KeyUsage="SIGN_VERIFY", KeySpec="ECC_NIST_P256")
        yield key["KeyMetadata"]["KeyId"]


def test_kms_signed_release_is_installed_and_the_worker_holds_no_key(kms_key_id, tmp_path, make_run, device, capsys,
                                                                      monkeypatch):
    """Production path: promote signs through KMS (kms:Sign), the root names the KMS public
    key (onnxcast keys kms-pub), and a device verifies with it."""
    store = str(tmp_path / "store")
    assert cli.main(["keys", "kms-pub", "--key-id", kms_key_id, "--out", str(tmp_path / "kms.pub")]) == 0
    admin = keys(tmp_path, "root-admin")  # an offline root key; the KMS key signs releases
    assert cli.main(["keys", "root", "--out", str(tmp_path / "root.json"), "--root-key", str(admin["public"]),
                     "--release-key", str(tmp_path / "kms.pub"), "--sign-with", str(admin["private"])]) == 0
    capsys.readouterr()
    os.environ.pop("ONNXCAST_SIGNING_KEY")  # restored by the autouse fixture's monkeypatch
    assert cli.main(["promote", "--report", str(make_run("a")), "--store", store, "--model", "m",
                     "--channel", "edge", "--version", "1", "--signing-key", f"awskms:{kms_key_id}"]) == 0
    assert edge_cli(store, device.path, "--trust", str(tmp_path / "root.json")) == 0
    assert "installed version 1" in capsys.readouterr().out
    # The development key (not in this root) cannot stand in for KMS (written without the
    # writer's checks, which refuse a pointer the development key did not sign).
    without_writer_checks(monkeypatch)
    promote(make_run("b"), store, "m", "edge", version="2", signers=[admin["private"]])
    assert edge_cli(store, device.path, "--trust", str(tmp_path / "root.json")) == 1
    one_error_line(capsys, "signed by 0 of the 1 release key(s) required")
