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
with :func:`refresh` before it passes), the last ``action`` (promote|rollback|refresh|restore), a
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
import json
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxcast.base import environment
from onnxcast.base.errors import (
    ConfigError,
    ConflictError,
    OnnxcastError,
    RefusedError,
    StoreError,
    VerificationError,
)
from onnxcast.base.files import sha256_bytes
from onnxcast.base.target_evidence import (
    REFERENCE_TARGET,
    VALIDATED,
    manifest_target,
    variant_targets,
)
from onnxcast.base.untrusted import (
    MAX_REPORT_BYTES,
    UntrustedInputError,
    loads_json,
    quote,
    read_regular_file,
)
from onnxcast.rollout.repository import PUBLISHED_CHANNELS, publish_model_repository
from onnxcast.rollout.signing import (
    MANIFEST_ROLE,
    MANIFEST_TYPE,
    POINTER_ROLE,
    POINTER_TYPE,
    TRUST_ENV,
    check_root_fresh,
    expiry,
    load_signers,
    parse_root,
    sign_envelope,
    signers_root,
    verify_envelope,
    verify_next_root,
    verify_self_signed,
)
from onnxcast.rollout.store import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Pointer,
    RolloutStore,
    check_name,
    dump_json,
    open_store,
    signed_part,
)
from onnxcast.rollout.trust import check_signed_manifest, check_signed_pointer

MAX_ROOT_BYTES = 1 << 20

REPORT = "report.json"
MANIFEST_FORMAT = 2  # 2: a signed envelope
POINTER_EXPIRES_ENV = "ONNXCAST_POINTER_EXPIRES_DAYS"
DEFAULT_POINTER_DAYS = environment.default(POINTER_EXPIRES_ENV)
MAX_KEPT_COUNTER = 1 << 62  # a planted pointer's counter past this is not followed (it would only grow)
HISTORY_KEPT = 200  # pointer entries kept (a device reads at most 1 MiB of pointer)


# called with {channel: (version it serves or None, version it is about to serve)}
BeforeMove = Callable[[dict[str, tuple[str | None, str]]], None]


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
            signers: Sequence | str | None = None, expires_days: float | None = None,
            overwrite_unverified: bool = False, before_move: BeforeMove | None = None,
            on_moved: Callable[[str], None] | None = None) -> PromotionResult:
    """Publish the run described by ``report`` (report.json or its folder) as an immutable
    version of ``model_name`` and move ``channels`` to it.

    The version id is ``version``, else the report's MLflow model version, else an id
    derived from the dataset and model hashes (so the same promotion twice is a no-op).
    ``signers`` are the release keys (signer objects, key files or ``awskms:`` URIs;
    default ``$ONNXCAST_SIGNING_KEY``); the pointer expires after ``expires_days``
    (default ``$ONNXCAST_POINTER_EXPIRES_DAYS`` or 30). A current pointer that does not
    verify is refused unless ``overwrite_unverified`` (then nothing of it is kept).
    ``before_move({channel: (version it serves or None, plan version)})`` is called once
    everything has been read and checked, before the first write: an exception it raises
    stops the promotion with nothing written (onnxcast.registry.release checks the registry
    there); ``on_moved(channel)`` after each pointer it moved (a caller undoes those when a
    later channel fails). Raises ReportError/ConfigError before writing anything when the input is wrong,
    ConflictError when a channel moved since it was read, VerificationError when what the
    store holds differs from what was written.
    """
    store = store if isinstance(store, RolloutStore) else open_store(store)
    check_name("model", model_name)
    signers = resolve_signers(signers)
    days = pointer_days(expires_days)
    plan = plan_version(report, channels, version)
    actor = actor or default_actor()
    root = PublishedRoot.read(store, signers)
    root.check_signers(signers, POINTER_ROLE, "channel pointers")
    # The values to move from are read (and verified) before anything is written: whoever
    # moves a channel during our upload wins, and we report a conflict instead of overwriting.
    pointers = {c: root.current_pointer(store, store.read_channel(model_name, c), model_name, c,
                                        overwrite_unverified=overwrite_unverified)
                for c in plan.channels_to_move}
    if before_move is not None:
        before_move({c: (_served(pointers[c]), plan.version) for c in plan.channels_to_move})
    written, skipped = _publish_version(store, model_name, plan, root, signers, actor, reason)
    manifest, manifest_sha = verify_version(store, model_name, plan.version, root)
    moved = {}
    for channel in plan.channels_to_move:
        changed = _move_pointer(store, model_name, channel, plan.version, manifest, manifest_sha,
                                pointers[channel], action="promote", actor=actor, reason=reason,
                                signers=signers, days=days, root=root)
        moved[channel] = "moved" if changed else "unchanged"
        if changed and on_moved is not None:
            on_moved(channel)
    _publish_model_repositories(store, model_name, moved, signers)
    return PromotionResult(model_name, plan.version, store.uri, tuple(written), tuple(skipped), moved)


