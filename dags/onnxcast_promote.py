"""
### onnxcast promote

Promotes a registered MLflow model version (by number or alias, e.g. `challenger`) to
rollout channels. The gates are **re-checked** first: the version's files are downloaded,
checked against the sha256s of its report, its data window is prepared again and every
ONNX variant is validated again (parity, accuracy, baseline). Only a passing version is
written to the rollout store; the channel pointers move by compare-and-swap and the
registry aliases `champion` and the channels' own (`edge`, `cloud`) follow.

The last task, `report_back`, writes the outcome on the model version (tag
`onnxcast.rollout.<channel>`: `deployed`; `refused` with the reason when a gate,
verification or conflict refused it; `failed` for an infrastructure error, asked again by
the watcher after its pending expiry; `superseded` when the alias moved on first); a
refused run started from the registry (source `registry`: the alias watcher) also moves
the alias back to the version the channel serves. Runs go one at a time, and a
registry-sourced run whose alias no longer names its version when the channel would move
is skipped as superseded.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG, Asset, Param

from onnxcast.airflow.operators import (
    PromoteModelOperator,
    ReportRolloutOperator,
    StageRegisteredVersionOperator,
    ValidateModelOperator,
    remember_failure,
)
from onnxcast.airflow.params import pipeline_param
from onnxcast.pipeline.config import CHANNELS

ROLLOUT = Asset(name="onnxcast_rollout", uri="x-onnxcast://rollout")
RUN_DIR = "{{ ti.xcom_pull(task_ids='stage_version', key='run_dir') }}"

with DAG(
    dag_id="onnxcast_promote",
    description="Promote a registered version to rollout channels, gates re-checked",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # one promotion at a time: a late request never races a newer one
    tags=["onnxcast", "rollout", "mlflow"],
    render_template_as_native_obj=True,
    is_paused_upon_creation=False,  # no schedule: unpaused only so that registry-triggered runs start
    default_args={"owner": "onnxcast", "retries": 0},
    params={
        "model_name": pipeline_param("model_name", description="Registered model name"),
        "version": Param("challenger", type="string", minLength=1,
                         description="Version number or alias (challenger, champion, ...) to promote"),
        "channels": Param(list(CHANNELS), type="array", minItems=1,
                          items={"type": "string", "enum": list(CHANNELS)}, description="Channels to move"),
        "store_uri": Param(None, type=["null", "string"],
                           description="Rollout store: s3://bucket/prefix or a folder; empty: the deployment's "
                                       "ONNXCAST_STORE_URI (embedded mode: $ONNXCAST_HOME/rollout)"),
        "reason": Param("manual promotion", type="string", minLength=1,
                        description="Why: recorded in the manifest, the channel history and the registry"),
        "source": Param("manual", type="string", enum=["manual", "registry"],
                        description="Who asked: manual, or registry (the alias watcher: a refusal moves the "
                                    "alias back)"),
        "alias": Param(None, type=["null", "string"],
                       description="The registry alias that asked for this version (source registry)"),
    },
) as dag:
    # the first line of a failure, for report_back to write on the model version
    remember = {"on_failure_callback": remember_failure}
    stage = StageRegisteredVersionOperator(task_id="stage_version", model_name="{{ params.model_name }}",
                                           ref="{{ params.version }}", **remember)
    validate = ValidateModelOperator(task_id="validate", run_dir=RUN_DIR,
                                     family="{{ ti.xcom_pull(task_ids='stage_version')['family'] }}", **remember)
    promote = PromoteModelOperator(
        task_id="promote",
        run_dir=RUN_DIR,
        version="{{ ti.xcom_pull(task_ids='stage_version')['version'] }}",
        channels="{{ params.channels }}",
        store_uri="{{ params.store_uri }}",
        reason="{{ params.reason }}",
        source="{{ params.source }}",
        alias="{{ params.alias }}",
        assemble_report=True,
        outlets=[ROLLOUT],
        **remember,
    )
    report = ReportRolloutOperator(task_id="report_back", model_name="{{ params.model_name }}",
                                   ref="{{ params.version }}", channels="{{ params.channels }}",
                                   source="{{ params.source }}", alias="{{ params.alias }}",
                                   store_uri="{{ params.store_uri }}")
    stage >> validate >> promote >> report
