"""Release keys and signed release metadata (TUF-style), on securesystemslib and tuf.

Trust does not come from the store: whoever can write the bucket can rewrite a digest.
What a device acts on is signed by release keys it already holds:

- the **trust root** (``root.json``): a TUF ``Root`` (tuf.api.metadata) naming the keys of
  each role and its threshold (t of n), with a version and an expiry. A new root is signed
  by a threshold of the old root's keys and of its own, and published in the store as
  ``root/<version>.root.json``; devices walk that chain, so keys rotate without touching a
  device. Roles used: ``root`` (signs roots), ``targets`` (signs version manifests) and
  ``timestamp`` (signs channel pointers, the short-lived metadata re-signed often).
- a **signed envelope** around each manifest and channel pointer:
  ``{"signed": {...}, "signatures": [{"keyid", "sig"}]}``, the signature taken over the
  canonical JSON of ``signed`` (sorted keys, no whitespace). ``signed._type`` says what it
  is (``onnxcast/manifest``, ``onnxcast/channel``), so one cannot stand in for the other.

Signers: a development key file (``onnxcast keys generate``: Ed25519, PKCS#8 PEM, mode
0600) or an AWS KMS asymmetric key (``awskms:<key id, ARN or alias>``, boto3 ``kms.sign``
through securesystemslib's AWSSigner), so the production key never sits on a worker.

Imported by devices: standard library, securesystemslib, tuf and cryptography only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from onnxcast.base import environment
from onnxcast.base.errors import ConfigError, RefusedError
from onnxcast.base.files import sha256_bytes
from onnxcast.base.untrusted import UntrustedInputError, loads_json, read_regular_file
from onnxcast.rollout.command import device_command, keys_command

SIGNING_KEY_ENV = "ONNXCAST_SIGNING_KEY"
TRUST_ENV = "ONNXCAST_TRUST"
ROOT_ROLE, MANIFEST_ROLE, POINTER_ROLE = "root", "targets", "timestamp"
MANIFEST_TYPE, POINTER_TYPE = "onnxcast/manifest", "onnxcast/channel"
PRIVATE_KEY_FILE, PUBLIC_KEY_FILE, ROOT_FILE = "signing.key", "signing.pub", "root.json"
KMS_PREFIX = "awskms:"
DEFAULT_ROOT_DAYS = 365
MAX_KEY_BYTES = 64 * 1024  # a PEM or public key file is under 1 KB


def canonical(signed: dict) -> bytes:
    """The bytes a signature covers: sorted keys, no whitespace, UTF-8."""
    return json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# --- signers ------------------------------------------------------------------------------

def load_signers(specs: str | Sequence[str] | None = None, *, option: str = "--signing-key",
                 from_env: bool = True) -> list:
    """Signers for ``specs`` (key file paths or ``awskms:KEY``; a comma-separated string is
    split), else from ``$ONNXCAST_SIGNING_KEY`` (unless not ``from_env``). ConfigError naming
    what is missing, with the running command's own option (``option``)."""
    if from_env and (specs is None or specs == [] or specs == ""):
        specs = environment.get(SIGNING_KEY_ENV) or ""
    items = [] if specs is None else [specs] if isinstance(specs, str) else list(specs)
    names = [s.strip() for item in items for s in str(item).split(",") if s.strip()]
    if not names:
        source = f"set {SIGNING_KEY_ENV} or pass {option}" if from_env else f"pass {option}"
        raise ConfigError(f"no signing key: {source} (a key file from '{keys_command('generate --out DIR')}', "
                          "or awskms:<key id>)")
    return [load_signer(name) for name in dict.fromkeys(names)]


def load_signer(spec: str):
    """One signer: ``awskms:<key id|ARN|alias>`` or the path of a PEM private key file."""
    if spec.startswith(KMS_PREFIX):
        return kms_signer(spec[len(KMS_PREFIX):])
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    path = Path(spec).expanduser()
    try:  # a regular file of a few KB: --signing-key /dev/zero or a FIFO must not hang a writer
        data = read_regular_file(path, what="signing key", limit=MAX_KEY_BYTES)
    except UntrustedInputError as exc:
        raise ConfigError(f"{exc}; cannot read the signing key") from None
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        # Never echo the file: it may be a key in another format.
        raise ConfigError(f"{path}: not an unencrypted PEM private key") from None
    return CryptoSigner(key)


def kms_signer(key_id: str):
    """A signer that signs with AWS KMS (``kms:Sign``); the private key never leaves KMS."""
    from botocore.exceptions import BotoCoreError, ClientError
    from securesystemslib.signer import AWSSigner

    try:
        uri, public_key = AWSSigner.import_(key_id)
        return AWSSigner.from_priv_key_uri(uri, public_key)
    except (ClientError, BotoCoreError) as exc:
        raise ConfigError(f"{KMS_PREFIX}{key_id}: cannot use the KMS key ({exc})") from None
    except Exception as exc:  # securesystemslib wraps boto errors in its own types
        raise ConfigError(f"{KMS_PREFIX}{key_id}: cannot use the KMS key ({type(exc).__name__}: {exc})") from None