def _publish_version(store: RolloutStore, model_name: str, plan, root, signers, actor: str,
                     reason: str) -> tuple[list[str], list[str]]:
    """Write the plan's artifacts and signed manifest once (names written, names already
    there); a version already published must be the same one (``_check_same_version``)."""
    written, skipped = [], []
    existing = store.read_manifest(model_name, plan.version)
    if existing is not None:
        _check_same_version(store, model_name, plan, existing)
        return written, skipped
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
    return written, skipped


def rollback(store: RolloutStore | str, model_name: str, channel: str, *, to_version: str | None = None,
             actor: str | None = None, reason: str, signers: Sequence | str | None = None,
             expires_days: float | None = None, before_move: BeforeMove | None = None) -> RollbackResult:
    """Move ``channel`` back to ``to_version``, or to the version it was promoted from,
    after verifying that version; record who, when and why in the pointer history. The
    new pointer carries a signed rollback record, which lets devices go back.
    ``before_move({channel: (current, target)})`` is called after every check, before the
    pointer moves (also when the channel is at the target already: nothing moves then)."""
    store = store if isinstance(store, RolloutStore) else open_store(store)
    if not reason or not reason.strip():
        raise ConfigError("a rollback needs a reason")
    signers = resolve_signers(signers)
    days = pointer_days(expires_days)
    key = store.channel_key(model_name, channel)
    root = PublishedRoot.read(store, signers)
    root.check_signers(signers, POINTER_ROLE, "channel pointers")
    pointer = store.read_pointer(key)
    if pointer.value is None:
        raise StoreError(f"{store.url(key)}: no such channel for model {model_name!r}; nothing to roll back")
    # The history the target is taken from is the verified pointer's, never the store's bytes.
    pointer = root.current_pointer(store, pointer, model_name, channel)
    current = _pointer_version(pointer.value, store.url(key))
    target = check_name("version", to_version) if to_version else previous_version(pointer.value, store.url(key))
    if target == current:
        if before_move is not None:
            before_move({channel: (current, target)})
        return RollbackResult(model_name, channel, target, current, False)
    _move_back(store, model_name, channel, pointer, target, action="rollback", actor=actor, reason=reason,
               signers=signers, days=days, root=root, before_move=before_move)
    return RollbackResult(model_name, channel, target, current, True)


def restore(store: RolloutStore | str, model_name: str, channel: str, *, version: str, replacing: str,
            reason: str, actor: str | None = None, signers: Sequence | str | None = None,
            expires_days: float | None = None) -> bool:
    """Compensation: move ``channel`` back to ``version`` while it still serves ``replacing`` (the
    version this writer just moved it to), as a newly signed pointer with action ``restore``
    and a rollback record (a device that installed ``replacing`` meanwhile may go back). False,
    and nothing written, when the channel has moved on since (someone else's move stays)."""
    store = store if isinstance(store, RolloutStore) else open_store(store)
    signers = resolve_signers(signers)
    days = pointer_days(expires_days)
    key = store.channel_key(model_name, channel)
    root = PublishedRoot.read(store, signers)
    pointer = store.read_pointer(key)
    if pointer.value is None:
        return False
    pointer = root.current_pointer(store, pointer, model_name, channel)
    if _pointer_version(pointer.value, store.url(key)) != replacing:
        return False
    _move_back(store, model_name, channel, pointer, check_name("version", version), action="restore",
               actor=actor, reason=reason, signers=signers, days=days, root=root)
    return True


