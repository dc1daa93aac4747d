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
from onnxcast.base.errors import ConfigError, OnnxcastError
from onnxcast.base.files import onnxcast_home
from onnxcast.registry.registry_rollout import promote_requests

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
    """Publish the run's report and ONNX files as store version ``version``, move ``channels``
    (onnxcast.registry.release.promote_run).

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

    def execute(self, context: Context) -> dict:
        from onnxcast.registry.release import NotPromoted, Superseded, checked_decision, promote_run

        try:
            decision = checked_decision(self.decision, required=self._decision_required)
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        with self.workspace(context, self.run_dir) as work:
            cfg = load_config(work)
            self.link_mlflow_run(context, cfg.model_name)
            try:
                release = promote_run(cfg, self.open_store, self.channels, registry=self.registry,
                                      version=str(self.version), decision=decision, reassemble=self.assemble_report,
                                      reason=self.reason, move_champion=as_bool(self.move_champion),
                                      source=self.source, alias=self.alias, actor=_actor(context),
                                      signers=self.release_signers)
            except NotPromoted as exc:
                raise AirflowSkipException(str(exc)) from None
            except Superseded as exc:
                context["ti"].xcom_push(key=SUPERSEDED_KEY, value=exc.now or "")
                raise AirflowSkipException(str(exc)) from None
            except OnnxcastError as exc:
                raise AirflowFailException(str(exc)) from None
        result = release.promotion
        self.log_release(release)
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = {"model": cfg.model_name, "version": result.version,
                                                      "channels": sorted(result.channels), "manifest": release.manifest}
        self.log.info("Promoted %s v%s to %s in %s (%s)", cfg.model_name, result.version, readable(result.channels),
                      result.store, "changed" if result.changed else "already there: nothing to do")
        return {**result.as_xcom(), "manifest": release.manifest}


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

    With ``move_champion`` the registry alias ``champion`` follows the channel. A retry after a
    try that moved the channel does nothing (onnxcast.registry.release.rollback_once).
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
        from onnxcast.registry.release import rollback_once

        try:
            release = rollback_once(self.open_store(), self.model_name, self.channel, registry=self.registry,
                                    to_version=self.to_version, move_champion=as_bool(self.move_champion),
                                    actor=_actor(context), reason=self.reason, signers=self.release_signers)
        except OnnxcastError as exc:
            raise AirflowFailException(str(exc)) from None
        ((before, now),) = release.channels.values()
        if release.repeated:
            self.log.info("Channel %s of %s was rolled back to v%s by an earlier try: nothing to do",
                          self.channel, self.model_name, now)
        else:
            self.log_release(release)
            self.log.info("%s", release.line())
        return {"model": self.model_name, "channel": self.channel, "version": now, "from_version": before,
                "changed": bool(release.moved)}


class RefreshChannelsOperator(_StoreOperator):
    """Re-sign the pointers of ``channels`` (new counter and expiry, same version), so
    devices keep trusting a channel that has not moved: a pointer past its expiry is
    refused (freeze protection). A channel that does not exist yet is skipped
    (onnxcast.registry.release.refresh_channels)."""

    template_fields: Sequence[str] = ("model_name", "channels", "store_uri", "expires_days", "signing_key")

    def __init__(self, *, model_name: str, channels: Sequence[str] | str = ("edge", "cloud"),
                 expires_days: float | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.channels = channels
        self.expires_days = expires_days

    def execute(self, context: Context) -> dict:
        from onnxcast.registry.release import refresh_channels

        try:
            releases = refresh_channels(self.open_store(), self.model_name, self.channels,
                                        signers=self.release_signers, expires_days=self.expires_days,
                                        actor=_actor(context))
        except OnnxcastError as exc:
            raise AirflowFailException(str(exc)) from None
        done = {}
        for channel, release in releases.items():
            if release is None:
                self.log.info("Channel %s of %s does not exist: nothing to refresh", channel, self.model_name)
                continue
            value = release.signed
            done[channel] = {"version": value["version"], "counter": value["counter"], "expires": value["expires"]}
            self.log.info("Channel %s of %s: v%s re-signed, counter %s, expires %s", channel, self.model_name,
                          value["version"], value["counter"], value["expires"])
        return {"model": self.model_name, "channels": done}


# --- registry-driven rollout (docs/airflow.md#registry-driven-rollout) ----------------------
# The decisions live in onnxcast.registry.registry_rollout; here the XComs they read.

FAILURE_KEY = "failure"
FAILURE_KIND_KEY = "failure_kind"  # "refused" (AirflowFailException: gate, verification, conflict) or "failed"
SUPERSEDED_KEY = "superseded"


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


def dispatch_requests(events: Any) -> list[dict]:
    """:func:`promote_requests` against the registry of ``mlflow_default`` (the dispatcher's task)."""
    from onnxcast.airflow.hooks import MlflowHook
    from onnxcast.registry.tracking import client_for

    hook = MlflowHook()
    with hook.login():  # the connection's login for these calls only
        return promote_requests(events, client_for(hook.tracking_uri))


class ReportRolloutOperator(_StoreOperator):
    """Last task of ``onnxcast_promote`` (trigger rule ``all_done``): writes the outcome on the
    model version (onnxcast.registry.registry_rollout.report_rollout: tag
    ``onnxcast.rollout.<channel>``: ``deployed``; ``refused`` with the first line of the failure
    when a gate, verification or conflict refused it; ``failed`` for an infrastructure error,
    which the watcher asks again after its pending expiry; ``superseded`` when the alias moved on
    before the channel moved) and, on a refusal of a registry-sourced run, moves the alias back
    to the version the channel serves (deletes it when the channel has none): the alias never
    claims a deployment that did not happen. Fails the task on a refusal or failure, so the run
    shows failed."""

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
        from onnxcast.registry.registry_rollout import RolloutRefused, report_rollout

        try:
            return report_rollout(self.registry(), self.model_name, str(self.ref), self.channels,
                                  self._promote_run(context["ti"]), run_id=context["run_id"], source=self.source,
                                  alias=self.alias, serving=self._serving)
        except RolloutRefused as exc:
            raise AirflowFailException(str(exc)) from None

    @staticmethod
    def _promote_run(ti):
        """What the run's tasks left in XCom."""
        from onnxcast.registry.registry_rollout import PROMOTE_TASKS, PromoteRun

        staged = ti.xcom_pull(task_ids="stage_version")
        return PromoteRun(promoted=ti.xcom_pull(task_ids="promote"),
                          superseded=ti.xcom_pull(task_ids="promote", key=SUPERSEDED_KEY),
                          failures={task: (ti.xcom_pull(task_ids=task, key=FAILURE_KEY),
                                           ti.xcom_pull(task_ids=task, key=FAILURE_KIND_KEY))
                                    for task in PROMOTE_TASKS},
                          staged_version=staged.get("version") if isinstance(staged, dict) else None)

    def _serving(self, channel: str) -> str | None:
        pointer = self.open_store().read_channel(self.model_name, channel).value
        return None if pointer is None else str(pointer.get("version"))


def _log():
    import logging

    return logging.getLogger(__name__)
