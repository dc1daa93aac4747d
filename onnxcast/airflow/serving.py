"""Wait until ``onnxcast serve`` answers with a promoted version: "promoted" means "serving".

``ServingReadySensor`` checks the service's Open Inference Protocol model metadata
(``GET /v2/models/{name}``: 200 and ``versions == [version]``). Deferrable by default: the
wait runs in the triggerer (``ServingReadyTrigger``), not in a worker slot.

A service with a bearer token (``onnxcast serve --token-file``; required beyond loopback) is
asked with the password of the Airflow connection ``serving_conn_id`` (default
``onnxcast_serve``). The trigger is handed the connection id, never the token, because a
trigger's arguments are stored in the metadata database in clear.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException
from airflow.triggers.base import BaseTrigger, TriggerEvent

from onnxcast.airflow.links import MlflowRunLink
from onnxcast.airflow.steps import readable

if TYPE_CHECKING:
    from airflow.sdk import Context


DEFAULT_SERVING_CONN_ID = "onnxcast_serve"


def served_version(service_url: str, model_name: str, timeout: float = 10.0,
                   token: str | None = None) -> tuple[str | None, str]:
    """The version the service serves now (None when not ready or unreachable) and why."""
    url = f"{service_url.rstrip('/')}/v2/models/{model_name}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
            versions = json.loads(response.read()).get("versions") or []
            return (versions[0] if versions else None), f"{url}: serving {versions}"
    except urllib.error.HTTPError as exc:
        return None, f"{url}: HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return None, f"{url}: {exc}"


def _token_of(connection: Any) -> str | None:
    return (connection.password or None) if connection is not None else None


def serving_token(conn_id: str | None) -> str | None:
    """The bearer token held by Airflow connection ``conn_id``; None when there is no such
    connection (a service on loopback may need none; a 401 then says so in the wait's log)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    if not conn_id:
        return None
    try:
        return _token_of(BaseHook.get_connection(conn_id))
    except AirflowNotFoundException:
        return None


class ServingReadyTrigger(BaseTrigger):
    """Polls the service every ``poll_interval`` seconds until it serves ``version`` of ``model_name``."""

    def __init__(self, *, service_url: str, model_name: str, version: str, poll_interval: float = 10.0,
                 timeout: float = 3600.0, serving_conn_id: str | None = None) -> None:
        super().__init__()
        self.service_url, self.model_name, self.version = service_url, model_name, version
        self.poll_interval, self.timeout = poll_interval, timeout
        self.serving_conn_id = serving_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("onnxcast.airflow.serving.ServingReadyTrigger", {
            "service_url": self.service_url, "model_name": self.model_name, "version": self.version,
            "poll_interval": self.poll_interval, "timeout": self.timeout, "serving_conn_id": self.serving_conn_id})

    async def _token(self) -> str | None:
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException

        if not self.serving_conn_id:
            return None
        try:
            return _token_of(await BaseHook.aget_connection(self.serving_conn_id))
        except AirflowNotFoundException:
            return None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        deadline = time.monotonic() + self.timeout
        token = await self._token()
        while True:
            # urllib blocks: run it off the triggerer's event loop
            version, detail = await asyncio.to_thread(served_version, self.service_url, self.model_name,
                                                      token=token)
            if version == self.version:
                yield TriggerEvent({"status": "serving", "version": version, "detail": detail})
                return
            if time.monotonic() >= deadline:
                yield TriggerEvent({"status": "timeout", "version": version, "detail": detail})
                return
            await asyncio.sleep(self.poll_interval)


class ServingReadySensor(BaseSensorOperator):
    """Succeeds once ``service_url`` serves ``version`` of ``model_name``; succeeds at once when
    ``service_url`` is empty or nothing was promoted to ``channel`` (``channels``: what the
    promotion moved, None when it was skipped)."""

    template_fields: Sequence[str] = ("service_url", "model_name", "version", "channels")
    operator_extra_links = (MlflowRunLink(),)

    def __init__(self, *, service_url: str | None, model_name: str, version: str,
                 channels: Sequence[str] | dict | str | None = None, channel: str = "cloud",
                 poll_interval: float = 10.0, timeout: float = 3600.0, deferrable: bool = True,
                 serving_conn_id: str | None = DEFAULT_SERVING_CONN_ID, **kwargs: Any) -> None:
        super().__init__(poke_interval=poll_interval, timeout=timeout, **kwargs)
        self.service_url, self.model_name, self.version = service_url, model_name, version
        self.serving_conn_id = serving_conn_id
        self.channels, self.channel = channels, channel
        self.poll_interval, self.deferrable = poll_interval, deferrable

    def execute(self, context: Context) -> Any:
        # Nothing to wait for is a success, not a skip: a run without a service stays all green.
        if self.service_url in (None, "", "None"):
            self.log.info("No serving URL given: not waiting for a cloud service")
            return None
        if self.version in (None, "", "None") or (self.channels is not None and self.channel not in self.channels):
            self.log.info("Channel %s was not promoted (version %s, channels %s): nothing to wait for",
                          self.channel, self.version, "none" if self.channels is None else readable(self.channels))
            return None
        if not self.deferrable:
            super().execute(context)
            return str(self.version)
        if self.poke(context):
            return str(self.version)
        self.defer(trigger=ServingReadyTrigger(service_url=str(self.service_url), model_name=str(self.model_name),
                                               version=str(self.version), poll_interval=self.poll_interval,
                                               timeout=self.timeout, serving_conn_id=self.serving_conn_id),
                   method_name="execute_complete", timeout=timedelta(seconds=self.timeout))

    def poke(self, context: Context) -> bool:
        version, detail = served_version(str(self.service_url), str(self.model_name),
                                         token=serving_token(self.serving_conn_id))
        self.log.info("Waiting for %s version %s: %s", self.model_name, self.version, detail)
        return version == str(self.version)

    def execute_complete(self, context: Context, event: dict) -> str:
        if event.get("status") != "serving":
            raise AirflowFailException(f"{self.service_url} did not serve {self.model_name} version {self.version} "
                                       f"within {self.timeout:g} s; last: {event.get('detail')}")
        self.log.info("%s version %s is serving: %s", self.model_name, self.version, event.get("detail"))
        return event["version"]