def _move_back(store: RolloutStore, model_name: str, channel: str, pointer: Pointer, target: str, *, action: str,
               actor: str | None, reason: str, signers: Sequence, days: float, root: PublishedRoot,
               before_move: BeforeMove | None = None) -> None:
    """Verify ``target`` and compare-and-swap the channel to it with a rollback record."""
    current = pointer.value.get("version")
    manifest, manifest_sha = verify_version(store, model_name, target, root)
    if channel not in manifest["channels"]:
        raise StoreError(f"{store.url(store.version_key(model_name, target))}: version {target} has no variant "
                         f"for channel {channel!r} (it has {sorted(manifest.get('channels', {}))})")
    if before_move is not None:
        before_move({channel: (current, target)})
    _move_pointer(store, model_name, channel, target, manifest, manifest_sha, pointer,
                  action=action, actor=actor or default_actor(), reason=reason, signers=signers, days=days,
                  root=root)
    _publish_model_repositories(store, model_name, [channel], signers)


def refresh(store: RolloutStore | str, model_name: str, channel: str, *, signers: Sequence | str | None = None,
            expires_days: float | None = None, actor: str | None = None) -> dict:
    """Re-sign ``channel``'s pointer with a higher counter and a new expiry, same version
    (TUF's timestamp role: devices refuse a pointer past its expiry, so a frozen store
    cannot keep them on an old version forever). Returns the new signed fields."""
    store = store if isinstance(store, RolloutStore) else open_store(store)
    signers = resolve_signers(signers)
    days = pointer_days(expires_days)
    key = store.channel_key(model_name, channel)
    root = PublishedRoot.read(store, signers)
    root.check_signers(signers, POINTER_ROLE, "channel pointers")
    pointer = store.read_pointer(key)
    if pointer.value is None:
        raise StoreError(f"{store.url(key)}: no such channel for model {model_name!r}; nothing to refresh")
    # Only a pointer a release key signed is re-signed (a planted one would be laundered).
    pointer = root.current_pointer(store, pointer, model_name, channel)
    version = _pointer_version(pointer.value, store.url(key))
    manifest, manifest_sha = verify_version(store, model_name, version, root)
    if channel not in manifest["channels"]:
        raise StoreError(f"{store.url(store.version_key(model_name, version))}: version {version} has no variant "
                         f"for channel {channel!r}; nothing written")
    value = _pointer_value(model_name, channel, version, manifest, manifest_sha,
                           _manifest_length(store, model_name, version), pointer.value,
                           action="refresh", actor=actor or default_actor(), history=_history(pointer.value),
                           rollback=pointer.value.get("rollback"), days=days, root_version=root.version)
    envelope = sign_envelope(value, signers)
    root.verify(envelope, POINTER_ROLE, POINTER_TYPE, store.url(key))
    store.replace_pointer(key, envelope, pointer.token)
    return value


def latest_root_version(store: RolloutStore) -> int:
    """The newest trust root published in the store (``root/<n>.root.json``; 0 if none),
    found by listing. Pointers name it, so devices fetch exactly the roots they need and
    never probe for a missing one (a device without s3:ListBucket gets 403, not 404)."""
    versions = store.list_root_versions()
    return versions[-1] if versions else 0


def pointer_days(days: float | None) -> float:
    """How long a new pointer stays valid: ``days``, else ``$ONNXCAST_POINTER_EXPIRES_DAYS``, else 30."""
    if days is None:
        days = environment.value(POINTER_EXPIRES_ENV)
    if not 0 < days <= 3660:
        raise ConfigError(f"pointer expiry must be between 0 and 3660 days, got {days}")
    return float(days)


