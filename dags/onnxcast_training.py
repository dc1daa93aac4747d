"""
### onnxcast training

Trains (or fetches) forecasters for a time series, exports them to ONNX, optimizes and
validates every variant on the holdout, logs everything to MLflow, registers the winner
as the `challenger` and promotes it to the rollout channels **only if it beats the
`champion`** evaluated on the same holdout in this same run.

| step | task | what it does |
|---|---|---|
| 1 | `check_data` | data-quality gate (a fleet: the table checks and the shards of series), time split, run directory, plan (families + champion) |
| 1 | `check_series` / `merge_data` | a fleet: the per-series checks, one mapped task per shard, then the run's verdict on the excluded series |
| 2 | `train_or_fetch` | one mapped task per family (the champion is fetched, never retrained) |
| 2 | `ensemble` | with *families* naming `ensemble`: the families this run trained combined into one more family (median or validated weights), which then goes through the steps below like the others; skipped with fewer than two members, the reason in report.json's `skipped`; without it the task passes the families on |
| 2 | `reference` | a fleet: baselines and statsforecast per series, one task per shard, in parallel with training |
| 3 | `export` / `optimize` / `evaluate` / `validate` | ONNX fp32, fp32-opt, int8, fp16; a fleet: every series evaluated, one task per shard; parity, accuracy, latency |
| 3 | `targets` / `validate_target` | the run's deployment targets (*targets*), then one mapped task per target: every eligible variant run there and judged (parity with x86 and PyTorch, holdout, latency, size); a failing target fails alone |
| 4 | `register` | report.json, MLflow runs, model version with alias `challenger` |
| 5 | `champion_challenger` | compares challenger and champion on the holdout: MAE (a fleet: mean MASE), or with `champion_metric` msis the 95% interval's MSIS |
| 6 | `promote` | rollout store version + channel pointers, alias `champion` (skipped if the champion wins) |
| 7 | `wait_until_serving` | with the *serving_url* param: deferrable wait until `onnxcast serve` answers with the promoted version |

With *series_column* set the data is a long table of many series (a fleet, one global model
per family); the per-series work is mapped over *fleet_shards* shards, so it runs on every
worker. With one series each shard task runs once and does nothing.

Runs weekly, and when `onnxcast_monitor` emits an `onnxcast_retrain` asset event (the served
model degraded or its inputs drifted): such a run takes the event's settings (the deployed
version's, on newer data) over the defaults and records the reason (report `trigger`, MLflow tag
`onnxcast.retrain_reason`).

The training window ends at the run's data interval end (or *trained_until*), so clearing
a past run reproduces it. Every task links to its MLflow run ("MLflow run" button).
Tasks may run on different workers: they hand files to each other through the run store
(*run_root*, or `ONNXCAST_RUN_ROOT`), staged into local scratch and published with a
commit marker. Connections: `mlflow_default` (tracking server), `aws_default` (every S3
access: input data, run store, rollout store).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param

from onnxcast.airflow.operators import (
    RETRAIN,
    ChampionChallengerOperator,
    CheckDataOperator,
    CheckSeriesOperator,
    EnsembleOperator,
    EvaluateShardOperator,
    ExportModelOperator,
    MergeDataOperator,
    OptimizeModelOperator,
    PromoteModelOperator,
    ReferenceShardOperator,
    RegisterModelOperator,
    RunTargetsOperator,
    ServingReadySensor,
    TrainOrFetchModelOperator,
    ValidateModelOperator,
    ValidateTargetOperator,
    end_mlflow_runs,
)
from onnxcast.airflow.params import pipeline_params, pipeline_templates, retry_delay
from onnxcast.pipeline.config import CHANNEL_LABELS, CHANNELS

ROLLOUT = Asset(name="onnxcast_rollout", uri="x-onnxcast://rollout")
# Weekly, Sunday 00:00 UTC. Unpausing must not start a run at once: the trigger form unpauses
# the DAG before it submits (its "unpause on trigger" box is on by default and Airflow 3.3.2 has
# no setting for it), so a submission the API then rejected left a paused-at-creation DAG
# unpaused, and a start_date + catchup=False schedule started its latest interval right away
# with the default params (4 families, 30 epochs). Without a start_date, run_immediately
# decides: the last tick runs only when it is under 10 minutes old (a margin so that a DAG
# processor pass just after the tick cannot push the first run a week on).
WEEKLY = CronTriggerTimetable("0 0 * * 0", timezone="UTC", run_immediately=timedelta(minutes=10))
# ... and whenever the monitor (dags/onnxcast_monitor.py) finds the served model degraded or its
# inputs drifted: an onnxcast_retrain asset event, whose conf (the deployed version's settings)
# check_data applies over the param defaults. An asset needs no start_date either.
SCHEDULE = AssetOrTimeSchedule(timetable=WEEKLY, assets=[RETRAIN])
RUN_DIR = "{{ ti.xcom_pull(task_ids='check_data', key='run_dir') }}"

with DAG(
    dag_id="onnxcast_training",
    description="Train or fetch, export, optimize, validate, register and promote ONNX forecasters",
    doc_md=__doc__,
    schedule=SCHEDULE,
    catchup=False,
    max_active_runs=1,
    tags=["onnxcast", "training", "mlflow"],
    render_template_as_native_obj=True,
    # end_mlflow_runs: also declared here so the mapped tasks carry it into the DAG processor,
    # which runs it when a worker died mid-task (heartbeat timeout): no MLflow run left RUNNING
    default_args={"owner": "onnxcast", "retries": 1, "retry_delay": retry_delay(timedelta(minutes=1)),
                  "on_failure_callback": end_mlflow_runs, "on_retry_callback": end_mlflow_runs},
    params={
        **pipeline_params(),  # data_uri ... model_name: from their declaration in PipelineConfig
        "channels": Param(list(CHANNELS), type="array", minItems=1, uniqueItems=True,
                          items={"type": "string", "enum": list(CHANNELS)}, examples=list(CHANNELS),
                          values_display=CHANNEL_LABELS,
                          description="Rollout channels to promote to when the challenger wins"),
        "fetch_from": Param(None, type=["null", "string"],
                            description="Start from an existing model instead of training: models:/name@alias, "
                                        "models:/name/version or s3://bucket/prefix/ (model.pt + model.json)"),
        "store_uri": Param(None, type=["null", "string"],
                           description="Rollout store: s3://bucket/prefix or a folder; empty: the deployment's "
                                       "ONNXCAST_STORE_URI (embedded mode: $ONNXCAST_HOME/rollout)"),
        "run_root": Param(None, type=["null", "string"],
                          description="Run store, where the tasks of this run hand files to each other: "
                                      "s3://bucket/prefix; empty: the deployment's ONNXCAST_RUN_ROOT "
                                      "(embedded mode: $ONNXCAST_HOME/runs)"),
        "compare_with_champion": Param(True, type="boolean",
                                       description="Evaluate the registered champion on this run's holdout and "
                                                   "promote only a challenger that beats it"),
        "min_improvement": Param(0.0, type="number", minimum=0,
                                 description="Relative improvement over the champion required to promote (on "
                                             "champion_metric: MAE/MASE or MSIS)"),
        "serving_url": Param(None, type=["null", "string"],
                             description="onnxcast serve following the cloud channel (http://host:port): when "
                                         "set, wait until it serves the promoted version"),
        "extra_settings": Param({}, type=["null", "object"],
                                description="Other pipeline settings by name (hidden_size, d_model, n_heads, "
                                            "num_layers, latency_repeats, accuracy_budget, quality, ...)"),
    },
) as dag:
    check = CheckDataOperator(
        task_id="check_data",
        settings=pipeline_templates(),
        extra_settings="{{ params.extra_settings }}",
        fetch_from="{{ params.fetch_from }}",
        run_root="{{ params.run_root }}",
        compare_with_champion="{{ params.compare_with_champion }}",
    )
    shards = check.output  # [0] for one series: one no-op task per shard step, nothing skipped
    # bounded fan-out: on a big deployment at most 8 shards of one step at a time
    per_shard = {"run_dir": RUN_DIR, "map_index_template": "shard-{{ task.shard }}", "max_active_tis_per_dag": 8}
    check_series = CheckSeriesOperator.partial(task_id="check_series", **per_shard).expand(shard=shards)
    merge = MergeDataOperator(task_id="merge_data", run_dir=RUN_DIR, shards=shards)
    per_family = {"run_dir": RUN_DIR, "map_index_template": "{{ task.family }}"}
    train = TrainOrFetchModelOperator.partial(task_id="train_or_fetch", max_active_tis_per_dag=2,
                                              **per_family).expand(family=merge.output)
    # the ensemble combines the families once they all trained (a mapped task per family cannot wait
    # for its siblings); what it returns, the families the run made, is what the later steps map over
    ensemble = EnsembleOperator(task_id="ensemble", run_dir=RUN_DIR)
    families = ensemble.output
    export = ExportModelOperator.partial(task_id="export", **per_family).expand(family=families)
    optimize = OptimizeModelOperator.partial(task_id="optimize", **per_family).expand(family=families)
    reference = ReferenceShardOperator.partial(task_id="reference", **per_shard).expand(shard=shards)
    evaluate = EvaluateShardOperator.partial(task_id="evaluate", **per_shard).expand(shard=shards)
    validate = ValidateModelOperator.partial(task_id="validate", **per_family).expand(family=families)
    requested = RunTargetsOperator(task_id="targets", run_dir=RUN_DIR)
    on_target = ValidateTargetOperator.partial(task_id="validate_target", run_dir=RUN_DIR,
                                               map_index_template="{{ task.target }}").expand(target=requested.output)
    # all_done_min_one_success over validate, targets and every target task: a failed target task fails
    # alone and the run registers what the other targets validated (the report says the failed one did
    # not finish); when the run never reached validation (a data gate failed) nothing succeeded upstream
    # and register is upstream_failed at once (with all_done it ran, failed and retried for two minutes)
    register = RegisterModelOperator(task_id="register", run_dir=RUN_DIR, retries=2,
                                     trigger_rule="all_done_min_one_success")
    decide = ChampionChallengerOperator(
        task_id="champion_challenger",
        run_dir=RUN_DIR,
        version="{{ ti.xcom_pull(task_ids='register')['version'] }}",
        min_improvement="{{ params.min_improvement }}",
    )
    promote = PromoteModelOperator(
        task_id="promote",
        run_dir=RUN_DIR,
        version="{{ ti.xcom_pull(task_ids='register')['version'] }}",
        channels="{{ params.channels }}",
        store_uri="{{ params.store_uri }}",
        decision="{{ ti.xcom_pull(task_ids='champion_challenger') }}",
        outlets=[ROLLOUT],
    )
    serving = ServingReadySensor(
        task_id="wait_until_serving",
        service_url="{{ params.serving_url }}",
        model_name="{{ params.model_name }}",
        version="{{ (ti.xcom_pull(task_ids='promote') or {}).get('version') }}",
        channels="{{ (ti.xcom_pull(task_ids='promote') or {}).get('channels') }}",
        trigger_rule="none_failed",  # a skipped promotion: nothing to wait for, the run stays green
    )
    check_series >> merge >> reference  # the reference runs while the families train
    train >> ensemble >> export >> optimize >> evaluate >> validate >> requested >> on_target
    [validate, requested, on_target] >> register
    register >> decide >> promote >> serving
    reference >> evaluate
