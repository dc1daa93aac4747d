"""Hooks: Airflow connections turned into the settings the onnxcast library takes.

``mlflow_default``: the tracking URI in ``host`` (``http://mlflow:5000``) or in the extra
``{"tracking_uri": ...}``; ``login``/``password`` become MLflow's basic-auth variables;
the extra ``ui_url`` sets the link shown on tasks. ``aws_default``: ``login``/``password``
are the access key pair, the extra holds ``endpoint_url``, ``region_name`` (and optionally
``sse``, ``sse_kms_key_id``). A missing connection means the embedded defaults (SQLite
MLflow under ``ONNXCAST_HOME``; boto3's own credential chain).
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException


class MlflowHook(BaseHook):
    """Where MLflow is, from the ``mlflow_default`` connection (or the embedded default)."""

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = "mlflow_default"
    conn_type = "mlflow"
    hook_name = "MLflow (onnxcast)"

    def __init__(self, mlflow_conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.mlflow_conn_id = mlflow_conn_id
        self._settings: dict[str, Any] | None = None

    def get_settings(self) -> dict[str, Any]:
        """``{"tracking_uri", "ui_url"}``; sets MLflow's auth variables when the connection has a login."""
        if self._settings is not None:
            return self._settings
        from onnxcast.tracking import default_tracking_uri

        conn = self._connection()
        if conn is None:
            self._settings = {"tracking_uri": default_tracking_uri(), "ui_url": None}
            return self._settings
        extra = conn.extra_dejson
        uri = extra.get("tracking_uri") or _uri_from(conn) or default_tracking_uri()
        if conn.login:
            os.environ["MLFLOW_TRACKING_USERNAME"] = conn.login
            os.environ["MLFLOW_TRACKING_PASSWORD"] = conn.password or ""
        self._settings = {"tracking_uri": uri, "ui_url": extra.get("ui_url")}
        return self._settings

    @property
    def tracking_uri(self) -> str:
        return self.get_settings()["tracking_uri"]

    @property
    def ui_url(self) -> str | None:
        return self.get_settings()["ui_url"]

    def _connection(self):
        if not self.mlflow_conn_id:
            return None
        try:
            return self.get_connection(self.mlflow_conn_id)
        except AirflowNotFoundException:
            self.log.info("No connection %r: using the embedded MLflow store", self.mlflow_conn_id)
            return None


class S3SettingsHook(BaseHook):
    """S3 settings for the rollout store and fetches, from the ``aws_default`` connection."""

    conn_name_attr = "aws_conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "AWS S3 (onnxcast)"

    EXTRA_KEYS = ("endpoint_url", "region_name", "aws_session_token", "profile_name", "sse", "sse_kms_key_id")

    def __init__(self, aws_conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.aws_conn_id = aws_conn_id

    def get_settings(self) -> dict[str, Any]:
        """Keyword settings for ``onnxcast.store.open_store`` / ``S3Settings`` (never logged)."""
        if not self.aws_conn_id:
            return {}
        try:
            conn = self.get_connection(self.aws_conn_id)
        except AirflowNotFoundException:
            self.log.info("No connection %r: S3 settings come from the environment", self.aws_conn_id)
            return {}
        extra = conn.extra_dejson
        settings = {key: extra[key] for key in self.EXTRA_KEYS if extra.get(key)}
        if not settings.get("region_name") and extra.get("region"):
            settings["region_name"] = extra["region"]
        if conn.login:
            settings["aws_access_key_id"] = conn.login
            settings["aws_secret_access_key"] = conn.password
        return settings

    def open_store(self, uri: str):
        """The rollout store at ``uri``; S3 settings apply to ``s3://`` URIs only."""
        from onnxcast.rollout.store import open_store

        return open_store(uri, **(self.get_settings() if uri.startswith("s3://") else {}))


def _uri_from(conn) -> str | None:
    host = (conn.host or "").strip()
    if not host:
        return None
    if "://" in host:
        return host.rstrip("/")
    scheme = conn.conn_type if conn.conn_type in ("http", "https") else "http"
    port = f":{conn.port}" if conn.port else ""
    path = f"/{conn.schema.strip('/')}" if conn.schema else ""
    return f"{scheme}://{host}{port}{path}"
