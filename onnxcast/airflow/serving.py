"""Wait until ``onnxcast serve`` answers with a promoted version: "promoted" means "serving".

``ServingReadySensor`` checks the service's Open Inference Protocol model metadata
(``GET /v2/models/{name}``: 200 and ``versions == [version]``). Deferrable by default: the
wait runs in the triggerer (``ServingReadyTrigger``), not in a worker slot.
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
from onnxcast.airflow.pipeline import readable

if TYPE_CHECKING:
    from airflow.sdk import Context


def served_version(service_url: str, model_name: str, timeout: float = 10.0) -> tuple[str | None, str]:
    """The version the service serves now (None when not ready or unreachable) and why."""
    url = f"{service_url.rstrip('/')}/v2/models/{model_name}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            versions = json.loads(response.read()).get("versions") or []
            return (versions[0] if versions else None), f"{url}: serving {versions}"
    except urllib.error.HTTPError as exc:
        return None, f"{url}: HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return None, f"{url}: {exc}"


class ServingReadyTrigger(BaseTrigger):
    """Polls the service every ``poll_interval`` seconds until it serves ``version`` of ``model_name``."""

    def __init__(self, *, service_url: str, model_name: str, version: str, poll_interval: float = 10.0,
                 timeout: float = 3600.0) -> None:
        super().__init__()
        self.service_url, self.model_name, self.version = service_url, model_name, version
        self.poll_interval, self.timeout = poll_interval, timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("onnxcast.airflow.serving.ServingReadyTrigger", {
            "service_url": self.service_url, "model_name": self.model_name, "version": self.version,
            "poll_interval": self.poll_interval, "timeout": self.timeout})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        deadline = time.monotonic() + self.timeout
        while True:
            # urllib blocks: run it off the triggerer's event loop
            version, detail = await asyncio.to_thread(served_version, self.service_url, self.model_name)
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
                 **kwargs: Any) -> None:
        super().__init__(poke_interval=poll_interval, timeout=timeout, **kwargs)
        self.service_url, self.model_name, self.version = service_url, model_name, version
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
                                               timeout=self.timeout),
                   method_name="execute_complete", timeout=timedelta(seconds=self.timeout))

    def poke(self, context: Context) -> bool:
        version, detail = served_version(str(self.service_url), str(self.model_name))
        self.log.info("Waiting for %s version %s: %s", self.model_name, self.version, detail)
        return version == str(self.version)

    def execute_complete(self, context: Context, event: dict) -> str:
        if event.get("status") != "serving":
            raise AirflowFailException(f"{self.service_url} did not serve {self.model_name} version {self.version} "
                                       f"within {self.timeout:g} s; last: {event.get('detail')}")
        self.log.info("%s version %s is serving: %s", self.model_name, self.version, event.get("detail"))
        return event["version"]
