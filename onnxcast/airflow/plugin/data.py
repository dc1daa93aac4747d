"""What the rollout page shows, gathered from the rollout store and the MLflow registry.

Per model in the store, per channel with a pointer: the version it serves, the pointer's
signed counter and expiry, its history (who moved it, when, why: promotion, rollback,
refresh), whether a device would accept it now, the registered MLflow version the
manifest names (with a link to the MLflow UI), the latest monitored accuracy (model version
tag ``onnxcast.monitor.<channel>``) and the registry rollout state (``onnxcast.rollout.<channel>``).

Everything read from the store and the registry is untrusted: sizes are capped, every text
is cut to a bounded length and stripped of control characters, only known fields of known
types are kept, no path is followed from it, and a broken or unsigned pointer becomes a
"refused" entry instead of an exception. The page escapes all of it (jinja2 autoescape).

"Would a device accept it" is answered by the device's own code (onnxcast.rollout.trust,
onnxcast.rollout.edge) on a fresh, empty device folder: the trust root devices hold (the
``$ONNXCAST_TRUST`` file; in the embedded mode the development root), walked along the root
chain the store publishes, then the pointer's signatures, model and channel, counter and
expiry, then the manifest it names by signed length and digest, its signature and its
listing of the pointer's artifact. The artifact bytes themselves are not downloaded.

Imported by the plugin's handlers only (never at Airflow's plugin load): rollout and
registry imports stay inside functions.
"""

from __future__ import annotations

import logging
import math
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote as url_quote
from urllib.parse import urlsplit, urlunsplit

from onnxcast.base import environment

log = logging.getLogger(__name__)

MAX_MODELS = 100
MAX_CHANNELS = 20
MAX_HISTORY = 25  # newest entries shown per channel (the pointer keeps up to 200)
MAX_TEXT = 300
MAX_TAG_BYTES = 8192  # MLflow caps tag values at 8000 characters
ROLLOUT_STATES = ("pending", "deployed", "refused")
ROLLOUT_TAG = "onnxcast.rollout.{channel}"
MONITOR_TAG = "onnxcast.monitor.{channel}"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def text(value: Any, limit: int = MAX_TEXT) -> str | None:
    """A string to show: None stays None, anything else is str()-ed, control and
    bidi-override characters become spaces, and it is cut at ``limit`` characters."""
    if value is None:
        return None
    shown = _CONTROL.sub(" ", value if isinstance(value, str) else str(value))
    return shown if len(shown) <= limit else shown[: limit - 1] + "\u2026"


def integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 63 else None


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


# --- the registry ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RegistryVersion:
    """A registered model version as the page reads it: its tags and run."""

    tags: dict[str, str]
    run_id: str | None


class Registry:
    """Reads model versions from MLflow (``tracking_uri``) and links to the MLflow UI."""

    def __init__(self, tracking_uri: str, ui_url: str | None = None):
        self.tracking_uri = tracking_uri
        self.ui_url = ui_url
        self._client = None

    def version(self, model: str, version: str) -> RegistryVersion | None:
        """The version's tags, None when the registry does not have it; OSError-like
        failures propagate (the caller shows them)."""
        from mlflow.exceptions import MlflowException

        if self._client is None:
            from onnxcast.registry.tracking import client_for

            self._client = client_for(self.tracking_uri)
        try:
            found = self._client.get_model_version(model, version)
        except MlflowException as exc:
            if getattr(exc, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        return RegistryVersion(dict(found.tags or {}), found.run_id)

    def version_url(self, model: str, version: str) -> str:
        """The MLflow UI page of a model version (the base as the task's "MLflow run" link has it)."""
        uri = self.tracking_uri or ""
        base = self.ui_url or (uri if uri.startswith(("http://", "https://")) else
                               environment.value("ONNXCAST_MLFLOW_UI_URL"))
        parts = urlsplit(base)
        if parts.username or parts.password:  # never a login in a link on the page
            parts = parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))
        base = urlunsplit(parts._replace(query="", fragment=""))
        return f"{base.rstrip('/')}/#/models/{url_quote(model, safe='')}/versions/{url_quote(version, safe='')}"


# --- the device's verdict -------------------------------------------------------------------

