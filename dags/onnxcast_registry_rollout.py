"""
### onnxcast registry rollout

Setting a channel alias (`edge`, `cloud`: the deployment setting `ONNXCAST_CHANNEL_ALIASES`)
on a registered MLflow model version deploys that version: the registry alias watcher (in
the triggerer) sees the alias name a version the channel does not serve and updates the
asset `onnxcast_registry_alias`; this DAG, scheduled on it, triggers one gated
`onnxcast_promote` run per request (source `registry`). That run moves the channel, or
writes the refusal on the model version (tag `onnxcast.rollout.<channel>`) and moves the
alias back. Only the watcher's own events are taken: one posted through the REST API
(`POST /api/v2/assets/events`) or from any task is logged and ignored, and each request is
checked against the registry read again (the alias must still name that version). Pause
this DAG to stop registry-driven rollout.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, task

from onnxcast.airflow.operators import registry_alias_asset
from onnxcast.airflow.params import retry_delay

REGISTRY_ALIAS = registry_alias_asset()

with DAG(
    dag_id="onnxcast_registry_rollout",
    description="Promote what a channel alias names in the MLflow registry (gates re-checked)",
    doc_md=__doc__,
    schedule=[REGISTRY_ALIAS],
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    is_paused_upon_creation=False,
    max_active_runs=1,
    tags=["onnxcast", "rollout", "mlflow"],
    default_args={"owner": "onnxcast", "retries": 2, "retry_delay": retry_delay(timedelta(minutes=5))},
) as dag:

    @task
    def requests(triggering_asset_events=None) -> list[dict]:
        """One ``onnxcast_promote`` trigger per valid request of the events (duplicates once): only
        the watcher's events (none posted through the REST API), each checked against the
        registry read again now (the alias still names the version, the pending tag is this
        request's)."""
        from onnxcast.airflow.operators import dispatch_requests

        return dispatch_requests(triggering_asset_events)

    TriggerDagRunOperator.partial(
        task_id="trigger_promote",
        trigger_dag_id="onnxcast_promote",
        logical_date=None,
        skip_when_already_exists=True,
        wait_for_completion=False,
    ).expand_kwargs(requests())