def public_key_of(signer) -> dict:
    """The public key as a securesystemslib key dict, with its ``keyid``."""
    key = signer.public_key
    return {"keyid": key.keyid, **key.to_dict()}


def read_public_key(path: str | Path):
    """An SSlibKey from a ``.pub`` file written by ``keys generate`` / ``keys kms-pub``."""
    from securesystemslib.signer import Key

    path = Path(path)
    try:
        value = loads_json(read_regular_file(path, what="public key", limit=MAX_KEY_BYTES), what=str(path))
    except UntrustedInputError as exc:
        raise ConfigError(f"{exc}; not a public key file") from None
    try:
        value.pop("keyid", None)  # recomputed: an id is only ever the hash of the key itself
        return Key.from_dict(_keyid(value), value)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a public key file ({type(exc).__name__})") from None


def write_public_key(path: str | Path, signer) -> Path:
    """Write the public key file (``signing.pub`` form) of ``signer``."""
    path = Path(path)
    path.write_text(json.dumps(public_key_of(signer), indent=2, sort_keys=True) + "\n")
    return path


def generate_key(out: str | Path, *, root_days: int = DEFAULT_ROOT_DAYS) -> dict[str, Path]:
    """A development release key: ``signing.key`` (Ed25519, PKCS#8 PEM, mode 0600),
    ``signing.pub`` and ``root.json`` (a trust root where this one key holds every role,
    threshold 1). Refuses to overwrite an existing key."""
    from securesystemslib.signer import CryptoSigner

    out = Path(out)
    private, public, root_file = out / PRIVATE_KEY_FILE, out / PUBLIC_KEY_FILE, out / ROOT_FILE
    if private.exists():
        raise ConfigError(f"{private}: a key is already there; refusing to overwrite it")
    out.mkdir(parents=True, exist_ok=True)
    signer = CryptoSigner.generate_ed25519()
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(signer.private_bytes)
    os.chmod(private, 0o600)  # whatever the umask
    write_public_key(public, signer)
    root = make_root([signer.public_key], [signer.public_key], expires_days=root_days)
    root_file.write_bytes(sign_root(root, [signer]))
    return {"private": private, "public": public, "root": root_file}


def development_key(folder: str | Path) -> tuple[Path, bool]:
    """The development key in ``folder`` (``signing.key``, ``root.json``), made if missing:
    for the embedded one-machine mode only. Returns (private key path, created)."""
    folder = Path(folder)
    private = folder / PRIVATE_KEY_FILE
    if private.exists():
        return private, False
    try:
        generate_key(folder)
    except ConfigError:  # a concurrent task made it first
        pass
    return private, True


# --- roots --------------------------------------------------------------------------------

def make_root(root_keys: Sequence, release_keys: Sequence, *, root_threshold: int = 1,
              release_threshold: int = 1, version: int = 1, expires_days: int = DEFAULT_ROOT_DAYS,
              pointer_keys: Sequence | None = None, pointer_threshold: int | None = None):
    """A TUF Root: ``root`` keys sign roots, ``release_keys`` sign manifests (``targets``)
    and, unless ``pointer_keys`` are given, channel pointers (``timestamp``) too."""
    from tuf.api.metadata import Metadata, Role, Root

    pointer_keys = list(pointer_keys) if pointer_keys else list(release_keys)
    pointer_threshold = pointer_threshold or release_threshold
    for name, keys, threshold in (("root", root_keys, root_threshold), ("release", release_keys, release_threshold),
                                  ("pointer", pointer_keys, pointer_threshold)):
        if not 1 <= threshold <= len({k.keyid for k in keys}):
            raise ConfigError(f"{name} threshold {threshold} needs 1..{len({k.keyid for k in keys})} distinct keys")
    if expires_days < 1:
        raise ConfigError(f"root expiry must be at least 1 day, got {expires_days}")
    keys = {k.keyid: k for k in [*root_keys, *release_keys, *pointer_keys]}
    roles = {
        ROOT_ROLE: Role([k.keyid for k in root_keys], root_threshold),
        MANIFEST_ROLE: Role([k.keyid for k in release_keys], release_threshold),
        POINTER_ROLE: Role([k.keyid for k in pointer_keys], pointer_threshold),
        "snapshot": Role([k.keyid for k in release_keys], release_threshold),  # unused; TUF requires it
    }
    root = Root(version=version, expires=_days_from_now(expires_days), keys=keys, roles=roles,
                consistent_snapshot=False)
    return Metadata(root)


def sign_root(root, signers: Sequence) -> bytes:
    """Sign ``root`` (tuf Metadata[Root]) with every signer; its JSON bytes."""
    from tuf.api.serialization.json import JSONSerializer

    for signer in signers:
        root.sign(signer, append=True)
    return root.to_bytes(JSONSerializer(compact=False))


