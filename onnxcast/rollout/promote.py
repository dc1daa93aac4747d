"""Promote a validated pipeline run to rollout channels, and roll channels back.

Promotion is ordered so that a crash at any point leaves either the old pointer or a
complete new version, never a pointer to something missing:

1. check the report and every artifact it selects (sha256 against the report, the ONNX
   checks a device runs), and read the channel pointers (the values to move from);
2. write the artifacts, then ``manifest.json`` (all write-once: a rerun skips what is
   already there with the same bytes and refuses different bytes);
3. read the version back and verify every artifact against the manifest;
4. only then move each pointer by compare-and-swap, appending to its history.

Both the manifest and the channel pointers are signed envelopes
(``{"signed": {...}, "signatures": [...]}``, onnxcast.rollout.signing) made with the
release keys (``signers``: key files or AWS KMS). The manifest's ``signed`` part names
every artifact with its ``sha256`` and ``size_bytes`` (the signed length). A channel
pointer (``<model>/channels/<channel>.json``) signs ``model``, ``channel``, ``version``,
``artifact``, ``family``, ``variant``, the artifact's ``sha256`` and ``length``, the
manifest's ``{sha256, length}``, a ``counter`` that only grows, an ``expires`` time (re-sign
with :func:`refresh` before it passes), the last ``action`` (promote|rollback|refresh), a
``rollback`` record while the channel serves a version it was rolled back to, and the
``history``: one entry per move (``action``, ``version``, ``from_version``, ``by``, ``at``,
``reason``).

A version holds the variants of every channel the report selects, so promoting ``edge``
today and ``cloud`` tomorrow from one report lands on the same immutable version.
Versions are never deleted; rollback only moves a pointer.

Imported by Airflow operators at task run time: top-level imports stay light.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxcast.errors import (
    ConfigError,
    ConflictError,
    OnnxcastError,
    RefusedError,
    StoreError,
    VerificationError,
)
from onnxcast.rollout.signing import (
    MANIFEST_ROLE,
    MANIFEST_TYPE,
    POINTER_ROLE,
    POINTER_TYPE,
    expiry,
    load_signers,
    sign_envelope,
)
from onnxcast.rollout.store import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Pointer,
    RolloutStore,
    check_name,
    dump_json,
    open_store,
    sha256_hex,
    signed_part,
)
from onnxcast.untrusted import UntrustedInputError, loads_json

MAX_ROOT_BYTES = 1 << 20

REPORT = "report.json"
MANIFEST_FORMAT = 2  # 2: a signed envelope
POINTER_EXPIRES_ENV = "ONNXCAST_POINTER_EXPIRES_DAYS"
DEFAULT_POINTER_DAYS = 30.0
HISTORY_KEPT = 200  # pointer entries kept (a device reads at most 1 MiB of pointer)


class ReportError(OnnxcastError, ValueError):
    """The report is missing or unreadable, or does not hold what promotion needs."""


@dataclass(frozen=True)
class PromotionResult:
    """What a promotion did; ``changed`` is False for a no-op rerun."""

    model: str
    version: str
    store: str
    written: tuple[str, ...]
    skipped: tuple[str, ...]
    channels: dict[str, str] = field(default_factory=dict)  # channel -> "moved" | "unchanged"

    @property
    def changed(self) -> bool:
        return bool(self.written) or "moved" in self.channels.values()

    def as_xcom(self) -> dict:
        return {"model": self.model, "version": self.version, "store": self.store,
                "channels": dict(self.channels), "changed": self.changed}


@dataclass(frozen=True)
class RollbackResult:
    model: str
    channel: str
    version: str
    from_version: str
    changed: bool


def promote(report: str | Path, store: RolloutStore | str, model_name: str, channels: Sequence[str] | str,
            *, version: str | None = None, actor: str | None = None, reason: str = "",
            signers: Sequence | str | None = None, expires_days: float | None = None) -> PromotionResult:
    """Publish the run described by ``report`` (report.json or its folder) as an immutable
    version of ``model_name`` and move ``channels`` to it.

    The version id is ``version``, else the report's MLflow model version, else an id
    derived from the dataset and model hashes (so the same promotion twice is a no-op).
    ``signers`` are the release keys (signer objects, key files or ``awskms:`` URIs;
    default ``$ONNXCAST_SIGNING_KEY``); the pointer expires after ``expires_days``
    (default ``$ONNXCAST_POINTER_EXPIRES_DAYS`` or 30).
    Raises ReportError/ConfigError before writing anything when the input is wrong,
    ConflictError when a channel moved since it was read, VerificationError when what the
    store holds differs from what was written.
    """
    store = store if isinstance(store, RolloutStore) else open_store(store)
    check_name("model", model_name)
    signers = _signers(signers)
    days = pointer_days(expires_days)
    plan = plan_version(report, channels, version)
    actor = actor or default_actor()
    root = PublishedRoot.read(store)
    # The values to move from are read before anything is written: whoever moves a
    # channel during our upload wins, and we report a conflict instead of overwriting.
    pointers = {c: store.read_channel(model_name, c) for c in plan.channels_to_move}
    root.check_signers(signers, POINTER_ROLE, "channel pointers")

    written, skipped = [], []
    existing = store.read_manifest(model_name, plan.version)
    if existing is not None:
        _check_same_version(store, model_name, plan, existing)
    else:
        manifest = sign_envelope(plan.manifest(model_name, actor, reason), signers)
        key = store.version_key(model_name, plan.version)
        root.verify(manifest, MANIFEST_ROLE, MANIFEST_TYPE, store.url(key))  # before the first write
        for artifact in plan.artifacts:
            artifact_key = store.version_key(model_name, plan.version, artifact.name)
            (written if _write_once(store, artifact_key, artifact.data) else skipped).append(artifact.name)
        if not store.create(key, dump_json(manifest)):  # a concurrent twin wrote it first
            _check_same_version(store, model_name, plan, store.read_manifest(model_name, plan.version))
        else:
            written.append(MANIFEST)
    manifest, manifest_sha = verify_version(store, model_name, plan.version)

    moved = {}
    for channel in plan.channels_to_move:
        changed = _move_pointer(store, model_name, channel, plan.version, manifest, manifest_sha,
                                pointers[channel], action="promote", actor=actor, reason=reason,
                                signers=signers, days=days, root=root)
        moved[channel] = "moved" if changed else "unchanged"
    _publish_model_repositories(store, model_name, moved, signers)
    return PromotionResult(model_name, plan.version, store.uri, tuple(written), tuple(skipped), moved)


def rollback(store: RolloutStore | str, model_name: str, channel: str, *, to_version: str | None = None,
             actor: str | None = None, reason: str, signers: Sequence | str | None = None,
             expires_days: float | None = None) -> RollbackResult:
    """Move ``channel`` back to ``to_version``, or to the version it was promoted from,
    after verifying that version; record who, when and why in the pointer history. The
    new pointer carries a signed rollback record, which lets devices go back."""
    store = store if isinstance(store, RolloutStore) else open_store(store)
    if not reason or not reason.strip():
        raise ConfigError("a rollback needs a reason")
    signers = _signers(signers)
    days = pointer_days(expires_days)
    key = store.channel_key(model_name, channel)
    pointer = store.read_pointer(key)
    if pointer.value is None:
        raise StoreError(f"{store.url(key)}: no such channel for model {model_name!r}; nothing to roll back")
    current = _pointer_version(pointer.value, store.url(key))
    root = PublishedRoot.read(store)
    root.check_signers(signers, POINTER_ROLE, "channel pointers")
    target = check_name("version", to_version) if to_version else previous_version(pointer.value, store.url(key))
    if target == current:
        return RollbackResult(model_name, channel, target, current, False)
    manifest, manifest_sha = verify_version(store, model_name, target)
    if channel not in manifest.get("channels", {}):
        raise StoreError(f"{store.url(store.version_key(model_name, target))}: version {target} has no variant "
                         f"for channel {channel!r} (it has {sorted(manifest.get('channels', {}))})")
    _move_pointer(store, model_name, channel, target, manifest, manifest_sha, pointer,
                  action="rollback", actor=actor or default_actor(), reason=reason, signers=signers, days=days,
                  root=root)
    _publish_model_repositories(store, model_name, [channel], signers)
    return RollbackResult(model_name, channel, target, current, True)


def refresh(store: RolloutStore | str, model_name: str, channel: str, *, signers: Sequence | str | None = None,
            expires_days: float | None = None, actor: str | None = None) -> dict:
    """Re-sign ``channel``'s pointer with a higher counter and a new expiry, same version
    (TUF's timestamp role: devices refuse a pointer past its expiry, so a frozen store
    cannot keep them on an old version forever). Returns the new signed fields."""
    store = store if isinstance(store, RolloutStore) else open_store(store)
    signers = _signers(signers)
    days = pointer_days(expires_days)
    key = store.channel_key(model_name, channel)
    pointer = store.read_pointer(key)
    if pointer.value is None:
        raise StoreError(f"{store.url(key)}: no such channel for model {model_name!r}; nothing to refresh")
    version = _pointer_version(pointer.value, store.url(key))
    root = PublishedRoot.read(store)
    root.check_signers(signers, POINTER_ROLE, "channel pointers")
    manifest, manifest_sha = verify_version(store, model_name, version)
    value = _pointer_value(model_name, channel, version, manifest, manifest_sha,
                           _manifest_length(store, model_name, version), pointer.value,
                           action="refresh", actor=actor or default_actor(), history=_history(pointer.value),
                           rollback=pointer.value.get("rollback"), days=days, root_version=root.version)
    root.verify_manifest(store, model_name, version)
    envelope = sign_envelope(value, signers)
    root.verify(envelope, POINTER_ROLE, POINTER_TYPE, store.url(key))
    store.replace_pointer(key, envelope, pointer.token)
    return value


def latest_root_version(store: RolloutStore) -> int:
    """The newest trust root published in the store (``root/<n>.root.json``; 0 if none).
    Pointers name it, so devices fetch exactly the roots they need and never probe for a
    missing one (a device without s3:ListBucket gets 403, not 404, for a missing key)."""
    version, candidate = 0, 1
    while candidate <= 10_000:
        if store.read(store.root_key(candidate), 0) is not None:
            version = candidate
        elif candidate > 1:  # root 1 is often only installed on devices, never published
            break
        candidate += 1
    return version


def pointer_days(days: float | None) -> float:
    """How long a new pointer stays valid: ``days``, else ``$ONNXCAST_POINTER_EXPIRES_DAYS``, else 30."""
    if days is None:
        raw = os.environ.get(POINTER_EXPIRES_ENV)
        try:
            days = float(raw) if raw else DEFAULT_POINTER_DAYS
        except ValueError:
            raise ConfigError(f"{POINTER_EXPIRES_ENV}={raw!r}: expected a number of days") from None
    if not 0 < days <= 3660:
        raise ConfigError(f"pointer expiry must be between 0 and 3660 days, got {days}")
    return float(days)


def verify_version(store: RolloutStore, model_name: str, version: str) -> tuple[dict, str]:
    """Read a version back: its manifest and every artifact's sha256 and size. Returns the
    manifest and its sha256; StoreError if it is missing, VerificationError if it differs."""
    key = store.version_key(model_name, version)
    data = store.read_bounded(key, MAX_MANIFEST_BYTES)
    if data is None:
        raise StoreError(f"{store.url(key)}: version {version} of {model_name!r} not found (no manifest)")
    try:
        manifest = signed_part(loads_json(data, what=f"{store.url(key)}: manifest", limit=MAX_MANIFEST_BYTES))
    except UntrustedInputError as exc:
        raise VerificationError(str(exc)) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("artifacts", {}), dict) \
            or not isinstance(manifest.get("channels", {}), dict):
        raise VerificationError(f"{store.url(key)}: manifest is not a JSON object with 'artifacts' and 'channels'")
    for name, entry in manifest.get("artifacts", {}).items():
        artifact_key = store.version_key(model_name, version, name)
        size = entry.get("size_bytes") if isinstance(entry, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(entry.get("sha256"), str):
            raise VerificationError(f"{store.url(key)}: artifact {name} has no valid sha256 and size_bytes")
        blob = store.read(artifact_key, size)  # never more than the manifest's size + 1 byte
        if blob is None:
            raise VerificationError(f"{store.url(artifact_key)}: missing, though the manifest lists it")
        if sha256_hex(blob) != entry["sha256"] or len(blob) != entry["size_bytes"]:
            raise VerificationError(f"{store.url(artifact_key)}: sha256 {sha256_hex(blob)[:12]} ({len(blob)} bytes) "
                                    f"does not match the manifest's {entry['sha256'][:12]} ({entry['size_bytes']} bytes)")
    return manifest, sha256_hex(data)


def previous_version(pointer: dict, where: str = "channel") -> str:
    """The version the current one was last promoted over (so repeated rollbacks walk back)."""
    current = pointer.get("version")
    for entry in reversed(_history(pointer)):
        if entry.get("action") == "promote" and entry.get("version") == current:
            if entry.get("from_version"):
                return entry["from_version"]
            break
    raise StoreError(f"{where}: no version before {current} in the channel history; pass --to VERSION")


def default_actor() -> str:
    """``ONNXCAST_ACTOR``, else user@host."""
    if os.environ.get("ONNXCAST_ACTOR"):
        return os.environ["ONNXCAST_ACTOR"]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in minimal containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# --- planning: everything checked before the first write ---------------------------------

@dataclass(frozen=True)
class Artifact:
    name: str
    data: bytes
    entry: dict  # what the manifest says about it


@dataclass(frozen=True)
class VersionPlan:
    """A version as it will be written: artifacts, channel -> artifact, and report facts."""

    version: str
    artifacts: list[Artifact]
    channels: dict[str, dict]  # every channel the report selects
    channels_to_move: list[str]
    report: dict
    report_sha256: str

    def manifest(self, model_name: str, actor: str, reason: str) -> dict:
        import onnxruntime

        report = self.report
        return {
            "_type": MANIFEST_TYPE,
            "format": MANIFEST_FORMAT, "model": model_name, "version": self.version,
            "created_at": _now(), "created_by": actor, "reason": reason,
            "artifacts": {a.name: a.entry for a in self.artifacts},
            "channels": self.channels,
            "onnxruntime_version": report.get("onnxruntime_version") or onnxruntime.__version__,
            "onnxcast_version": report.get("onnxcast_version"),
            "mlflow": report.get("mlflow"),
            "dataset": report.get("dataset"), "split": report.get("split"),
            "baselines": report.get("baselines"),
            "report": {"sha256": self.report_sha256, "created": report.get("created")},
        }


def plan_version(report_path: str | Path, channels: Sequence[str] | str, version: str | None = None) -> VersionPlan:
    """Read and check the report and its artifacts; raise before anything is written."""
    from onnxcast.rollout.edge import inspect_model

    path, report, raw = load_report(report_path)
    base = path.parent.resolve()
    if report.get("status", "passed") != "passed":
        raise ReportError(f"{path}: status is {report.get('status')!r}; only a passed run can be promoted")
    selected = report.get("selected") or {}
    wanted = _channel_list(channels)
    unknown = [c for c in wanted if c not in selected]
    if unknown:
        raise ReportError(f"{path}: unknown channel(s) {unknown}; the report selects {sorted(selected)}")

    artifacts: dict[str, Artifact] = {}
    chosen: dict[str, dict] = {}
    for channel, choice in sorted(selected.items()):
        check_name("channel", channel)
        family, variant = choice.get("family"), choice.get("variant")
        entry = _variant_entry(report, family, variant, path)
        name = check_name("artifact", f"{family}-{variant}.onnx")
        chosen[channel] = {"artifact": name, "family": family, "variant": variant}
        if name in artifacts:
            continue
        file = (base / entry["onnx_path"]).resolve()
        if not file.is_relative_to(base):
            raise ReportError(f"{path}: onnx_path {entry['onnx_path']!r} points outside the report folder")
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise ReportError(f"{file}: cannot read the {family}/{variant} model the report names ({exc.strerror})") from None
        if sha256_hex(data) != entry.get("sha256"):
            raise ReportError(f"{file}: sha256 {sha256_hex(data)[:12]} does not match the report's "
                              f"{str(entry.get('sha256'))[:12]}")
        info = inspect_model(file)
        artifacts[name] = Artifact(name, data, {
            "sha256": sha256_hex(data), "size_bytes": len(data), "family": family, "variant": variant,
            "opset": info.opset, "signature": info.signature, "metadata": info.metadata,
            "holdout": entry.get("holdout"), "latency_ms": entry.get("latency_ms"),
            "parity_max_abs_diff": entry.get("parity_max_abs_diff"), "gates": entry.get("gates"),
        })

    ordered = [artifacts[n] for n in sorted(artifacts)]
    identity = _identity({"artifacts": {a.name: a.entry for a in ordered}, "channels": chosen})
    if version:
        version = check_name("version", str(version))
    elif (report.get("mlflow") or {}).get("version") is not None:
        version = check_name("version", str(report["mlflow"]["version"]))
    else:
        dataset = str((report.get("dataset") or {}).get("sha256") or "nodata")
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        version = f"{dataset[:8]}-{digest[:12]}"
    return VersionPlan(version, ordered, chosen, wanted, report, sha256_hex(raw))


def load_report(report_path: str | Path) -> tuple[Path, dict, bytes]:
    """(path, parsed report, raw bytes) of report.json or the folder holding it."""
    path = Path(report_path)
    if path.is_dir():
        path = path / REPORT
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ReportError(f"{path}: report not found") from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the report ({exc.strerror})") from None
    try:
        report = json.loads(raw)
    except ValueError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(report, dict) or not isinstance(report.get("models"), list):
        raise ReportError(f"{path}: not a pipeline report (no 'models' list)")
    return path, report, raw


# --- helpers ------------------------------------------------------------------------------

def _channel_list(channels: Sequence[str] | str) -> list[str]:
    items = [channels] if isinstance(channels, str) else list(channels)
    names = [c.strip() for item in items for c in item.split(",") if c.strip()]
    if not names:
        raise ConfigError("no channel given to promote to")
    return [check_name("channel", c) for c in dict.fromkeys(names)]


def _variant_entry(report: dict, family: Any, variant: Any, path: Path) -> dict:
    for model in report["models"]:
        if model.get("family") != family:
            continue
        for entry in model.get("variants", []):
            if entry.get("name") == variant:
                if entry.get("eligible") is not True:
                    raise ReportError(f"{path}: selected variant {family}/{variant} is not eligible "
                                      f"({'; '.join(entry.get('reasons', [])) or 'eligible is not true'})")
                if not entry.get("onnx_path"):
                    raise ReportError(f"{path}: variant {family}/{variant} has no onnx_path")
                return entry
    raise ReportError(f"{path}: selected variant {family}/{variant} is not in the report's models")


def _identity(manifest: dict) -> dict:
    """What makes two manifests the same version: artifact bytes and channel choices."""
    return {"artifacts": {n: [e["sha256"], e["size_bytes"]] for n, e in manifest.get("artifacts", {}).items()},
            "channels": manifest.get("channels")}


def _check_same_version(store: RolloutStore, model_name: str, plan: VersionPlan, existing: dict | None) -> None:
    ours = _identity({"artifacts": {a.name: a.entry for a in plan.artifacts}, "channels": plan.channels})
    if existing is None or _identity(existing) != ours:
        raise ConflictError(f"{store.url(store.version_key(model_name, plan.version))}: version {plan.version} "
                            "already exists with different artifacts; versions are immutable, choose another version")


def _write_once(store: RolloutStore, key: str, data: bytes) -> bool:
    """Create ``key``; True if written, False if the same bytes were already there."""
    if store.create(key, data):
        return True
    existing = store.read(key)
    if existing != data:
        got = "nothing readable" if existing is None else f"sha256 {sha256_hex(existing)[:12]}"
        raise ConflictError(f"{store.url(key)}: already exists with different bytes ({got}, ours "
                            f"{sha256_hex(data)[:12]}); versions are immutable")
    return False


def _move_pointer(store: RolloutStore, model_name: str, channel: str, version: str, manifest: dict,
                  manifest_sha: str, pointer: Pointer, *, action: str, actor: str, reason: str,
                  signers: Sequence, days: float, root: PublishedRoot) -> bool:
    """Compare-and-swap the channel to a newly signed pointer at ``version``; False when it
    is there already (and signed)."""
    choice = manifest["channels"][channel]
    old = pointer.value or {}
    signed_before = bool((pointer.envelope or {}).get("signatures"))
    if signed_before and (old.get("version"), old.get("artifact"), old.get("manifest_sha256")) == \
            (version, choice["artifact"], manifest_sha):
        return False
    history = _history(old) + [{
        "action": action, "version": version, "from_version": old.get("version"),
        "variant": choice["variant"], "family": choice["family"], "by": actor, "at": _now(), "reason": reason,
    }]
    record = None
    if action == "rollback":
        record = {"version": version, "from_version": old.get("version"), "by": actor, "at": _now(), "reason": reason}
    value = _pointer_value(model_name, channel, version, manifest, manifest_sha,
                           _manifest_length(store, model_name, version), old, action=action,
                           actor=actor, history=history, rollback=record, days=days, root_version=root.version)
    key = store.channel_key(model_name, channel)
    root.verify_manifest(store, model_name, version)
    envelope = sign_envelope(value, signers)
    root.verify(envelope, POINTER_ROLE, POINTER_TYPE, store.url(key))
    store.replace_pointer(key, envelope, pointer.token)
    return True


def _manifest_length(store: RolloutStore, model_name: str, version: str) -> int:
    return len(store.read_bounded(store.version_key(model_name, version), MAX_MANIFEST_BYTES) or b"")


def _pointer_version(value: dict, where: str) -> str:
    """The version a pointer read by a writer names; StoreError when it names none."""
    try:
        return check_name("version", value.get("version"))
    except ConfigError:
        raise StoreError(f"{where}: malformed channel pointer (no valid version); nothing changed") from None


def _history(value: dict) -> list[dict]:
    """The pointer's history entries (those that are objects: a store writer may have planted anything)."""
    history = value.get("history")
    return [e for e in history if isinstance(e, dict)] if isinstance(history, list) else []