def verify_version(store: RolloutStore, model_name: str, version: str,
                   root: PublishedRoot | None = None) -> tuple[dict, str]:
    """Read a version back: its manifest (its signatures checked against ``root`` first when
    given, its shape always) and every artifact's sha256 and size. Returns the manifest and
    its sha256; StoreError if it is missing, VerificationError if it differs."""
    key = store.version_key(model_name, version)
    data = store.read_bounded(key, MAX_MANIFEST_BYTES)
    if data is None:
        raise StoreError(f"{store.url(key)}: version {version} of {model_name!r} not found (no manifest)")
    if root is not None:
        root.check_manifest(data, store, model_name, version)
    try:
        manifest = signed_part(loads_json(data, what=f"{store.url(key)}: manifest", limit=MAX_MANIFEST_BYTES))
    except UntrustedInputError as exc:
        raise VerificationError(str(exc)) from None
    check_manifest_shape(manifest, store.url(key))
    for name, entry in manifest["artifacts"].items():
        artifact_key = store.version_key(model_name, version, check_name("artifact", name))
        size = entry["size_bytes"]
        blob = store.read(artifact_key, size)  # never more than the manifest's size + 1 byte
        if blob is None:
            raise VerificationError(f"{store.url(artifact_key)}: missing, though the manifest lists it")
        if sha256_bytes(blob) != entry["sha256"] or len(blob) != entry["size_bytes"]:
            raise VerificationError(f"{store.url(artifact_key)}: sha256 {sha256_bytes(blob)[:12]} ({len(blob)} bytes) "
                                    f"does not match the manifest's {entry['sha256'][:12]} ({entry['size_bytes']} bytes)")
    return manifest, sha256_bytes(data)


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
    actor = environment.get("ONNXCAST_ACTOR")
    if actor:
        return actor
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
    path, report, raw = load_report(report_path)
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
        name = _add_model(artifacts, path, family, variant, entry)
        chosen[channel] = {"artifact": name, "family": family, "variant": variant,
                           "targets": _channel_targets(artifacts, report, path, choice, entry)}

    ordered = [artifacts[n] for n in sorted(artifacts)]
    identity = _identity({"artifacts": {a.name: a.entry for a in ordered}, "channels": chosen})
    if version:
        version = check_name("version", str(version))
    elif (report.get("mlflow") or {}).get("version") is not None:
        version = check_name("version", str(report["mlflow"]["version"]))
    else:
        dataset = str((report.get("dataset") or {}).get("sha256") or "nodata")
        digest = sha256_bytes(json.dumps(identity, sort_keys=True).encode())
        version = f"{dataset[:8]}-{digest[:12]}"
    return VersionPlan(version, ordered, chosen, wanted, report, sha256_bytes(raw))


def _add_model(artifacts: dict, path: Path, family: Any, variant: Any, entry: dict) -> str:
    """The ONNX file of a report variant as an artifact (read once, its sha256 checked), with its
    evidence and the evidence of every deployment target it was judged on; returns its name."""
    from onnxcast.rollout.edge import inspect_model

    name = check_name("artifact", f"{family}-{variant}.onnx")
    if name in artifacts:
        return name
    file, data = _read_checked(path, entry["onnx_path"], entry.get("sha256"), f"the {family}/{variant} model")
    info = inspect_model(file)
    artifacts[name] = Artifact(name, data, {
        "sha256": sha256_bytes(data), "size_bytes": len(data), "family": family, "variant": variant,
        "opset": info.opset, "signature": info.signature, "metadata": info.metadata,
        "holdout": entry.get("holdout"), "latency_ms": entry.get("latency_ms"),
        "parity_max_abs_diff": entry.get("parity_max_abs_diff"), "gates": entry.get("gates"),
        # calibrated, not_judged, recalibrated or uncalibrated (docs/intervals.md): what a
        # consumer of the quantiles output may rely on; None from a report before the verdict
        "intervals_status": entry.get("intervals_status"),
        # per deployment target: its status and evidence (docs/targets.md); x86_64 derived from
        # the validation for a report from before targets
        "targets": {t: manifest_target(r) for t, r in sorted(variant_targets(entry).items())},
    })
    return name


def _channel_targets(artifacts: dict, report: dict, path: Path, choice: dict, entry: dict) -> dict:
    """``{target: {artifact, family, variant}}`` of a channel, validated targets only (the report's
    ``selected[channel]["targets"]``; x86_64 with the channel's variant for a report from before
    targets); each variant's ONNX file, and a target's compiled file (TVM's library), published."""
    family, variant = choice.get("family"), choice.get("variant")
    wanted = choice.get("targets")
    if not isinstance(wanted, dict):
        wanted = {REFERENCE_TARGET: {"family": family, "variant": variant}}
    chosen = {}
    for name, pick in sorted(wanted.items()):
        picked = pick.get("variant") if isinstance(pick, dict) else None
        if not isinstance(pick, dict) or pick.get("family") != family:
            raise ReportError(f"{path}: target {name!r} of the {family} channel choice names another family")
        found = entry if picked == variant else _variant_entry(report, family, picked, path)
        record = variant_targets(found).get(name) or {}
        if record.get("status") != VALIDATED:
            raise ReportError(f"{path}: target {name!r} names {family}/{picked}, which is "
                              f"{record.get('status') or 'not judged'} there, not validated")
        artifact = _add_model(artifacts, path, family, picked, found)
        if record.get("artifact") and record["artifact"] != found.get("onnx_path"):
            artifact = _add_compiled(artifacts, path, name, record, artifacts[artifact])
        chosen[name] = {"artifact": artifact, "family": family, "variant": picked}
    return chosen


