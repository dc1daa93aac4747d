"""Extra link from a task to its MLflow run.

In Airflow 3 the task itself computes its links when it finishes (the task runner calls
``get_link`` and stores the URL as an XCom under ``xcom_key``); the UI only reads that
XCom. Operators save the run URL with :func:`persist_mlflow_run_url` during ``execute``;
the link reads it back. The link class is registered as the provider's ``extra-links``
(onnxcast.airflow.get_provider_info) so the API server can deserialize it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import Context

MLFLOW_RUN_URL_KEY = "mlflow_run_url"


class MlflowRunLink(BaseOperatorLink):
    """Opens the task's MLflow run (the family's child run, or the pipeline's parent run)."""

    name = "MLflow run"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        return XCom.get_value(ti_key=ti_key, key=MLFLOW_RUN_URL_KEY) or ""


def persist_mlflow_run_url(context: Context, url: str | None) -> None:
    if url:
        context["ti"].xcom_push(key=MLFLOW_RUN_URL_KEY, value=url)
