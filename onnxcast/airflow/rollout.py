"""Operators for the rollout store: promote a run or a registered version, roll a channel back.

The store is a local directory or an ``s3://`` prefix (``aws_default`` for endpoint,
region and keys). Each operator is one release (onnxcast.registry.release): the channel
pointer and the registry aliases (``champion`` and the channel's own) move together, or
nothing moves and the task fails on one line; the moves are recorded as tags (MLflow keeps
no alias history).

Manifests and channel pointers are signed with the release key(s) named by
``signing_key`` or ``$ONNXCAST_SIGNING_KEY`` (``awskms:<key>`` in production: the worker
asks KMS to sign and never holds the key). In the embedded one-machine mode (no store
URI, no key configured) a development key is made under ``$ONNXCAST_HOME/keys``; anywhere
else a missing key fails the task.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from onnxcast.airflow.steps import TrackedOperator, as_bool, load_config, readable, run_key
from onnxcast.base import environment
from onnxcast.base.errors import ConfigError, GateError, OnnxcastError
from onnxcast.base.files import onnxcast_home

if TYPE_CHECKING:
    from airflow.sdk import Context


def default_store_uri() -> str:
    """The rollout store from the deployment settings (onnxcast.airflow.settings)."""
    from onnxcast.airflow.settings import store_uri

    return store_uri()


def development_keys_dir() -> Path:
    return onnxcast_home() / "keys"


def _actor(context: Context) -> str:
    user = getattr(context.get("dag_run"), "triggering_user_name", None)
    return f"airflow:{run_key(context)}" + (f" ({user})" if user else "")


class _StoreOperator(TrackedOperator):
    def __init__(self, *, store_uri: str | None = None, signing_key: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store_uri = store_uri
        self.signing_key = signing_key

    def release_signers(self) -> list:
        """The release key(s): ``signing_key``, else ``$ONNXCAST_SIGNING_KEY``, else (embedded
        mode only) the development key under ``$ONNXCAST_HOME/keys``."""
        from onnxcast.airflow.settings import embedded, store_configured
        from onnxcast.rollout.signing import SIGNING_KEY_ENV, development_key, load_signers

        spec = None if self.signing_key in (None, "", "None") else str(self.signing_key)
        spec = spec or environment.get(SIGNING_KEY_ENV)
        try:
            if spec is None and embedded() and not store_configured(self.store_uri):
                path, created = development_key(development_keys_dir())
                self.log.warning("No signing key configured (%s): embedded mode signs with the development key "
                                 "%s%s; devices trust %s", SIGNING_KEY_ENV, path, " (made now)" if created else "",
                                 path.parent / "root.json")
                spec = str(path)
            return load_signers(spec)
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None

    def registry(self):
        """The registry a release keeps in step with the store: ``mlflow_default`` and the
        deployment's channel aliases (onnxcast.registry.release)."""
        from onnxcast.airflow.settings import channel_aliases
        from onnxcast.registry.release import Registry

        return Registry(self.mlflow_hook.tracking_uri, channel_aliases())

    def log_release(self, release) -> None:
        for move in release.aliases:
            self.log.info("Alias %s", move.text())

    def open_store(self):
        from onnxcast.airflow.settings import store_uri

        try:
            return self.s3_hook.open_store(store_uri(self.store_uri))
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None