def _add_compiled(artifacts: dict, path: Path, target: str, record: dict, model: Artifact) -> str:
    """A target's own artifact (TVM's library compiled from ``model``), checked like a model."""
    family, variant = model.entry["family"], model.entry["variant"]
    suffix = Path(record["artifact"]).suffix
    name = check_name("artifact", f"{family}-{variant}.{target}{suffix}")
    if name not in artifacts:
        _, data = _read_checked(path, record["artifact"], record.get("sha256"), f"the {family}/{variant} {target} file")
        artifacts[name] = Artifact(name, data, {
            "sha256": sha256_bytes(data), "size_bytes": len(data), "family": family, "variant": variant,
            "target": target, "compiled_from": model.name, "static_shape": record.get("static_shape")})
    return name


def _read_checked(path: Path, relative: str, sha256: Any, what: str) -> tuple[Path, bytes]:
    """The bytes of a file the report names (under its folder), matching the report's sha256."""
    base = path.parent.resolve()
    file = (base / relative).resolve()
    if not file.is_relative_to(base):
        raise ReportError(f"{path}: {relative!r} ({what}) points outside the report folder")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ReportError(f"{file}: cannot read {what} the report names ({exc.strerror})") from None
    if sha256_bytes(data) != sha256:
        raise ReportError(f"{file}: sha256 {sha256_bytes(data)[:12]} does not match the report's "
                          f"{str(sha256)[:12]}")
    return file, data


def load_report(report_path: str | Path) -> tuple[Path, dict, bytes]:
    """(path, parsed report, raw bytes) of report.json or the folder holding it: a regular file
    of at most MAX_REPORT_BYTES, nested at most MAX_JSON_DEPTH levels (100,000 nested brackets
    raised RecursionError through json.loads)."""
    path = Path(report_path)
    if path.is_dir():
        path = path / REPORT
    if not path.exists() and not path.is_symlink():
        raise ReportError(f"{path}: report not found")
    try:
        raw = read_regular_file(path, what="report", limit=MAX_REPORT_BYTES)
        report = loads_json(raw, what=f"report {str(path)!r}", limit=MAX_REPORT_BYTES)
    except UntrustedInputError as exc:
        raise ReportError(str(exc)) from None
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
    if existing is not None:
        check_manifest_shape(existing, store.url(store.version_key(model_name, plan.version)))
    if existing is None or (_identity(existing) != ours and not _same_models(existing, plan.report)):
        raise ConflictError(f"{store.url(store.version_key(model_name, plan.version))}: version {plan.version} "
                            "already exists with different artifacts; versions are immutable, choose another version")


def _same_models(existing: dict, report: dict) -> bool:
    """Whether every model file of the stored version is, byte for byte, an eligible variant of
    ``report``: the same registered version promoted again (an alias set back on it in the
    registry), re-validated now. Its variant choice may differ from the stored one (latency
    decides between close variants, and latency is measured again); the stored manifest stays
    what devices get, as versions are immutable."""
    artifacts = existing.get("artifacts") or {}
    if not artifacts:
        return False
    for entry in artifacts.values():
        if entry.get("target"):  # a target's compiled file: judged with the model it was compiled from
            continue
        found = [v for m in report.get("models", []) if m.get("family") == entry.get("family")
                 for v in m.get("variants", []) if v.get("name") == entry.get("variant")]
        if not found or found[0].get("eligible") is not True or found[0].get("sha256") != entry.get("sha256"):
            return False
    return True


def _write_once(store: RolloutStore, key: str, data: bytes) -> bool:
    """Create ``key``; True if written, False if the same bytes were already there."""
    if store.create(key, data):
        return True
    existing = store.read(key)
    if existing != data:
        got = "nothing readable" if existing is None else f"sha256 {sha256_bytes(existing)[:12]}"
        raise ConflictError(f"{store.url(key)}: already exists with different bytes ({got}, ours "
                            f"{sha256_bytes(data)[:12]}); versions are immutable")
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
    if action in ("rollback", "restore"):  # a version devices may have verified before: allowed back
        record = {"version": version, "from_version": old.get("version"), "by": actor, "at": _now(), "reason": reason}
    value = _pointer_value(model_name, channel, version, manifest, manifest_sha,
                           _manifest_length(store, model_name, version), old, action=action,
                           actor=actor, history=history, rollback=record, days=days, root_version=root.version)
    key = store.channel_key(model_name, channel)
    envelope = sign_envelope(value, signers)
    root.verify(envelope, POINTER_ROLE, POINTER_TYPE, store.url(key))
    store.replace_pointer(key, envelope, pointer.token)
    return True