def device_check(store, model: str, channel: str, data: bytes, trust_file: str | None) -> dict:
    """``{"accepted": bool, "reason": str, "signed": dict|None, "manifest": dict|None}``: what
    a new device, holding ``trust_file``, would do with the pointer bytes ``data`` now."""
    from onnxcast.base.errors import OnnxcastError, RefusedError
    from onnxcast.rollout.device import open_device_folder
    from onnxcast.rollout.edge import check_manifest, check_pointer
    from onnxcast.rollout.trust import DeviceTrust

    if trust_file is None:
        return {"accepted": False, "signed": None, "manifest": None,
                "reason": "not checked: no trust root on the API server (set ONNXCAST_TRUST to the root.json "
                          "devices hold)"}
    where = store.url(store.channel_key(model, channel))
    try:
        with tempfile.TemporaryDirectory(prefix="onnxcast-page-device-") as scratch, \
                open_device_folder(scratch, create=False) as folder:
            trust = DeviceTrust(folder, trust_file)
            signed, want = check_pointer(store, trust, model, channel, data)
            try:
                _, manifest = check_manifest(store, trust, model, channel, want)
            except RefusedError as exc:  # the pointer is genuine: show what it signs beside the refusal
                return {"accepted": False, "signed": signed, "manifest": None, "reason": str(exc)}
            return {"accepted": True, "signed": signed, "manifest": manifest,
                    "reason": f"signed by the release keys of trust root version {trust.root.signed.version}"}
    except OnnxcastError as exc:  # RefusedError, VerificationError, StoreError, ConfigError
        return {"accepted": False, "signed": None, "manifest": None, "reason": str(exc)}
    except Exception as exc:  # a bug or a library's own exception: one refused channel, not a broken page
        log.warning("rollout page: checking %s failed", where, exc_info=True)
        return {"accepted": False, "signed": None, "manifest": None,
                "reason": f"{where}: not checked (internal error {type(exc).__name__}); refusing it"}


# --- gathering --------------------------------------------------------------------------------

