"""
### onnxcast monitor

Accuracy in production, daily. For each channel it pulls the version the channel serves
from the rollout store **as a device does** (verified against the trust root), forecasts the
data that arrived after that version's `trained_until` with ONNX Runtime at rolling origins,
and records the realised MASE (the holdout's scale and baseline) beside the holdout's MASE
and its 95% interval, plus the input drift against the training window (a Great
Expectations suite of its profile). Results: an MLflow monitor run per channel and check, and
the model version tag `onnxcast.monitor.<channel>`.

| task | what it does |
|---|---|
| `monitor` | per channel: pull and verify, forecast, realised error, one-sided degradation test, drift suite, MLflow |
| `retrain_signal` | skipped when nothing degraded or drifted; otherwise an `onnxcast_retrain` asset event (`onnxcast_training` is scheduled on it) carrying the reasons and the deployed version's settings |

Connections: `mlflow_default`, `aws_default` (S3 store and data).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, CronTriggerTimetable, Param

from onnxcast.airflow.operators import RETRAIN, MonitorChannelsOperator, RetrainSignalOperator
from onnxcast.airflow.params import pipeline_param, retry_delay
from onnxcast.pipeline.config import CHANNEL_LABELS, CHANNELS

# Daily, 06:00 UTC. As for the training DAG: no start_date, so unpausing starts no run at once
# unless the last tick is under 10 minutes old (run_immediately).
DAILY = CronTriggerTimetable("0 6 * * *", timezone="UTC", run_immediately=timedelta(minutes=10))

with DAG(
    dag_id="onnxcast_monitor",
    description="Realised accuracy and input drift of the model each channel serves; asks for retraining",
    doc_md=__doc__,
    schedule=DAILY,
    catchup=False,
    max_active_runs=1,
    tags=["onnxcast", "monitoring", "mlflow"],
    render_template_as_native_obj=True,
    default_args={"owner": "onnxcast", "retries": 1, "retry_delay": retry_delay(timedelta(minutes=5))},
    params={
        "model_name": pipeline_param("model_name", description="Registered model name (and rollout store model)"),
        "channels": Param(list(CHANNELS), type="array", minItems=1, uniqueItems=True,
                          items={"type": "string", "enum": list(CHANNELS)}, examples=list(CHANNELS),
                          values_display=CHANNEL_LABELS, description="Channels whose served model is judged"),
        "dataset_uri": Param(None, type=["null", "string"],
                             description="The data to judge on (CSV/Parquet, local or s3://); empty: the "
                                         "deployed version's own dataset from its report"),
        "store_uri": Param(None, type=["null", "string"],
                           description="Rollout store: s3://bucket/prefix or a folder; empty: the deployment's "
                                       "ONNXCAST_STORE_URI (embedded mode: $ONNXCAST_HOME/rollout)"),
    },
) as dag:
    monitor = MonitorChannelsOperator(
        task_id="monitor",
        model_name="{{ params.model_name }}",
        channels="{{ params.channels }}",
        dataset_uri="{{ params.dataset_uri }}",
        store_uri="{{ params.store_uri }}",
    )
    signal = RetrainSignalOperator(task_id="retrain_signal", results=monitor.output, outlets=[RETRAIN])
    monitor >> signal
