"""
### onnxcast refresh

Re-signs the channel pointers of a model every day: same version, a higher counter and a
new expiry. Devices refuse a pointer past its expiry (so a frozen or stale store cannot
hold them on an old version forever); this keeps a channel that has not moved trusted.
Signs with the release key (`ONNXCAST_SIGNING_KEY`, e.g. `awskms:<key>`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Param

from onnxcast.airflow.operators import RefreshChannelsOperator
from onnxcast.airflow.params import pipeline_param, retry_delay
from onnxcast.pipeline.config import CHANNELS

with DAG(
    dag_id="onnxcast_refresh",
    description="Re-sign rollout channel pointers (counter and expiry) so devices keep trusting them",
    doc_md=__doc__,
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["onnxcast", "rollout"],
    render_template_as_native_obj=True,
    default_args={"owner": "onnxcast", "retries": 2, "retry_delay": retry_delay(timedelta(minutes=5))},
    params={
        "model_name": pipeline_param("model_name", description="Model in the rollout store"),
        "channels": Param(list(CHANNELS), type="array", minItems=1,
                          items={"type": "string", "enum": list(CHANNELS)}, description="Channels to re-sign"),
        "store_uri": Param(None, type=["null", "string"],
                           description="Rollout store: s3://bucket/prefix or a folder; empty: $ONNXCAST_HOME/rollout"),
        "expires_days": Param(30, type="number", minimum=1, maximum=365,
                              description="Days the re-signed pointers stay valid"),
    },
) as dag:
    RefreshChannelsOperator(
        task_id="refresh",
        model_name="{{ params.model_name }}",
        channels="{{ params.channels }}",
        store_uri="{{ params.store_uri }}",
        expires_days="{{ params.expires_days }}",
    )