def gather(store, *, trust_file: str | None, registry: Registry | None,
           now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> dict:
    """The page's data: ``{"store", "trust_root", "generated_at", "models": [...], "error"}``."""
    from onnxcast.base.errors import OnnxcastError

    result: dict[str, Any] = {"store": text(store.uri), "trust_root": text(trust_file),
                              "generated_at": now().strftime("%Y-%m-%dT%H:%M:%SZ"), "models": [], "error": None,
                              "truncated": False, "listing": None}
    try:
        # filtered while listed, at most MAX_LISTED entries read: 150 folders with invalid names at
        # the top of a store once took the 101 places of a listing filtered afterwards
        listing = store.list_models(MAX_MODELS)
    except OnnxcastError as exc:
        result["error"] = text(exc, 1000)
        return result
    result["truncated"], result["listing"] = listing.truncated, listing_note(listing, MAX_MODELS, "models")
    for model in listing.names:
        result["models"].append(_model(store, model, trust_file, registry, now()))
    return result


def listing_note(listing, shown: int, what: str) -> dict:
    """How complete a listing is, for the page: entries read, entries skipped (not valid names)
    and, when ``truncated``, why in words."""
    if listing.stopped_at is not None:
        why = (f"the folder holds more than {listing.stopped_at:,} entries and only that many were read: "
               f"more {what} may exist")
    elif listing.truncated:
        why = f"only the first {shown} {what} are shown"
    else:
        why = None
    return {"read": listing.read, "skipped": listing.skipped, "truncated_because": why}


def _model(store, model: str, trust_file: str | None, registry: Registry | None, moment: datetime) -> dict:
    from onnxcast.base.errors import OnnxcastError

    entry: dict[str, Any] = {"name": model, "channels": [], "error": None, "channels_truncated": False,
                             "channel_listing": None}
    try:
        listing = store.list_channels(model, MAX_CHANNELS)
    except OnnxcastError as exc:
        entry["error"] = text(exc, 1000)
        return entry
    entry["channels_truncated"] = listing.truncated
    entry["channel_listing"] = listing_note(listing, MAX_CHANNELS, "channels")
    for channel in listing.names:
        try:
            entry["channels"].append(_channel(store, model, channel, trust_file, registry, moment))
        except Exception as exc:  # whatever the store holds, the other channels are still shown
            log.warning("rollout page: reading %s channel %s failed", model, channel, exc_info=True)
            entry["channels"].append({"channel": channel, "pointer": None, "device": None, "history": [],
                                      "history_total": 0, "registry": None,
                                      "error": f"could not be read (internal error {type(exc).__name__})"})
    return entry


def _channel(store, model: str, channel: str, trust_file: str | None, registry: Registry | None,
             moment: datetime) -> dict:
    from onnxcast.base.errors import OnnxcastError
    from onnxcast.base.untrusted import UntrustedInputError, loads_json
    from onnxcast.rollout.store import MAX_POINTER_BYTES

    key = store.channel_key(model, channel)
    entry: dict[str, Any] = {"channel": channel, "pointer": None, "device": None, "history": [],
                             "history_total": 0, "registry": None, "error": None}
    try:
        data = store.read(key, MAX_POINTER_BYTES)
    except OnnxcastError as exc:
        entry["error"] = text(exc, 1000)
        return entry
    if data is None:
        entry["error"] = "the pointer vanished while the page was read"
        return entry
    if len(data) > MAX_POINTER_BYTES:
        entry["error"] = f"{store.url(key)}: longer than {MAX_POINTER_BYTES:,} bytes; not read"
        entry["device"] = {"accepted": False, "reason": "refused: the pointer is over the size a device reads"}
        return entry
    check = device_check(store, model, channel, data, trust_file)
    entry["device"] = {"accepted": check["accepted"], "reason": text(check["reason"], 1000)}
    signed = check["signed"]
    if signed is None:  # refused: show what it claims, marked unverified
        try:
            parsed = loads_json(data, what=store.url(key), limit=MAX_POINTER_BYTES)
        except UntrustedInputError as exc:
            entry["error"] = text(exc, 1000)
            return entry
        inner = parsed.get("signed") if isinstance(parsed, dict) else None
        signed = inner if isinstance(inner, dict) else (parsed if isinstance(parsed, dict) else {})
    entry["pointer"] = _pointer(signed, moment, verified=check["accepted"])
    history = signed.get("history") if isinstance(signed.get("history"), list) else []
    moves = [h for h in history if isinstance(h, dict)]
    entry["history_total"] = len(moves)
    entry["history"] = [_move(h) for h in reversed(moves[-MAX_HISTORY:])]
    entry["registry"] = _registry(store, model, channel, entry["pointer"]["version"], check["manifest"], registry)
    entry["targets"] = channel_targets(check["manifest"], channel)
    return entry


def channel_targets(manifest: dict | None, channel: str) -> list[dict]:
    """The deployment targets of a channel in its verified manifest (docs/targets.md): each target a
    device may run (the channel's ``targets``: its artifact, family, variant, validated), then the
    others the channel's own artifact was judged on, with their status and why (unvalidated,
    unavailable, unsupported, failed). Empty for a manifest from before targets or not verified."""
    channels = manifest.get("channels") if isinstance(manifest, dict) else None
    choice = channels.get(channel) if isinstance(channels, dict) else None
    if not isinstance(choice, dict):
        return []
    artifacts = manifest.get("artifacts") if isinstance(manifest.get("artifacts"), dict) else {}
    shown, out = set(), []
    picks = choice.get("targets") if isinstance(choice.get("targets"), dict) else {}
    for name, pick in list(picks.items())[:MAX_CHANNELS]:
        if not isinstance(pick, dict):
            continue
        model = artifacts.get(pick.get("artifact"))
        source = artifacts.get((model or {}).get("compiled_from")) if isinstance(model, dict) else None
        evidence = ((source or model or {}).get("targets") or {}).get(name) or {}
        latency = (evidence.get("evidence") or {}).get("latency_note") if isinstance(evidence, dict) else None
        out.append({"name": text(name, 64), "status": "validated", "family": text(pick.get("family"), 64),
                    "variant": text(pick.get("variant"), 64), "artifact": text(pick.get("artifact"), 200),
                    "note": text(latency)})
        shown.add(name)
    own = artifacts.get(choice.get("artifact"))
    judged = own.get("targets") if isinstance(own, dict) and isinstance(own.get("targets"), dict) else {}
    for name, entry in list(judged.items())[:MAX_CHANNELS]:
        if name in shown or not isinstance(entry, dict):
            continue
        evidence = entry.get("evidence") if isinstance(entry.get("evidence"), dict) else {}
        out.append({"name": text(name, 64), "status": text(entry.get("status"), 32), "family": None,
                    "variant": None, "artifact": None, "note": text(evidence.get("reason"))})
    return out


def _pointer(signed: dict, moment: datetime, *, verified: bool) -> dict:
    from onnxcast.rollout.signing import parse_time

    expires = text(signed.get("expires"), 40)
    try:
        expired = moment >= parse_time(expires, "pointer")
    except Exception:  # RefusedError: not a UTC time
        expired = None
    return {"verified": verified, "version": text(signed.get("version"), 128), "family": text(signed.get("family"), 64),
            "variant": text(signed.get("variant"), 64), "counter": integer(signed.get("counter")),
            "expires": expires, "expired": expired, "action": text(signed.get("action"), 32),
            "updated_at": text(signed.get("updated_at"), 40), "updated_by": text(signed.get("updated_by")),
            "root_version": integer(signed.get("root_version"))}


def _move(entry: dict) -> dict:
    return {"action": text(entry.get("action"), 32), "version": text(entry.get("version"), 128),
            "from_version": text(entry.get("from_version"), 128), "by": text(entry.get("by")),
            "at": text(entry.get("at"), 40), "reason": text(entry.get("reason"))}


def _registry(store, model: str, channel: str, version: str | None, manifest: dict | None,
              registry: Registry | None) -> dict:
    """The registered version the manifest names, its link and its rollout/monitor tags."""
    from onnxcast.base.errors import OnnxcastError

    out: dict[str, Any] = {"version": None, "url": None, "run_id": None, "rollout": None, "monitor": None,
                           "error": None, "manifest_verified": manifest is not None}
    if manifest is None and version is not None:  # not verified: the manifest as it stands, for context only
        try:
            from onnxcast.rollout.store import check_name

            manifest = store.read_manifest(model, check_name("version", version))
        except OnnxcastError:
            manifest = None
    mlflow = manifest.get("mlflow") if isinstance(manifest, dict) else None
    raw = mlflow.get("version") if isinstance(mlflow, dict) else None
    registered = str(raw) if isinstance(raw, int | str) and not isinstance(raw, bool) else None
    if registered is None or not re.fullmatch(r"[1-9][0-9]{0,9}", registered):
        out["error"] = "the manifest names no registered MLflow version"
        return out
    out["version"] = registered
    run_id = mlflow.get("run_id")
    out["run_id"] = text(run_id, 64) if isinstance(run_id, str) else None
    if registry is None:
        out["error"] = "no MLflow registry configured"
        return out
    out["url"] = registry.version_url(model, registered)
    try:
        found = registry.version(model, registered)
    except Exception as exc:  # the registry is down or refuses: say so (its message, which may name the
        # server's address, goes to the API server's log only), keep the page
        log.warning("rollout page: reading %s version %s from the MLflow registry failed: %s", model, registered,
                    text(exc, 500))
        out["error"] = f"the MLflow registry could not be read ({type(exc).__name__})"
        return out
    if found is None:
        out["error"] = f"version {registered} of {model!r} is not in the MLflow registry"
        return out
    out["run_id"] = text(found.run_id, 64) or out["run_id"]
    out["rollout"] = rollout_state(found.tags.get(ROLLOUT_TAG.format(channel=channel)))
    out["monitor"] = monitor_state(found.tags.get(MONITOR_TAG.format(channel=channel)))
    return out


def _tag_json(value: str | None) -> tuple[dict | None, str | None]:
    from onnxcast.base.untrusted import UntrustedInputError, loads_json

    if value is None:
        return None, None
    try:
        parsed = loads_json(value, what="the tag", limit=MAX_TAG_BYTES, max_depth=8)
    except UntrustedInputError as exc:
        return None, text(exc)
    if not isinstance(parsed, dict):
        return None, "the tag is not a JSON object"
    return parsed, None


def rollout_state(value: str | None) -> dict | None:
    """The ``onnxcast.rollout.<channel>`` tag (part A): state pending|deployed|refused, at, reason, run_id."""
    parsed, problem = _tag_json(value)
    if parsed is None:
        return None if problem is None else {"state": "unreadable", "reason": problem, "at": None, "run_id": None}
    state = parsed.get("state")
    return {"state": state if state in ROLLOUT_STATES else "unknown", "at": text(parsed.get("at"), 40),
            "reason": text(parsed.get("reason")), "run_id": text(parsed.get("run_id"), 250)}


def monitor_state(value: str | None) -> dict | None:
    """The ``onnxcast.monitor.<channel>`` tag (part B): realised MASE against the holdout's."""
    parsed, problem = _tag_json(value)
    if parsed is None:
        return None if problem is None else {"unreadable": problem}
    ci = parsed.get("holdout_ci")
    ci = [number(v) for v in ci[:2]] if isinstance(ci, list) and len(ci) == 2 else None
    drift = parsed.get("drift")
    drift = [text(v, 64) for v in drift[:20]] if isinstance(drift, list) else []
    return {"at": text(parsed.get("at"), 40), "mase": number(parsed.get("mase")),
            "holdout_mase": number(parsed.get("holdout_mase")), "holdout_ci": ci,
            "p_value": number(parsed.get("p_value")), "degraded": flag(parsed.get("degraded")), "drift": drift,
            "origins": integer(parsed.get("origins")), "run_id": text(parsed.get("run_id"), 64),
            "from": text(parsed.get("from"), 40), "to": text(parsed.get("to"), 40), "unreadable": None}
