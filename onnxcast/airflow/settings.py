"""Deployment settings of the onnxcast tasks: the mode, the run store, the rollout store, the
channel aliases, the alias watcher's poll and the retry delay.

Each comes from the first of: the DAG param (when the DAG has one), the environment variable,
the ``[onnxcast]`` section of airflow.cfg (``AIRFLOW__ONNXCAST__*`` works too). The variables,
their airflow.cfg keys and their defaults are declared in onnxcast.base.environment (the table:
docs/environment.md, "The Airflow deployment").

The channel aliases (``channel=alias``, comma-separated) are the MLflow registry aliases the
alias watcher (onnxcast.airflow.triggers) reads as "deploy this version to that channel";
every promotion and rollback moves them too.

The **embedded** mode (the demo, ``make airflow``, the tests: the repository's airflow.cfg
says ``mode = embedded``) runs every task on one machine and falls back to local folders,
a SQLite MLflow store and a development signing key. Anywhere else (**deployed**: unset,
or any other value) a missing setting or connection fails the task with a message naming
it, instead of silently writing to the disk of whichever worker ran the task.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from airflow.sdk.exceptions import AirflowFailException

from onnxcast.base import environment
from onnxcast.base.errors import ConfigError
from onnxcast.base.files import onnxcast_home

EMBEDDED = "embedded"
DEPLOYED = "deployed"


def _setting(name: str) -> str | None:
    """The text of the environment variable ``name``, else of its ``[onnxcast]`` key in airflow.cfg."""
    value = environment.get(name)
    if value:
        return value
    from airflow.configuration import conf

    value = conf.get("onnxcast", environment.variable(name).airflow_cfg, fallback=None)
    return value or None


def mode() -> str:
    """``embedded`` or ``deployed`` (anything but "embedded" counts as deployed)."""
    value = str(environment.value("ONNXCAST_MODE", _setting("ONNXCAST_MODE"))).strip().lower()
    return EMBEDDED if value == EMBEDDED else DEPLOYED


def embedded() -> bool:
    return mode() == EMBEDDED


def _given(value) -> str | None:
    return None if value in (None, "", "None") else str(value)


def run_root(param: str | None = None) -> str:
    """Where run directories live (the run store root)."""
    value = _given(param) or _setting("ONNXCAST_RUN_ROOT")
    if value:
        return value
    if embedded():
        return str(onnxcast_home() / "runs")
    raise AirflowFailException(
        "no run store configured: set ONNXCAST_RUN_ROOT (or [onnxcast] run_root in airflow.cfg, or the DAG "
        "param run_root) to an s3:// URL every worker can reach; local folders are for the embedded mode "
        "(ONNXCAST_MODE=embedded) only")


def store_uri(param: str | None = None) -> str:
    """The rollout store (where promoted versions and channel pointers go)."""
    value = _given(param) or _setting("ONNXCAST_STORE_URI")
    if value:
        return value
    if embedded():
        return str(onnxcast_home() / "rollout")
    raise AirflowFailException(
        "no rollout store configured: set the DAG param store_uri, or ONNXCAST_STORE_URI (or [onnxcast] "
        "store_uri in airflow.cfg), to an s3:// URL; a local default exists in the embedded mode only")


def store_configured(param: str | None = None) -> bool:
    """Whether a rollout store was named (not the embedded default)."""
    return bool(_given(param) or _setting("ONNXCAST_STORE_URI"))


def trust_root(given: str | None, keys_dir: Path, store_param: str | None = None) -> str | None:
    """The trust root file a verified pull of the provider starts from (the monitor, the rollout
    page's device check): ``given``, else ``$ONNXCAST_TRUST``, else, in the embedded mode with no
    rollout store named, the development root under ``keys_dir`` when it is there (the root of
    the development key embedded promotions sign with); None lets the caller name what is missing."""
    from onnxcast.rollout.signing import ROOT_FILE, TRUST_ENV

    given = _given(given) or environment.get(TRUST_ENV)
    if given is None and embedded() and not store_configured(store_param):
        root = keys_dir / ROOT_FILE
        return str(root) if root.is_file() else None
    return given


def channel_aliases() -> dict[str, str]:
    """Channel -> registry alias (``ONNXCAST_CHANNEL_ALIASES``, default ``edge=edge,cloud=cloud``)."""
    from onnxcast.pipeline.config import CHANNELS
    from onnxcast.registry.alias_rollout import parse_channel_aliases

    text = environment.value("ONNXCAST_CHANNEL_ALIASES", _setting("ONNXCAST_CHANNEL_ALIASES"))
    try:
        return parse_channel_aliases(text, CHANNELS)
    except ValueError as exc:
        raise AirflowFailException(f"ONNXCAST_CHANNEL_ALIASES: {exc}") from None


DEFAULT_POLL_SECONDS = environment.default("ONNXCAST_REGISTRY_POLL_SECONDS")


def registry_poll_seconds() -> float:
    """How often the alias watcher reads the registry (``ONNXCAST_REGISTRY_POLL_SECONDS``, 1 to 3600)."""
    try:
        return environment.value("ONNXCAST_REGISTRY_POLL_SECONDS", _setting("ONNXCAST_REGISTRY_POLL_SECONDS"))
    except ConfigError as exc:
        raise AirflowFailException(str(exc)) from None


def retry_delay(default: timedelta) -> timedelta:
    """How long a failed task waits before its retry: ``ONNXCAST_RETRY_DELAY_SECONDS`` (1 to
    3600) for every onnxcast DAG, else the DAG's own ``default``. Read when the DAG file is parsed;
    a bad value fails the parse with a line naming the variable (a ConfigError, a ValueError). The
    test stack shortens it to a few seconds so that its fault drills do not wait a minute per
    injected fault."""
    seconds = environment.value("ONNXCAST_RETRY_DELAY_SECONDS", _setting("ONNXCAST_RETRY_DELAY_SECONDS"))
    return default if seconds is None else timedelta(seconds=seconds)
