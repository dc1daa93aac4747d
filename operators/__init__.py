"""Airflow operators and hooks for onnxcast: each turns context, params and connections into
one onnxcast library call and pushes small XCom values. Heavy libraries (torch, mlflow,
onnxruntime, pandas) are imported inside ``execute`` only."""

from operators.links import MlflowRunLink
from operators.pipeline import (
    CheckDataOperator,
    ExportModelOperator,
    OptimizeModelOperator,
    TrainOrFetchModelOperator,
    ValidateModelOperator,
)
from operators.registry import ChampionChallengerOperator, RegisterModelOperator
from operators.rollout import (
    PromoteModelOperator,
    RefreshChannelsOperator,
    RollbackChannelOperator,
    StageRegisteredVersionOperator,
)

__all__ = [
    "ChampionChallengerOperator",
    "CheckDataOperator",
    "ExportModelOperator",
    "MlflowRunLink",
    "OptimizeModelOperator",
    "PromoteModelOperator",
    "RefreshChannelsOperator",
    "RegisterModelOperator",
    "RollbackChannelOperator",
    "StageRegisteredVersionOperator",
    "TrainOrFetchModelOperator",
    "ValidateModelOperator",
]