def _manifest_length(store: RolloutStore, model_name: str, version: str) -> int:
    return len(store.read_bounded(store.version_key(model_name, version), MAX_MANIFEST_BYTES) or b"")


def _served(pointer: Pointer) -> str | None:
    """The version a verified pointer names (None: no pointer yet, or one being overwritten)."""
    version = (pointer.value or {}).get("version")
    return version if isinstance(version, str) else None


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
    """What a writer checks everything it reads and signs against: the newest trust root of
    the chain the store publishes (``root/<n>.root.json``, listed; root 1 self-signed, each
    next one signed by a threshold of the previous root's keys and of its own, exactly as a
    device walks it). A store that publishes none is checked against the writer's own
    release keys (``keys publish-root`` root 1 to check against the root devices hold).

    - the current channel pointer and the manifest it names are verified before anything of
      them is used (issue 18 round 2, item 1): a pointer planted by whoever can write the
      store (no keys) is refused, never re-signed, and its history and rollback record are
      never copied;
    - the new manifest and pointer are verified before they are written, and the signers
      checked before the first write (item 10), so a revoked key is refused on one line
      instead of freezing the channel for every device;
    - a gap in the published chain, or a root that does not chain, is refused on one line
      naming it (items 2, 3)."""

    def __init__(self, root, where: str | None, chain: dict | None = None, published: bool = True):
        self.root, self.where = root, where
        self.chain = chain or {}  # version -> verified root (published ones)
        self.published = published

    @property
    def version(self) -> int:
        """The root version new pointers name (0: the store publishes none)."""
        return self.root.signed.version if self.root is not None and self.published else 0

    @classmethod
    def read(cls, store: RolloutStore, signers: Sequence = ()) -> PublishedRoot:
        versions = store.list_root_versions()
        if not versions:
            return cls(signers_root(signers), None, published=False)
        missing = sorted(set(range(1, versions[-1] + 1)) - set(versions))
        if missing:
            raise RefusedError(f"{store.url(store.root_key(missing[0]))}: missing, though root version "
                               f"{versions[-1]} is published: the store's trust roots have a gap; nothing written "
                               f"(publish root {missing[0]} with 'onnxcast keys publish-root', or remove what "
                               "follows it if you did not publish it)")
        trusted, where, chain = None, None, {}
        for version in versions:
            key = store.root_key(version)
            where_now = store.url(key)
            data = store.read_bounded(key, MAX_ROOT_BYTES)
            if data is None:  # removed since it was listed
                raise StoreError(f"{where_now}: vanished while it was read; nothing written, try again")
            try:
                root = parse_root(data, where_now)
            except RefusedError as exc:
                raise RefusedError(f"{exc.args[0].removesuffix('; refusing it')}: the store's trust roots were "
                                   "tampered with; nothing written") from None
            if root.signed.version != version:
                raise RefusedError(f"{where_now}: holds root version {root.signed.version}: the store's trust "
                                   "roots were tampered with; nothing written")
            try:
                verify_self_signed(root, where_now)
            except RefusedError:
                raise RefusedError(f"{key} is not signed by its own root keys: the store's trust roots were "
                                   "tampered with; nothing written") from None
            if trusted is not None:
                try:
                    verify_next_root(trusted, root, where_now)
                except RefusedError:
                    raise RefusedError(f"{key} is not signed by the keys of root {version - 1}: the store's "
                                       "trust roots were tampered with; nothing written") from None
            trusted, where, chain[version] = root, where_now, root
        try:
            check_root_fresh(trusted, where)
        except RefusedError as exc:
            raise ConfigError(f"the published trust root would be refused by devices: {exc}; nothing written") from None
        return cls(trusted, where, chain)

    def check_signers(self, signers: Sequence, role: str, what: str) -> None:
        """Before anything is written: a threshold of ``signers`` holds ``role`` in the root."""
        if self.root is None:
            return
        role_spec = self.root.signed.roles[role]
        trusted = {s.public_key.keyid for s in signers} & set(role_spec.keyids)
        if len(trusted) < role_spec.threshold:
            raise ConfigError(f"{self.where}: the signing key(s) ({_keyids(signers)}) are {len(trusted)} of the "
                              f"{role_spec.threshold} key(s) trust root version {self.root.signed.version} requires "
                              f"to sign {what}; devices would refuse them, nothing written (sign with a key of the "
                              "current root)")

    def verify(self, envelope: dict, role: str, expected_type: str, where: str) -> None:
        """The new ``envelope`` verifies as a device will verify it, else ConfigError, unwritten."""
        if self.root is None:
            return
        try:
            verify_envelope(self.root, role, envelope, expected_type, where)
        except RefusedError as exc:
            raise ConfigError(self._refusal(exc)) from None

    def _refusal(self, exc: RefusedError, advice: str = "") -> str:
        """A device's refusal, said as the writer's: which root, where it came from, nothing written."""
        return (f"{exc.args[0].removesuffix('; refusing it')} of trust root version {self.root.signed.version} "
                f"({self._source()}); devices would refuse it, nothing written{advice}")

    def _source(self) -> str:
        return "published in the store" if self.published else "the signing keys' own: the store publishes no root"

    def current_pointer(self, store: RolloutStore, pointer: Pointer, model_name: str, channel: str, *,
                        overwrite_unverified: bool = False) -> Pointer:
        """``pointer`` (as read) if its signatures verify, by the newest root or by the
        published root it names (signed before a rotation), for this model and channel; its
        fields are then checked for the types writers use. An unverifiable pointer is refused
        (RefusedError, one line); with ``overwrite_unverified`` (``promote
        --overwrite-unverified-pointer``) it is kept only as the value to swap from: nothing of
        it (version, history, rollback record, counter) is used."""
        if pointer.envelope is None or self.root is None:
            return pointer
        where = store.url(store.channel_key(model_name, channel))
        named = (pointer.envelope.get("signed") or {}).get("root_version") \
            if isinstance(pointer.envelope.get("signed"), dict) else None
        candidates = [self.root]
        if isinstance(named, int) and not isinstance(named, bool) and self.published:
            older = self.chain.get(max(named, 1))
            if older is not None and older is not self.root:
                candidates.append(older)
        problem = None
        for root in candidates:
            try:
                signed = check_signed_pointer(root, pointer.envelope, model_name, channel, where)
                break
            except RefusedError as exc:
                problem = problem or exc.args[0].removesuffix("; refusing it").removeprefix(f"{where}: ")
        else:
            if overwrite_unverified:
                # Only its counter is kept, and only to go above it: devices refuse a counter
                # lower than one they verified, and a higher one lets no replay through.
                counter = (pointer.value or {}).get("counter")
                keep = {"counter": counter} if isinstance(counter, int) and not isinstance(counter, bool) \
                    and 0 <= counter < MAX_KEPT_COUNTER else {}
                return Pointer(keep, pointer.token, pointer.raw, None)
            raise RefusedError(f"{where}: the current pointer does not verify against trust root version "
                               f"{self.root.signed.version} ({problem}); it was not written with a release key, "
                               "so nothing of it is re-signed or copied, nothing written (move the channel to a "
                               "version you choose: 'onnxcast promote --report RUN --version V "
                               "--overwrite-unverified-pointer')")
        _check_pointer_shape(signed, where)
        return Pointer(signed, pointer.token, pointer.raw, pointer.envelope)

    def check_manifest(self, data: bytes, store: RolloutStore, model_name: str, version: str) -> None:
        """The manifest bytes of ``version`` verify (release keys of the root, this model and
        version): a pointer to a version signed by a key the root dropped would be refused by
        every device (promote that model again as a new version instead), and a manifest
        planted in the store is never read for its artifacts."""
        if self.root is None:
            return
        where = store.url(store.version_key(model_name, version))
        try:
            envelope = loads_json(data, what=where, limit=MAX_MANIFEST_BYTES)
        except UntrustedInputError as exc:
            raise VerificationError(str(exc)) from None
        try:
            check_signed_manifest(self.root, envelope, model_name, version, where)
        except RefusedError as exc:
            raise ConfigError(self._refusal(exc, "; promote that model again as a new version")) from None


