"""The registry-driven rollout (docs/airflow.md#registry-driven-rollout), its decisions: which of
the alias watcher's events become ``onnxcast_promote`` runs, and what such a run writes back on
the model version when it ends.

The alias watcher (onnxcast.airflow.triggers) looks at the registry and the store
(:func:`watch_once`) and emits an asset event per request; the
dispatcher turns the events into runs (:func:`promote_requests`: only the watcher's own events,
each payload checked and the registry read again). ``onnxcast_promote``'s last task writes the
outcome (:func:`report_rollout`): ``deployed``, ``refused`` (a gate, a verification, a conflict;
the alias of a registry-sourced run is moved back to what the channel serves), ``failed`` (an
outage: the watcher asks again after its pending expiry) or ``superseded`` (the alias moved on
before the channel moved). The operators of onnxcast.airflow.rollout read the XComs and call
these; the outcome is the same without Airflow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from onnxcast.pipeline.config import CHANNELS
from onnxcast.registry.alias_rollout import (
    ALIAS,
    DEPLOYED,
    FAILED,
    MODEL_NAME,
    PENDING,
    REFUSED,
    REVERT,
    SUPERSEDED,
    VERSION,
    check_request,
    promote_run_id,
    read_registry,
    read_serving,
    reconcile,
    write_rollout_state,
)
from onnxcast.registry.release import REGISTRY_SOURCE, Registry, ReleaseError
from onnxcast.registry.tracking import alias_version
from onnxcast.rollout.store import RolloutStore

log = logging.getLogger(__name__)

PROMOTE_TASKS = ("stage_version", "validate", "promote")  # the tasks whose failure report_back names
REFUSED_KIND, FAILED_KIND = "refused", "failed"  # a task's failure: retrying cannot change it | an outage


class RolloutRefused(ReleaseError):
    """The run did not deploy the version (refused or failed); the outcome is written on it."""


@dataclass(frozen=True)
class PromoteRun:
    """What the tasks of one ``onnxcast_promote`` run left for its report: ``promoted``, the
    promote task's result (None: it did not succeed); ``superseded``, the version the alias
    names now when the promotion was superseded ("" for none, None: not superseded);
    ``failures``, task id -> (first line of its failure, its kind), for the tasks that recorded
    one; ``staged_version``, the version the staging task resolved."""

    promoted: dict | None = None
    superseded: str | None = None
    failures: Mapping[str, tuple[str | None, str | None]] = field(default_factory=dict)
    staged_version: str | None = None

    def failure(self) -> tuple[str, str]:
        """(why, kind) of the first task in :data:`PROMOTE_TASKS` that recorded a failure:
        ``"task: line"`` and its kind ("refused" when it recorded none). None recorded (a task
        killed, an upstream that never ran): nothing refused the version, so "failed"."""
        for task_id in PROMOTE_TASKS:
            line, kind = self.failures.get(task_id) or (None, None)
            if line:
                return f"{task_id}: {line}", kind or REFUSED_KIND
        return "the promotion did not complete (an upstream task did not succeed)", FAILED_KIND


def rollout_version(model: str, ref: str, run: PromoteRun, tracking_uri: str | None) -> str | None:
    """The registered version the run was about: the staged one, else ``ref`` when it is a
    number, else the version the alias ``ref`` names now (None: none)."""
    if run.staged_version:
        return str(run.staged_version)
    ref = str(ref).strip()
    return ref if ref.isdigit() else alias_version(model, ref, tracking_uri)


def report_rollout(registry: Registry, model: str, ref: str, channels: Sequence[str] | str, run: PromoteRun, *,
                   run_id: str, source: str | None, alias: str | None,
                   serving: Callable[[str], str | None]) -> dict:
    """Write the run's outcome on the model version, one tag ``onnxcast.rollout.<channel>`` per
    channel, and return ``{model, version, channels, state}`` (``deployed`` or ``superseded``).

    A channel the promotion did not move is ``refused`` (``failed`` when the first failure was
    an outage), unless ``serving(channel)`` shows it serves the version anyway (a duplicate
    request's run moved it: ``deployed``). On a refusal of a registry-sourced run the alias goes
    back to what the channel serves (:meth:`Registry.revert`). RolloutRefused, naming the
    channels and why, when any channel was refused or failed."""
    channels = [channels] if isinstance(channels, str) else list(channels)
    promoted = run.promoted if isinstance(run.promoted, dict) else None
    reason = run.failure()[0] if promoted is None else "the promotion did not move this channel"
    registry_run = source == REGISTRY_SOURCE and alias not in (None, "", "None")
    version = rollout_version(model, ref, run, registry.tracking_uri)
    if version is None:
        raise RolloutRefused(f"refused, and {model} {ref!r} names no registered version to write it on: {reason}")
    write = _writer(registry, model, version, run_id=run_id, source=source or "manual",
                    extra={"alias": str(alias)} if registry_run else {})
    if promoted is None and run.superseded is not None:
        why = f"alias {alias} moved on to {'v' + run.superseded if run.superseded else 'no version'} first"
        for channel in channels:
            write(channel, SUPERSEDED, why)
        log.info("%s v%s on %s: superseded (%s)", model, version, ", ".join(channels), why)
        return {"model": model, "version": version, "channels": channels, "state": SUPERSEDED}
    outage = promoted is None and run.failure()[1] == FAILED_KIND
    refused = [channel for channel in channels
               if not _channel_outcome(registry, write, model, version, channel, promoted, reason, outage=outage,
                                       revert_alias=str(alias) if registry_run else None, serving=serving)]
    if refused:
        raise RolloutRefused(f"{'failed' if outage else 'refused'} {model} v{version} for {', '.join(refused)}: "
                             f"{reason}")
    return {"model": model, "version": version, "channels": channels, "state": DEPLOYED}


def _channel_outcome(registry: Registry, write: Callable[[str, str, str], None], model: str, version: str,
                     channel: str, promoted: dict | None, reason: str, *, outage: bool, revert_alias: str | None,
                     serving: Callable[[str], str | None]) -> bool:
    """Write one channel's state; True when it is deployed."""
    if promoted is not None and channel in (promoted.get("channels") or {}):
        write(channel, DEPLOYED, "promoted")
        log.info("%s v%s on %s: %s", model, version, channel, DEPLOYED)
        return True
    if outage:
        write(channel, FAILED, reason)
        log.info("%s v%s on %s: failed, asked again later (%s)", model, version, channel, reason)
        return False
    served = serving(channel)
    if served == version:  # another run (a duplicate request) moved it
        write(channel, DEPLOYED, f"the channel serves it (this run: {reason})")
        log.info("%s v%s on %s: %s", model, version, channel, DEPLOYED)
        return True
    write(channel, REFUSED, reason)
    log.info("%s v%s on %s: %s (%s)", model, version, channel, REFUSED, reason)
    if revert_alias is not None:
        log.info("%s", registry.revert(model, revert_alias, version, served))
    return False


def _writer(registry: Registry, model: str, version: str, *, run_id: str, source: str,
            extra: dict) -> Callable[[str, str, str], None]:
    def write(channel: str, state: str, reason: str) -> None:
        write_rollout_state(registry.client, model, version, channel, state, run_id=run_id, reason=reason,
                            source=source, **extra)

    return write


# --- the watcher: what the aliases ask for -> asset events ---------------------------------------

def watch_once(registry: Registry, store: RolloutStore, now: datetime | None = None) -> tuple[list[dict], list[str]]:
    """One look of the alias watcher at the registry and the store
    (onnxcast.registry.alias_rollout.reconcile over ``registry.channel_aliases``): the payloads
    of the new requests, each marked pending on its model version first, and notes on what it
    did. A request for a version refused before is not asked again: its alias goes back to what
    the channel serves (:meth:`Registry.revert`)."""
    now = now or datetime.now(UTC)
    aliases = registry.channel_aliases
    client = registry.client
    models = read_registry(client, aliases)

    def served(model: str, channel: str) -> str | None:
        value = store.read_channel(model, channel).value
        return None if value is None else str(value.get("version"))

    requests, notes = reconcile(models, read_serving(models, aliases, served), aliases, now)
    payloads = []
    for request in requests:
        if request.action == REVERT:  # refused before: the alias must not claim it
            notes.append(f"{request.model}: " + registry.revert(request.model, request.alias, request.version,
                                                                request.serving))
            continue
        payload = request.payload(now.strftime("%Y%m%dT%H%M%SZ"))
        write_rollout_state(client, request.model, request.version, request.channel, PENDING, at=now,
                            reason=f"alias {request.alias} set to v{request.version} in the MLflow registry",
                            run_id=payload["run_id"], alias=request.alias, serving=request.serving)
        notes.append(f"{request.model}@{request.alias} names v{request.version}, channel {request.channel} "
                     f"serves {'v' + request.serving if request.serving else 'nothing'}: promotion requested")
        payloads.append(payload)
    return payloads, notes


# --- the dispatcher: the watcher's events -> onnxcast_promote runs ------------------------------

def event_source_fault(ref: Any, *, dag_id: str | None = None, task_id: str | None = None) -> str | None:
    """Why an asset event is not from the expected producer (None: it is). ``dag_id``/``task_id``
    None: the alias watcher's trigger (extra ``from_trigger``, no source task); else that task.
    An event POSTed to ``/api/v2/assets/events`` (asset permissions only; Airflow adds
    ``from_rest_api`` to its extra) is never taken, whatever else its body says."""
    extra = getattr(ref, "extra", None) or {}
    source = (getattr(ref, "source_dag_id", None), getattr(ref, "source_task_id", None))
    if not isinstance(extra, dict) or extra.get("from_rest_api"):
        return "posted through the REST API"
    if dag_id is None and (extra.get("from_trigger") is not True or source != (None, None)):
        return f"not from the alias watcher (source {source[0]}.{source[1]})"
    if dag_id is not None and source != (dag_id, task_id):
        return f"from {source[0]}.{source[1]}, not {dag_id}.{task_id}"
    return None


def promote_requests(events: Any, client: Any) -> list[dict]:
    """The ``onnxcast_promote`` triggers (``trigger_run_id``, ``conf``) of the alias watcher's
    asset events (asset -> events): only events the watcher emitted (:func:`event_source_fault`),
    each payload checked again (it came from the registry) and against the registry read again
    now (``client``: :func:`~onnxcast.registry.alias_rollout.check_request`), duplicates once;
    anything else logged in one line and ignored."""
    out: dict[str, dict] = {}
    for refs in (events or {}).values():
        for ref in refs:
            request = _request_of(ref)
            if request is None or request["trigger_run_id"] in out:
                continue
            conf, run_id = request["conf"], request["trigger_run_id"]
            fault = check_request(client, conf["model_name"], conf["channels"][0], conf["alias"], conf["version"],
                                  run_id)
            if fault is not None:
                log.warning("ignored the alias event of %s: the registry no longer asks for it (%s)", run_id, fault)
                continue
            out[run_id] = request
    for run_id in out:
        log.info("requesting onnxcast_promote run %s", run_id)
    return list(out.values())


def _request_of(ref: Any) -> dict | None:
    """The trigger an event asks for, None (logged) when it is not the watcher's or not valid."""
    fault = event_source_fault(ref)
    if fault is not None:
        log.warning("ignored an alias event %s: %.300s", fault, getattr(ref, "extra", None))
        return None
    payload = ((getattr(ref, "extra", None) or {}).get("payload")) or {}
    model, channel, version, alias, requested_at = (
        value if isinstance(value := payload.get(key), str) else ""
        for key in ("model", "channel", "version", "alias", "requested_at"))
    if not (MODEL_NAME.fullmatch(model) and channel in CHANNELS and VERSION.fullmatch(version)
            and ALIAS.fullmatch(alias)):
        log.warning("ignored an alias event that is not a valid request: %.300s", payload)
        return None
    return {"trigger_run_id": promote_run_id(model, channel, version, requested_at), "conf": {
        "model_name": model, "version": version, "channels": [channel], "source": REGISTRY_SOURCE,
        "alias": alias, "reason": f"alias {alias} set to v{version} in the MLflow registry"}}
