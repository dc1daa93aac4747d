"""The registry alias watcher: an Airflow Asset watcher whose trigger, in the triggerer,
reads the MLflow registry every ``ONNXCAST_REGISTRY_POLL_SECONDS`` and compares each
channel alias (``ONNXCAST_CHANNEL_ALIASES``) with the version the channel's pointer in the
rollout store names. A mismatch is a promotion request: the trigger marks the version
``pending`` (tag ``onnxcast.rollout.<channel>``) and emits an event on
:data:`REGISTRY_ALIAS`; the DAG ``onnxcast_registry_rollout`` is scheduled on it and
triggers the gated ``onnxcast_promote``.

What a channel serves comes from the rollout store itself (the pointer devices follow), not
from a copy in the registry: the triggerer holds the deployment's environment and resolves
Airflow connections (Airflow 3.3.2 answers a sync ``get_connection`` from a worker thread
through the trigger runner's comms), so the pointer is read with the same ``aws_default``
settings as a task; a copy would drift from the store when a pointer moves outside Airflow.

The module stays import-light (DAG files import :data:`REGISTRY_ALIAS`): mlflow and boto3
are imported in the poll, which runs in a thread (``asyncio.to_thread``) off the
triggerer's event loop. A registry or store outage logs one line (again only when the error
changes) and the trigger keeps polling.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.sdk import Asset, AssetWatcher
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

TRIGGER_PATH = "onnxcast.airflow.triggers.RegistryAliasTrigger"
HOOKS_SECONDS = 600.0


class RegistryAliasTrigger(BaseEventTrigger):
    """Emits one event per (model, channel) whose channel alias names a version the channel
    does not serve. Payload: ``{"model", "channel", "alias", "version", "serving",
    "requested_at", "run_id"}``. ``channel_aliases``/``poll_seconds``/``store_uri`` None:
    the deployment settings, read in the triggerer."""

    def __init__(self, *, channel_aliases: dict[str, str] | None = None, poll_seconds: float | None = None,
                 store_uri: str | None = None, mlflow_conn_id: str | None = "mlflow_default",
                 aws_conn_id: str | None = "aws_default") -> None:
        super().__init__()
        self.channel_aliases = dict(channel_aliases) if channel_aliases is not None else None
        self.poll_seconds = poll_seconds
        self.store_uri = store_uri
        self.mlflow_conn_id = mlflow_conn_id
        self.aws_conn_id = aws_conn_id
        self._last_error: str | None = None
        self._hooks: tuple | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (TRIGGER_PATH, {"channel_aliases": self.channel_aliases, "poll_seconds": self.poll_seconds,
                               "store_uri": self.store_uri, "mlflow_conn_id": self.mlflow_conn_id,
                               "aws_conn_id": self.aws_conn_id})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from onnxcast.airflow.settings import registry_poll_seconds

        interval = float(self.poll_seconds or registry_poll_seconds())
        while True:
            for payload in await self.poll():
                yield TriggerEvent(payload)
            await asyncio.sleep(interval)

    async def poll(self) -> list[dict]:
        """One look at the registry and the store: the payloads of the new requests (each
        already marked pending); [] when there is nothing to do or the look failed."""
        try:
            payloads, notes = await asyncio.to_thread(self.poll_sync)
        except Exception as exc:  # noqa: BLE001 - an outage must not end the watcher
            line = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            if line != self._last_error:  # one line per outage, not one per poll
                self.log.warning("registry alias watcher: poll failed, polling on: %s", line)
            self._last_error = line
            return []
        if self._last_error is not None:
            self.log.info("registry alias watcher: polling works again")
            self._last_error = None
        for note in notes:
            self.log.info("registry alias watcher: %s", note)
        return payloads

    def poll_sync(self) -> tuple[list[dict], list[str]]:
        """The blocking part of :meth:`poll` (MLflow and store calls), as the connection's MLflow
        login: set for the poll only, since the triggerer runs many triggers in one process."""
        from onnxcast.airflow.hooks import MlflowHook, S3SettingsHook
        from onnxcast.airflow.settings import channel_aliases, store_uri
        from onnxcast.registry.registry_rollout import watch_once
        from onnxcast.registry.release import Registry

        aliases = self.channel_aliases if self.channel_aliases is not None else channel_aliases()
        if self._hooks is None or time.monotonic() - self._hooks[0] > HOOKS_SECONDS:
            # connections are resolved again now and then (rotated keys, assumed roles), not on
            # every poll (each resolution logs, and asks the secrets backend)
            self._hooks = (time.monotonic(), MlflowHook(mlflow_conn_id=self.mlflow_conn_id),
                           S3SettingsHook(aws_conn_id=self.aws_conn_id))
        _, mlflow_hook, s3_hook = self._hooks
        with mlflow_hook.login():  # the connection's login for this poll only (many triggers share the process)
            return watch_once(Registry(mlflow_hook.tracking_uri, aliases), s3_hook.open_store(store_uri(self.store_uri)))


def registry_alias_asset() -> Asset:
    """The asset the watcher updates (the deployment's settings read where the DAG is parsed
    are given to the trigger, so the triggerer runs exactly what the DAG file says)."""
    from onnxcast.airflow.settings import channel_aliases, registry_poll_seconds

    trigger = RegistryAliasTrigger(channel_aliases=channel_aliases(), poll_seconds=registry_poll_seconds())
    return Asset(name="onnxcast_registry_alias", uri="x-onnxcast://registry-alias",
                 watchers=[AssetWatcher(name="onnxcast_registry_alias_watcher", trigger=trigger)])