class PublishedRoot:
    """The newest trust root the store publishes (``root/<n>.root.json``): what devices will
    check the metadata a writer signs against. A writer checks its own new envelopes with it
    before writing, so a revoked or wrong key is refused on one line instead of freezing the
    channel for every device (issue 18, item 10). A store that publishes no root (root 1 often
    only installed on devices) gives nothing to check against: ``keys publish-root`` it."""

    def __init__(self, root, where: str | None):
        self.root, self.where = root, where

    @property
    def version(self) -> int:
        return self.root.signed.version if self.root is not None else 0

    @classmethod
    def read(cls, store: RolloutStore) -> PublishedRoot:
        from onnxcast.rollout.signing import check_root_fresh, parse_root, verify_self_signed

        version = latest_root_version(store)
        if version == 0:
            return cls(None, None)
        key = store.root_key(version)
        where = store.url(key)
        data = store.read_bounded(key, MAX_ROOT_BYTES)
        if data is None:  # removed since it was listed
            raise StoreError(f"{where}: vanished while it was read; nothing written, try again")
        try:
            root = parse_root(data, where)
            verify_self_signed(root, where)
            check_root_fresh(root, where)
        except RefusedError as exc:
            raise ConfigError(f"the published trust root would be refused by devices: {exc}; nothing written") from None
        return cls(root, where)

    def check_signers(self, signers: Sequence, role: str, what: str) -> None:
        """Before anything is written: a threshold of ``signers`` holds ``role`` in the root."""
        if self.root is None:
            return
        role_spec = self.root.signed.roles[role]
        trusted = {s.public_key.keyid for s in signers} & set(role_spec.keyids)
        if len(trusted) < role_spec.threshold:
            raise ConfigError(f"{self.where}: the signing key(s) ({_keyids(signers)}) are {len(trusted)} of the "
                              f"{role_spec.threshold} key(s) trust root version {self.version} requires to sign "
                              f"{what}; devices would refuse them, nothing written (sign with a key of the current "
                              "root)")

    def verify(self, envelope: dict, role: str, expected_type: str, where: str) -> None:
        """The new ``envelope`` verifies as a device will verify it, else ConfigError, unwritten."""
        from onnxcast.rollout.signing import verify_envelope

        if self.root is None:
            return
        try:
            verify_envelope(self.root, role, envelope, expected_type, where)
        except RefusedError as exc:
            raise ConfigError(f"{exc.args[0].removesuffix('; refusing it')} of trust root version {self.version} "
                              "(published in the store); devices would refuse it, nothing written") from None

    def verify_manifest(self, store: RolloutStore, model_name: str, version: str) -> None:
        """The manifest a new pointer names verifies too: a pointer to a version signed by a
        key the root dropped would be refused by every device (promote the model again as a
        new version instead)."""
        if self.root is None:
            return
        key = store.version_key(model_name, version)
        data = store.read_bounded(key, MAX_MANIFEST_BYTES)
        try:
            envelope = loads_json(data or b"", what=store.url(key), limit=MAX_MANIFEST_BYTES)
        except UntrustedInputError as exc:
            raise VerificationError(str(exc)) from None
        try:
            self.verify(envelope, MANIFEST_ROLE, MANIFEST_TYPE, store.url(key))
        except ConfigError as exc:
            raise ConfigError(f"{exc}; promote that model again as a new version") from None


