"""The onnxcast operators, for DAG files: ``from onnxcast.airflow.operators import ...``.

Each turns context, params and connections into one onnxcast library call and pushes small
XCom values. Heavy libraries (torch, mlflow, onnxruntime, pandas) are imported inside
``execute`` only, so DAG files that import this parse fast."""

from onnxcast.airflow.links import MlflowRunLink
from onnxcast.airflow.monitor import MonitorChannelsOperator, RetrainSignalOperator
from onnxcast.airflow.registry import ChampionChallengerOperator, RegisterModelOperator
from onnxcast.airflow.retraining import RETRAIN
from onnxcast.airflow.rollout import (
    PromoteModelOperator,
    RefreshChannelsOperator,
    ReportRolloutOperator,
    RollbackChannelOperator,
    StageRegisteredVersionOperator,
    dispatch_requests,
    promote_requests,
    remember_failure,
)
from onnxcast.airflow.serving import ServingReadySensor
from onnxcast.airflow.steps import (
    CheckDataOperator,
    CheckSeriesOperator,
    EnsembleOperator,
    EvaluateShardOperator,
    ExportModelOperator,
    MergeDataOperator,
    OptimizeModelOperator,
    ReferenceShardOperator,
    TrainOrFetchModelOperator,
    ValidateModelOperator,
    end_mlflow_runs,
)
from onnxcast.airflow.targets import RunTargetsOperator, ValidateTargetOperator
from onnxcast.airflow.triggers import RegistryAliasTrigger, registry_alias_asset

__all__ = [
    "RETRAIN",
    "ChampionChallengerOperator",
    "CheckDataOperator",
    "CheckSeriesOperator",
    "EnsembleOperator",
    "EvaluateShardOperator",
    "ExportModelOperator",
    "MergeDataOperator",
    "MlflowRunLink",
    "MonitorChannelsOperator",
    "OptimizeModelOperator",
    "PromoteModelOperator",
    "ReferenceShardOperator",
    "RefreshChannelsOperator",
    "RegistryAliasTrigger",
    "RegisterModelOperator",
    "ReportRolloutOperator",
    "RetrainSignalOperator",
    "RollbackChannelOperator",
    "RunTargetsOperator",
    "ServingReadySensor",
    "StageRegisteredVersionOperator",
    "TrainOrFetchModelOperator",
    "ValidateModelOperator",
    "ValidateTargetOperator",
    "end_mlflow_runs",
    "dispatch_requests",
    "promote_requests",
    "registry_alias_asset",
    "remember_failure",
]