def signers_root(signers: Sequence):
    """A trust root held in memory that trusts exactly ``signers`` (any one of them): for a
    writer that checks what it just signed, as a device would, without a root file."""
    keys = [s.public_key for s in signers]
    return make_root(keys, keys, expires_days=1)


def parse_root(data: bytes, where: str):
    """A Metadata[Root] from bytes; RefusedError when it is not one."""
    from tuf.api.metadata import Metadata, Root

    try:  # bounded size and depth first: tuf's json.loads recurses on deep nesting
        loads_json(data, what=where)
    except UntrustedInputError as exc:
        raise RefusedError(f"{exc}; not a trust root, refusing it") from None
    try:
        md = Metadata.from_bytes(data)
    except Exception as exc:  # tuf raises DeserializationError and friends
        raise RefusedError(f"{where}: not a trust root ({type(exc).__name__}); refusing it") from None
    if not isinstance(md.signed, Root):
        raise RefusedError(f"{where}: is {md.signed.type!r} metadata, not a trust root; refusing it")
    return md


def verify_self_signed(root, where: str) -> None:
    """``root`` carries a threshold of signatures of its own root keys."""
    _verify_root_with(root, root, where)


def verify_next_root(trusted, new, where: str) -> None:
    """TUF root rotation: ``new`` is version trusted+1, signed by a threshold of the
    trusted root's keys and of its own."""
    if new.signed.version != trusted.signed.version + 1:
        raise RefusedError(f"{where}: root version {new.signed.version}, expected {trusted.signed.version + 1}; "
                           "refusing it")
    _verify_root_with(trusted, new, where, "the trusted root's")
    _verify_root_with(new, new, where, "its own")


def _verify_root_with(trusted, new, where: str, whose: str = "its own") -> None:
    from tuf.api.serialization.json import CanonicalJSONSerializer

    payload = CanonicalJSONSerializer().serialize(new.signed)
    result = trusted.signed.get_verification_result(ROOT_ROLE, payload, new.signatures)
    if not result.verified:
        raise RefusedError(f"{where}: root version {new.signed.version} is signed by {len(result.signed)} of the "
                           f"{trusted.signed.roles[ROOT_ROLE].threshold} root key(s) {whose} threshold needs; "
                           "refusing it")


def check_root_fresh(root, where: str, now: datetime | None = None) -> None:
    if root.signed.is_expired(now or datetime.now(UTC)):
        raise RefusedError(f"{where}: trust root version {root.signed.version} expired at "
                           f"{_iso(root.signed.expires)}; install a newer root ('{device_command('trust')}')")


# --- envelopes ----------------------------------------------------------------------------

def sign_envelope(signed: dict, signers: Sequence) -> dict:
    """``{"signed": signed, "signatures": [...]}``, one signature per signer."""
    payload = canonical(signed)
    signatures = []
    for signer in signers:
        sig = signer.sign(payload)
        signatures.append({"keyid": sig.keyid, "sig": sig.signature})
    return {"signed": signed, "signatures": signatures}


def verify_envelope(root, role: str, envelope: Any, expected_type: str, where: str) -> dict:
    """The ``signed`` part of ``envelope`` if a threshold of ``role``'s keys in the trusted
    ``root`` signed it and its ``_type`` is ``expected_type``; RefusedError otherwise."""
    from securesystemslib.signer import Signature

    if not isinstance(envelope, dict) or not isinstance(envelope.get("signed"), dict):
        raise RefusedError(f"{where}: not signed metadata (no 'signed' object); refusing it")
    raw = envelope.get("signatures")
    signatures = {}
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict) and isinstance(item.get("keyid"), str) and isinstance(item.get("sig"), str):
                signatures[item["keyid"]] = Signature(item["keyid"], item["sig"])
    signed = envelope["signed"]
    result = root.signed.get_verification_result(role, canonical(signed), signatures)
    if not result.verified:
        threshold = root.signed.roles[role].threshold
        raise RefusedError(f"{where}: signed by {len(result.signed)} of the {threshold} release key(s) "
                           f"required; refusing it")
    if signed.get("_type") != expected_type:
        raise RefusedError(f"{where}: signed metadata of type {signed.get('_type')!r}, expected "
                           f"{expected_type!r}; refusing it")
    return signed


def expiry(days: float) -> str:
    return _iso(_days_from_now(days))


def parse_time(value: Any, where: str) -> datetime:
    try:
        return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise RefusedError(f"{where}: expiry {value!r} is not a UTC time; refusing it") from None


def _days_from_now(days: float) -> datetime:
    return (datetime.now(UTC) + timedelta(days=days)).replace(microsecond=0)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _keyid(value: dict) -> str:
    from securesystemslib.formats import encode_canonical

    return sha256_bytes(encode_canonical(value).encode())