def _keyids(signers: Sequence) -> str:
    return ", ".join(s.public_key.keyid[:12] for s in signers)


def _pointer_value(model_name: str, channel: str, version: str, manifest: dict, manifest_sha: str,
                   manifest_length: int, old: dict, *, action: str, actor: str, history: list, rollback: dict | None,
                   days: float, root_version: int) -> dict:
    """The signed fields of a channel pointer. The counter only grows: one more than the
    pointer read, and at least the Unix time, so a writer that finds the pointer damaged
    or reset still signs a counter above every one it signed before."""
    choice = manifest["channels"][channel]
    artifact = manifest["artifacts"][choice["artifact"]]
    counter = old.get("counter") if isinstance(old.get("counter"), int) else 0
    return {
        "_type": POINTER_TYPE, "model": model_name, "channel": channel,
        "counter": max(counter + 1, int(time.time())), "expires": expiry(days),
        "version": version, "artifact": choice["artifact"], "family": choice["family"], "variant": choice["variant"],
        "sha256": artifact["sha256"], "length": artifact["size_bytes"],
        "manifest": {"sha256": manifest_sha, "length": manifest_length}, "manifest_sha256": manifest_sha,
        "action": action, "rollback": rollback, "root_version": root_version,
        "updated_at": _now(), "updated_by": actor, "history": history[-HISTORY_KEPT:],
    }


def _signers(signers: Sequence | str | None) -> list:
    """Signer objects as given, else loaded from key files / KMS URIs / the environment."""
    if signers and not isinstance(signers, str) and all(hasattr(s, "sign") for s in signers):
        return list(signers)
    return load_signers(signers)


def _publish_model_repositories(store: RolloutStore, model_name: str, channels, signers: Sequence) -> None:
    """The cloud channel is also published as a Triton / KServe model repository (idempotent:
    a rerun of the same promotion repairs a repository an earlier attempt left behind). The
    bytes come from a verified pull: against ``$ONNXCAST_TRUST`` when the worker has one, else
    against the public keys of the release keys that just signed."""
    from onnxcast.rollout.signing import TRUST_ENV, signers_root
    from onnxcast.serving.repository import PUBLISHED_CHANNELS, publish_model_repository

    wanted = [c for c in channels if c in PUBLISHED_CHANNELS]
    if not wanted:
        return
    trust = os.environ.get(TRUST_ENV) or signers_root(signers)
    for channel in wanted:
        publish_model_repository(store, model_name, channel, trust=trust)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