def _check_pointer_shape(signed: dict, where: str) -> None:
    """The fields a writer uses of a verified pointer have the types it expects."""
    try:
        check_name("version", signed.get("version"))
    except ConfigError:
        raise StoreError(f"{where}: malformed channel pointer (no valid version); nothing written") from None
    for name, kinds in (("history", (list, type(None))), ("rollback", (dict, type(None))),
                        ("artifact", (str, type(None))), ("manifest_sha256", (str, type(None)))):
        if not isinstance(signed.get(name), kinds):
            raise StoreError(f"{where}: malformed channel pointer ({name!r} is a {type(signed.get(name)).__name__}); "
                             "nothing written")


def check_manifest_shape(manifest: Any, where: str) -> dict:
    """The manifest's fields writers use: ``artifacts`` (name -> {sha256, size_bytes}) and
    ``channels`` (channel -> {artifact named in artifacts, family, variant}), and where given
    (not in a manifest from before deployment targets) each artifact's ``targets`` (name ->
    {status, evidence}) and each channel's (name -> {artifact it lists, family, variant}); one
    VerificationError line otherwise."""
    def bad(what: str) -> VerificationError:
        return VerificationError(f"{where}: malformed manifest ({what}); nothing written")

    if not isinstance(manifest, dict):
        raise bad("not a JSON object")
    artifacts, channels = manifest.get("artifacts"), manifest.get("channels")
    if not isinstance(artifacts, dict):
        raise bad("no 'artifacts' object")
    if not isinstance(channels, dict):
        raise bad("no 'channels' object")
    for name, entry in artifacts.items():
        size = entry.get("size_bytes") if isinstance(entry, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(entry.get("sha256"), str):
            raise bad(f"artifact {quote(name)} has no valid sha256 and size_bytes")
        evidence = entry.get("targets") or {}
        if not isinstance(evidence, dict) or not all(
                isinstance(e, dict) and isinstance(e.get("status"), str) and isinstance(e.get("evidence"), dict)
                for e in evidence.values()):
            raise bad(f"artifact {quote(name)} has targets without a status and evidence")
    for channel, choice in channels.items():
        if not isinstance(choice, dict) or not all(isinstance(choice.get(k), str)
                                                   for k in ("artifact", "family", "variant")):
            raise bad(f"channel {quote(channel)} has no artifact, family and variant")
        if choice["artifact"] not in artifacts:
            raise bad(f"channel {quote(channel)} names artifact {quote(choice['artifact'])}, which it does not list")
        _check_targets_shape(choice, artifacts, f"channel {quote(channel)}", bad)
    return manifest


def _check_targets_shape(choice: dict, artifacts: dict, what: str, bad) -> None:
    """A channel's optional ``targets`` (a manifest from before targets has none): each an object
    naming an artifact the manifest lists, its family and variant."""
    targets = choice.get("targets")
    if targets is None:
        return
    if not isinstance(targets, dict):
        raise bad(f"{what} has a 'targets' that is not an object")
    for name, pick in targets.items():
        if not isinstance(pick, dict) or not all(isinstance(pick.get(k), str) for k in ("artifact", "family", "variant")):
            raise bad(f"{what} target {quote(name)} has no artifact, family and variant")
        if pick["artifact"] not in artifacts:
            raise bad(f"{what} target {quote(name)} names artifact {quote(pick['artifact'])}, which it does not list")



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


def resolve_signers(signers: Sequence | str | None) -> list:
    """Signer objects as given, else loaded from key files / KMS URIs / the environment
    (``$ONNXCAST_SIGNING_KEY``): load once, sign several writes."""
    if signers and not isinstance(signers, str) and all(hasattr(s, "sign") for s in signers):
        return list(signers)
    return load_signers(signers)


def _publish_model_repositories(store: RolloutStore, model_name: str, channels, signers: Sequence) -> None:
    """The cloud channel is also published as a Triton / KServe model repository (idempotent:
    a rerun of the same promotion repairs a repository an earlier attempt left behind). The
    bytes come from a verified pull: against ``$ONNXCAST_TRUST`` when the worker has one, else
    against the public keys of the release keys that just signed."""
    wanted = [c for c in channels if c in PUBLISHED_CHANNELS]
    if not wanted:
        return
    trust = environment.get(TRUST_ENV) or signers_root(signers)
    for channel in wanted:
        publish_model_repository(store, model_name, channel, trust=trust)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
