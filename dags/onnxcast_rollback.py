"""
### onnxcast rollback

Moves a rollout channel back to the version it was promoted from (or to a given
version). Versions are never deleted; the move is recorded in the channel's history. The
channel's registry alias (`edge`, `cloud`) and `champion` (unless told otherwise) move with the
pointer, or nothing moves and the task fails on one line (the registry alias watcher then has
nothing to undo). `onnxcast rollback` on the command line does the same.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG, Asset, Param

from onnxcast.airflow.operators import RollbackChannelOperator
from onnxcast.airflow.params import pipeline_param
from onnxcast.pipeline.config import CHANNELS

ROLLOUT = Asset(name="onnxcast_rollout", uri="x-onnxcast://rollout")

with DAG(
    dag_id="onnxcast_rollback",
    description="Move a rollout channel back to its previous version",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["onnxcast", "rollout"],
    render_template_as_native_obj=True,
    default_args={"owner": "onnxcast", "retries": 0},
    params={
        "model_name": pipeline_param("model_name", description="Model in the rollout store"),
        "channel": Param("edge", type="string", enum=list(CHANNELS), description="Channel to move back"),
        "to_version": Param(None, type=["null", "string"],
                            description="Version to move to; empty: the version it was promoted from"),
        "reason": Param(type="string", minLength=1, description="Why: recorded in the channel history"),
        "store_uri": Param(None, type=["null", "string"],
                           description="Rollout store: s3://bucket/prefix or a folder; empty: $ONNXCAST_HOME/rollout"),
        "move_champion": Param(True, type="boolean",
                               description="Point the registry alias champion at the version the channel now serves"),
    },
) as dag:
    RollbackChannelOperator(
        task_id="rollback",
        model_name="{{ params.model_name }}",
        channel="{{ params.channel }}",
        to_version="{{ params.to_version }}",
        reason="{{ params.reason }}",
        store_uri="{{ params.store_uri }}",
        move_champion="{{ params.move_champion }}",
        outlets=[ROLLOUT],
    )
