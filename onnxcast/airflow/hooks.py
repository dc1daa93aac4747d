"""Hooks: Airflow connections turned into the settings the onnxcast library takes.

``mlflow_default``: the tracking URI in ``host`` (``http://mlflow:5000``) or in the extra
``{"tracking_uri": ...}``; ``login``/``password`` become MLflow's basic-auth variables
(:meth:`MlflowHook.login`); the extra ``ui_url`` sets the link shown on tasks. ``aws_default``: an Amazon provider
``aws`` connection, resolved by its ``AwsBaseHook`` (access keys in ``login``/``password``,
or an instance/pod role; ``role_arn`` in the extra to assume a role; ``endpoint_url`` and
``region_name`` in the extra), plus onnxcast's ``sse``/``sse_kms_key_id`` extras for the
rollout store. Every S3 access (input data, run store, rollout store, fetches) goes
through it.

A missing connection means the embedded defaults (a SQLite MLflow store under
``ONNXCAST_HOME``; boto3's own credential chain) in the embedded mode only; in a
deployment (onnxcast.airflow.settings) it fails the task, naming the connection.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

from onnxcast.base import environment
from onnxcast.base.s3 import S3Settings, make_client

# MLflow reads a basic-auth login only from these variables (or ~/.mlflow/credentials), again on
# every request (mlflow.utils.credentials.get_default_host_creds): no client takes it as an argument.
MLFLOW_LOGIN_VARIABLES = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


class MlflowHook(BaseHook):
    """Where MLflow is, from the ``mlflow_default`` connection (or the embedded default).

    The connection's login reaches MLflow through its environment variables, the only way MLflow
    takes one, inside ``with hook.login():`` only, and put back as they were after: an operator
    that mixes in :class:`MlflowLoginScope` runs its whole ``execute`` so, the alias watcher each
    poll (the triggerer runs many triggers in one process), the rollout page each page. One
    task's login never outlives its call: the next task of a long-lived process (a Celery worker
    running tasks in-process, ``dags test``) starts from the variables as they were. Outside a
    ``login()`` block MLflow calls go unauthenticated (every operator of onnxcast.airflow runs
    inside one: TrackedOperator mixes in the scope)."""

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = "mlflow_default"
    conn_type = "mlflow"
    hook_name = "MLflow (onnxcast)"

    def __init__(self, mlflow_conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.mlflow_conn_id = mlflow_conn_id
        self._settings: dict[str, Any] | None = None
        self._login: dict[str, str | None] | None = None

    def get_settings(self) -> dict[str, Any]:
        """``{"tracking_uri", "ui_url"}``; the login is used inside :meth:`login` only."""
        return self._read_settings()

    def _read_settings(self) -> dict[str, Any]:
        if self._settings is not None:
            return self._settings
        from onnxcast.registry.tracking import bound_requests, default_tracking_uri

        conn = self._connection()
        bound_requests()
        if conn is None:
            self._settings = {"tracking_uri": default_tracking_uri(), "ui_url": None}
            return self._settings
        extra = conn.extra_dejson
        uri = extra.get("tracking_uri") or _uri_from(conn) or default_tracking_uri()
        if conn.login:
            self._login = dict(zip(MLFLOW_LOGIN_VARIABLES, (conn.login, conn.password or ""), strict=True))
        self._settings = {"tracking_uri": uri, "ui_url": extra.get("ui_url")}
        return self._settings

    @contextmanager
    def login(self) -> Iterator[None]:
        """A block in which MLflow calls authenticate as the connection's login (nothing when it
        has none); MLflow's login variables are put back as they were after it, on an error too.
        A missing connection is not refused here but where the settings are used (the task's own
        checks, such as the run store's, come first as they did)."""
        try:
            self._read_settings()
        except AirflowFailException:
            yield  # get_settings() raises it again at the first MLflow call
            return
        if not self._login:
            yield
            return
        with environment.scoped(self._login):
            yield

    @property
    def tracking_uri(self) -> str:
        return self.get_settings()["tracking_uri"]

    @property
    def ui_url(self) -> str | None:
        return self.get_settings()["ui_url"]

    def _connection(self):
        if not self.mlflow_conn_id:
            return None
        from onnxcast.airflow.settings import embedded

        try:
            return self.get_connection(self.mlflow_conn_id)
        except AirflowNotFoundException:
            if not embedded():
                raise AirflowFailException(
                    f"no Airflow connection {self.mlflow_conn_id!r}: create it with the MLflow tracking server's URL "
                    "(and the pipeline user's login/password); the local SQLite store is for the embedded mode "
                    "(ONNXCAST_MODE=embedded) only") from None
            self.log.info("No connection %r: using the embedded MLflow store", self.mlflow_conn_id)
            return None


class MlflowLoginScope:
    """For operators with an ``mlflow_hook``: each ``execute`` a subclass defines runs inside
    ``self.mlflow_hook.login()``, so the connection's login is set for the task's MLflow calls
    and the variables are as before once it returns or fails (mix in before the operator base:
    ``class X(MlflowLoginScope, TrackedOperator)``)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        execute = cls.__dict__.get("execute")
        if execute is not None and not getattr(execute, "logged_in_to_mlflow", False):
            cls.execute = _logged_in(execute)


def _logged_in(execute):
    @functools.wraps(execute)
    def run(self, *args: Any, **kwargs: Any) -> Any:
        with self.mlflow_hook.login():
            return execute(self, *args, **kwargs)

    run.logged_in_to_mlflow = True
    return run


class S3SettingsHook(BaseHook):
    """The :class:`~onnxcast.base.s3.S3Settings` of every S3 access (input data, run store,
    rollout store, fetches), from the ``aws_default`` connection."""

    conn_name_attr = "aws_conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "AWS S3 (onnxcast)"

    def __init__(self, aws_conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.aws_conn_id = aws_conn_id
        self._settings: S3Settings | None = None
        self._resolved = False

    def get_settings(self) -> S3Settings | None:
        """The connection's settings (never logged); None (boto3's chain: the ``AWS_*``
        environment) without a connection, in the embedded mode only.

        Credentials are resolved by the Amazon provider's AwsBaseHook (keys, profile, or an
        assumed role: temporary keys with a session token)."""
        if not self._resolved:
            self._settings = self._resolve()
            self._resolved = True
        return self._settings

    def settings_for(self, uri: str) -> S3Settings | None:
        """:meth:`get_settings` for an ``s3://`` URI; None for anything else (a local path)."""
        return self.get_settings() if uri.startswith("s3://") else None

    def s3_client(self):
        """A boto3 S3 client with the connection's settings (bounded timeouts and retries)."""
        return make_client(self.get_settings())

    def open_store(self, uri: str):
        """The rollout store at ``uri``; S3 settings apply to ``s3://`` URIs only."""
        from onnxcast.rollout.store import open_store

        return open_store(uri, self.settings_for(uri))

    def _resolve(self) -> S3Settings | None:
        from onnxcast.airflow.settings import embedded

        if not self.aws_conn_id:
            return None
        try:
            conn = self.get_connection(self.aws_conn_id)
        except AirflowNotFoundException:
            if not embedded():
                raise AirflowFailException(
                    f"no Airflow connection {self.aws_conn_id!r} for S3: create an 'aws' connection (keys, or a "
                    "role, and endpoint_url in its extra for a non-AWS store); the environment's credentials are "
                    "used in the embedded mode (ONNXCAST_MODE=embedded) only") from None
            self.log.info("No connection %r: S3 settings come from the environment", self.aws_conn_id)
            return None
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        extra = conn.extra_dejson
        aws = AwsBaseHook(aws_conn_id=self.aws_conn_id, client_type="s3")
        config = aws.conn_config
        settings = {key: extra[key] for key in ("sse", "sse_kms_key_id") if extra.get(key)}
        settings["endpoint_url"] = config.endpoint_url or extra.get("endpoint_url") or None
        settings["region_name"] = config.region_name or extra.get("region") or None
        credentials = aws.get_credentials(region_name=settings["region_name"])
        settings.update(aws_access_key_id=credentials.access_key, aws_secret_access_key=credentials.secret_key,
                        aws_session_token=credentials.token or None)
        return S3Settings.from_values(settings)


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