class PromoteModelOperator(_StoreOperator):
    """Publish the run's report and ONNX files as store version ``version``, move ``channels``.

    Skips when ``decision`` (the champion/challenger XCom) says not to promote. With
    ``assemble_report`` the report is first rebuilt from this run's validation (the gates
    are evaluated again; a failed gate fails the task). Re-running is a no-op: the version
    is immutable and the pointers already point at it. Emits the task's outlet asset
    events with the promoted model and version as extra.
    """

    template_fields: Sequence[str] = ("run_dir", "version", "channels", "store_uri", "decision", "reason",
                                      "signing_key", "source", "alias")

    def __init__(self, *, run_dir: str, version: str, channels: Sequence[str] | str = ("edge", "cloud"),
                 decision: dict | str | None = None, assemble_report: bool = False, reason: str = "",
                 move_champion: bool = True, source: str | None = None, alias: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # a registry-sourced run (the alias watcher's request): skipped as superseded when the
        # alias has moved on from its version by the time the channel would move
        self.source = source
        self.alias = alias
        self.run_dir = run_dir
        self.version = version
        self.channels = channels
        self.decision = decision
        # Given at all (usually a template of the champion/challenger XCom): then it must render
        # to that decision, and anything else refuses to promote.
        self._decision_required = decision is not None
        self.assemble_report = assemble_report
        self.reason = reason
        self.move_champion = move_champion

    def _checked_decision(self) -> dict | None:
        """The champion/challenger decision, or None when none was asked for; refuse anything else.

        A template rendered without ``render_template_as_native_obj`` arrives as a string, and a
        missing XCom as None: promoting then would skip the comparison with the champion.
        """
        if not self._decision_required:
            return None
        decision = self.decision
        if not isinstance(decision, dict) or not isinstance(decision.get("promote"), bool):
            shown = " ".join(str(decision).split())[:80]
            raise AirflowFailException(
                f"refusing to promote: decision must be the champion/challenger result, a mapping with a "
                f"boolean 'promote', got {type(decision).__name__} {shown!r} (is the DAG's "
                "render_template_as_native_obj on, and did the decision task run?)")
        return decision

    def execute(self, context: Context) -> dict:
        decision = self._checked_decision()
        with self.workspace(context, self.run_dir) as work:
            return self._promote(context, work, decision)

    def _promote(self, context: Context, work: Path, decision: dict | None) -> dict:
        from onnxcast.registry.release import Superseded, promote

        cfg = load_config(work)
        self.link_mlflow_run(context, cfg.model_name)
        if decision is not None and not decision["promote"]:
            raise AirflowSkipException(f"not promoted: {decision.get('reason')}")
        if self.assemble_report:
            self._assemble(cfg)
        reason = self.reason or (decision or {}).get("reason") or "promoted by Airflow"
        store = self.open_store()
        signers = self.release_signers()
        # a registry-sourced run (the alias watcher's request) moves nothing when its alias has
        # moved on from this version by the time the channels would move (checked right before)
        expect = (str(self.alias), str(self.version)) \
            if self.source == REGISTRY_SOURCE and self.alias not in (None, "", "None") else None
        try:
            release = promote(work, store, cfg.model_name, self.channels, registry=self.registry(),
                              version=str(self.version), move_champion=as_bool(self.move_champion),
                              expect_alias=expect, actor=_actor(context), reason=reason, signers=signers)
        except Superseded as exc:
            context["ti"].xcom_push(key=SUPERSEDED_KEY, value=exc.now or "")
            raise AirflowSkipException(str(exc)) from None
        except OnnxcastError as exc:
            raise AirflowFailException(str(exc)) from None
        result = release.promotion
        manifest = store.url(store.version_key(cfg.model_name, result.version))
        self.log_release(release)
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = {"model": cfg.model_name, "version": result.version,
                                                      "channels": sorted(result.channels), "manifest": manifest}
        self.log.info("Promoted %s v%s to %s in %s (%s)", cfg.model_name, result.version, readable(result.channels),
                      result.store, "changed" if result.changed else "already there: nothing to do")
        return {**result.as_xcom(), "manifest": manifest}

    def _assemble(self, cfg) -> None:
        from onnxcast.base.files import read_json, write_json
        from onnxcast.pipeline.run import assemble_report
        from onnxcast.registry.plan import challengers

        staged = read_json(cfg.layout.staged)
        try:
            report = assemble_report(cfg, challengers(cfg.run_dir))
        except GateError as exc:
            raise AirflowFailException(f"gates re-checked and failed: {exc}") from None
        report["mlflow"] = staged["mlflow"]
        write_json(cfg.layout.report, report)


class StageRegisteredVersionOperator(TrackedOperator):
    """Download a registered version (number or alias) into a fresh run directory, laid out as
    the run that produced it, and prepare that run's data window again, so the validate step
    can re-check its gates before promotion. XCom: ``run_dir``, ``families``, ``version``."""

    template_fields: Sequence[str] = ("model_name", "ref", "run_root")

    def __init__(self, *, model_name: str, ref: str, run_root: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.ref = ref
        self.run_root = run_root

    def execute(self, context: Context) -> dict:
        from onnxcast.airflow.settings import run_root
        from onnxcast.registry.fetch import stage_version
        from onnxcast.registry.tracking import TrackingError
        from onnxcast.runstore import RunStore

        run_url = RunStore(run_root(self.run_root)).run_url(context["dag_run"].dag_id, context["run_id"])
        with self.workspace(context, run_url, stage=False) as work:
            try:
                staged = stage_version(self.model_name, str(self.ref), work,
                                       tracking_uri=self.mlflow_hook.tracking_uri,
                                       s3_settings=self.s3_hook.get_settings())
            except (TrackingError, OnnxcastError) as exc:
                raise AirflowFailException(str(exc)) from None
        context["ti"].xcom_push(key="run_dir", value=run_url)
        self.link_mlflow_run(context, self.model_name)
        self.log.info("Staged %s v%s (%s) in %s", self.model_name, staged["version"], staged["family"], run_url)
        return {"run_dir": run_url, "version": staged["version"], "family": staged["family"]}


class RollbackChannelOperator(_StoreOperator):
    """Move a channel back to its previous version (or ``to_version``); never deletes a version.

    With ``move_champion`` the registry alias ``champion`` follows the channel.
    """

    template_fields: Sequence[str] = ("model_name", "channel", "to_version", "store_uri", "reason", "move_champion",
                                      "signing_key")

    def __init__(self, *, model_name: str, channel: str, reason: str, to_version: str | None = None,
                 move_champion: bool | str = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.channel = channel
        self.reason = reason
        self.to_version = to_version
        self.move_champion = move_champion

    def execute(self, context: Context) -> dict:
        from onnxcast.registry.release import rollback

        store = self.open_store()
        done = self._done_by_earlier_try(store, _actor(context))
        if done is not None:
            self.log.info("Channel %s of %s was rolled back to v%s by an earlier try: nothing to do",
                          self.channel, self.model_name, done["version"])
            return {"model": self.model_name, "channel": self.channel, "version": done["version"],
                    "from_version": done.get("from_version"), "changed": False}
        signers = self.release_signers()
        try:
            to_version = None if self.to_version in (None, "", "None") else str(self.to_version)
            release = rollback(store, self.model_name, self.channel, registry=self.registry(), to_version=to_version,
                               move_champion=as_bool(self.move_champion), actor=_actor(context),
                               reason=self.reason, signers=signers)
        except OnnxcastError as exc:
            raise AirflowFailException(str(exc)) from None
        self.log_release(release)
        ((before, now),) = release.channels.values()
        self.log.info("%s", release.line())
        return {"model": self.model_name, "channel": self.channel, "version": now, "from_version": before,
                "changed": bool(release.moved)}

    def _done_by_earlier_try(self, store, actor: str) -> dict | None:
        """The history entry of this task's own rollback, when an earlier try already made it
        (a second rollback would walk one version further back)."""
        from onnxcast.base.errors import StoreError

        try:
            pointer = store.read_channel(self.model_name, self.channel).value or {}
        except StoreError:
            return None
        history = pointer.get("history") or []
        last = history[-1] if history else {}
        if last.get("action") == "rollback" and last.get("by") == actor and last.get("reason") == self.reason \
                and last.get("version") == pointer.get("version"):
            return last
        return None


class RefreshChannelsOperator(_StoreOperator):
    """Re-sign the pointers of ``channels`` (new counter and expiry, same version), so
    devices keep trusting a channel that has not moved: a pointer past its expiry is
    refused (freeze protection). A channel that does not exist yet is skipped."""

    template_fields: Sequence[str] = ("model_name", "channels", "store_uri", "expires_days", "signing_key")

    def __init__(self, *, model_name: str, channels: Sequence[str] | str = ("edge", "cloud"),
                 expires_days: float | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.channels = channels
        self.expires_days = expires_days

    def execute(self, context: Context) -> dict:
        from onnxcast.registry.release import refresh

        store = self.open_store()
        channels = [self.channels] if isinstance(self.channels, str) else list(self.channels)
        days = None if self.expires_days in (None, "", "None") else float(self.expires_days)
        done = {}
        for channel in channels:
            try:
                exists = store.read_channel(self.model_name, channel).value is not None
            except OnnxcastError as exc:
                raise AirflowFailException(str(exc)) from None
            if not exists:
                self.log.info("Channel %s of %s does not exist: nothing to refresh", channel, self.model_name)
                continue
            try:
                value = refresh(store, self.model_name, channel, signers=self.release_signers(), expires_days=days,
                                actor=_actor(context)).signed
            except OnnxcastError as exc:
                raise AirflowFailException(str(exc)) from None
            done[channel] = {"version": value["version"], "counter": value["counter"], "expires": value["expires"]}
            self.log.info("Channel %s of %s: v%s re-signed, counter %s, expires %s", channel, self.model_name,
                          value["version"], value["counter"], value["expires"])
        return {"model": self.model_name, "channels": done}


# --- registry-driven rollout (docs/airflow.md#registry-driven-rollout) ----------------------

FAILURE_KEY = "failure"
FAILURE_KIND_KEY = "failure_kind"  # "refused" (AirflowFailException: gate, verification, conflict) or "failed"
SUPERSEDED_KEY = "superseded"
REGISTRY_SOURCE = "registry"
PROMOTE_TASKS = ("stage_version", "validate", "promote")


def remember_failure(context: Context) -> None:
    """Failure callback of the promote DAG's tasks: the first line of the error as XCom
    ``failure``, for ``report_back`` to write on the model version."""
    exception = context.get("exception")
    text = str(exception).strip().splitlines()[0] if exception is not None and str(exception).strip() else ""
    line = text or (type(exception).__name__ if exception is not None else "the task was killed")
    # the operators raise AirflowFailException for what retrying cannot change (a gate, a
    # verification, a conflict, a setting); anything else is an outage: "failed", asked again
    kind = "refused" if isinstance(exception, AirflowFailException) else "failed"
    try:
        context["ti"].xcom_push(key=FAILURE_KEY, value=line[:1000])
        context["ti"].xcom_push(key=FAILURE_KIND_KEY, value=kind)
    except Exception as exc:  # noqa: BLE001 - a callback must not fail the callback runner
        _log().warning("could not record the failure of %s: %s", context.get("run_id"), exc)


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
    asset events: only events the watcher emitted (:func:`event_source_fault`), each payload
    checked again (it came from the registry) and against the registry read again now
    (``client``: :func:`~onnxcast.registry.alias_rollout.check_request`), duplicates once;
    anything else logged in one line and ignored."""
    from onnxcast.pipeline.config import CHANNELS
    from onnxcast.registry.alias_rollout import (
        ALIAS,
        MODEL_NAME,
        VERSION,
        check_request,
        promote_run_id,
    )

    out: dict[str, dict] = {}
    for refs in (events or {}).values():
        for ref in refs:
            fault = event_source_fault(ref)
            if fault is not None:
                _log().warning("ignored an alias event %s: %.300s", fault, getattr(ref, "extra", None))
                continue
            payload = ((getattr(ref, "extra", None) or {}).get("payload")) or {}
            model, channel, version, alias, requested_at = (
                value if isinstance(value := payload.get(key), str) else ""
                for key in ("model", "channel", "version", "alias", "requested_at"))
            if not (MODEL_NAME.fullmatch(model) and channel in CHANNELS and VERSION.fullmatch(version)
                    and ALIAS.fullmatch(alias)):
                _log().warning("ignored an alias event that is not a valid request: %.300s", payload)
                continue
            run_id = promote_run_id(model, channel, version, requested_at)
            if run_id in out:
                continue
            fault = check_request(client, model, channel, alias, version, run_id)
            if fault is not None:
                _log().warning("ignored the alias event of %s: the registry no longer asks for it (%s)", run_id, fault)
                continue
            out[run_id] = {"trigger_run_id": run_id, "conf": {
                "model_name": model, "version": version, "channels": [channel], "source": REGISTRY_SOURCE,
                "alias": alias, "reason": f"alias {alias} set to v{version} in the MLflow registry"}}
    for run_id in out:
        _log().info("requesting onnxcast_promote run %s", run_id)
    return list(out.values())


def dispatch_requests(events: Any) -> list[dict]:
    """:func:`promote_requests` against the registry of ``mlflow_default`` (the dispatcher's task)."""
    from onnxcast.airflow.hooks import MlflowHook
    from onnxcast.registry.tracking import client_for

    return promote_requests(events, client_for(MlflowHook().tracking_uri))


class ReportRolloutOperator(_StoreOperator):
    """Last task of ``onnxcast_promote`` (trigger rule ``all_done``): writes the outcome on the
    model version (tag ``onnxcast.rollout.<channel>``: ``deployed``; ``refused`` with the
    first line of the failure when a gate, verification or conflict refused it; ``failed``
    for an infrastructure error, which the watcher asks again after its pending expiry;
    ``superseded`` when the alias moved on before the channel moved) and, on a refusal of a
    registry-sourced run, moves the alias back to the version the channel serves (deletes it
    when the channel has none): the alias never claims a deployment that did not happen.
    Fails the task on a refusal or failure, so the run shows failed."""

    template_fields: Sequence[str] = ("model_name", "ref", "channels", "source", "alias", "store_uri")

    def __init__(self, *, model_name: str, ref: str, channels: Sequence[str] | str, source: str | None = None,
                 alias: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.model_name = model_name
        self.ref = ref
        self.channels = channels
        self.source = source
        self.alias = alias

    def execute(self, context: Context) -> dict:
        from onnxcast.registry.alias_rollout import (
            DEPLOYED,
            FAILED,
            REFUSED,
            SUPERSEDED,
            write_rollout_state,
        )

        ti = context["ti"]
        channels = [self.channels] if isinstance(self.channels, str) else list(self.channels)
        promoted = ti.xcom_pull(task_ids="promote")
        version = self._version(ti)
        reason = self._failure(ti) if not isinstance(promoted, dict) else "the promotion did not move this channel"
        registry_run = self.source == REGISTRY_SOURCE and self.alias not in (None, "", "None")
        if version is None:
            raise AirflowFailException(f"refused, and {self.model_name} {self.ref!r} names no registered version "
                                       f"to write it on: {reason}")
        registry = self.registry()
        client = registry.client
        extra = {"alias": str(self.alias)} if registry_run else {}
        superseded = ti.xcom_pull(task_ids="promote", key=SUPERSEDED_KEY) if not isinstance(promoted, dict) else None
        if superseded is not None:
            why = f"alias {self.alias} moved on to {'v' + superseded if superseded else 'no version'} first"
            for channel in channels:
                write_rollout_state(client, self.model_name, version, channel, SUPERSEDED, run_id=context["run_id"],
                                    reason=why, source=self.source or "manual", **extra)
            self.log.info("%s v%s on %s: superseded (%s)", self.model_name, version, readable(channels), why)
            return {"model": self.model_name, "version": version, "channels": channels, "state": SUPERSEDED}
        outage = not isinstance(promoted, dict) and self._failure_kind(ti) == FAILED
        refused = []
        for channel in channels:
            state = DEPLOYED if isinstance(promoted, dict) and channel in (promoted.get("channels") or {}) else REFUSED
            if state == REFUSED and outage:
                write_rollout_state(client, self.model_name, version, channel, FAILED, run_id=context["run_id"],
                                    reason=reason, source=self.source or "manual", **extra)
                self.log.info("%s v%s on %s: failed, asked again later (%s)", self.model_name, version, channel,
                              reason)
                refused.append(channel)
                continue
            serving = self._serving(channel) if state == REFUSED else version
            why = reason if state == REFUSED else "promoted"
            if state == REFUSED and serving == version:  # another run (a duplicate request) moved it
                state, why = DEPLOYED, f"the channel serves it (this run: {reason})"
            write_rollout_state(client, self.model_name, version, channel, state, run_id=context["run_id"],
                                reason=why, source=self.source or "manual", **extra)
            self.log.info("%s v%s on %s: %s%s", self.model_name, version, channel, state,
                          f" ({reason})" if state == REFUSED else "")
            if state == REFUSED:
                refused.append(channel)
            if state == REFUSED and registry_run:
                self.log.info("%s", registry.revert(self.model_name, str(self.alias), version, serving))
        if refused:
            raise AirflowFailException(f"{'failed' if outage else 'refused'} {self.model_name} v{version} for "
                                       f"{readable(refused)}: {reason}")
        return {"model": self.model_name, "version": version, "channels": channels, "state": DEPLOYED}

    def _version(self, ti) -> str | None:
        from onnxcast.registry.tracking import alias_version

        staged = ti.xcom_pull(task_ids="stage_version")
        if isinstance(staged, dict) and staged.get("version"):
            return str(staged["version"])
        ref = str(self.ref).strip()
        return ref if ref.isdigit() else alias_version(self.model_name, ref, self.mlflow_hook.tracking_uri)

    def _failure(self, ti) -> str:
        for task_id in PROMOTE_TASKS:
            line = ti.xcom_pull(task_ids=task_id, key=FAILURE_KEY)
            if line:
                return f"{task_id}: {line}"
        return "the promotion did not complete (an upstream task did not succeed)"

    def _failure_kind(self, ti) -> str:
        """"refused" or "failed" of the first task that recorded a failure; "failed" when none
        did (a task killed, an upstream that never ran: nothing refused the version)."""
        for task_id in PROMOTE_TASKS:
            if ti.xcom_pull(task_ids=task_id, key=FAILURE_KEY):
                return ti.xcom_pull(task_ids=task_id, key=FAILURE_KIND_KEY) or "refused"
        return "failed"

    def _serving(self, channel: str) -> str | None:
        pointer = self.open_store().read_channel(self.model_name, channel).value
        return None if pointer is None else str(pointer.get("version"))


def _log():
    import logging

    return logging.getLogger(__name__)
