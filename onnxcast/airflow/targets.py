"""Operators for the deployment targets (onnxcast.targets.step, docs/targets.md): the run's targets
(``targets``, from its config.json), then one mapped task per target (``validate_target``) that runs
and judges every eligible variant of every validated family there. A target whose task fails fails
alone: the register step runs on what the others validated (its ``trigger_rule``: dags/onnxcast_training.py)
and the report records that target ``unavailable`` for the variants it did not judge."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from onnxcast.airflow.steps import TrackedOperator, load_config
from onnxcast.pipeline.layout import RunLayout

if TYPE_CHECKING:
    from airflow.sdk import Context

CONFIG = RunLayout("").config.as_posix()  # the run's settings: all the targets task reads


class RunTargetsOperator(TrackedOperator):
    """XCom: the run's deployment targets (its settings' ``targets``), what ``validate_target`` maps over."""

    template_fields: Sequence[str] = ("run_dir",)

    def __init__(self, *, run_dir: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir

    def execute(self, context: Context) -> list[str]:
        with self.workspace(context, self.run_dir, paths=[CONFIG]) as work:
            targets = list(load_config(work).targets)
        self.log.info("Deployment targets of this run: %s", ", ".join(targets))
        return targets


class ValidateTargetOperator(TrackedOperator):
    """Every eligible variant of every validated family on one target (mapped over the targets):
    parity with x86 ONNX Runtime and PyTorch, holdout accuracy, latency, size, environment
    (``models/<family>/targets/<target>.json``). XCom: ``{target, statuses: {family: {variant: status}}}``."""

    template_fields: Sequence[str] = ("run_dir", "target")

    def __init__(self, *, run_dir: str, target: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir
        self.target = target

    def step_name(self) -> str:
        return f"{self.task_id}.{self.target}"

    def execute(self, context: Context) -> dict:
        from onnxcast.targets.declarations import UnknownTargetError, target
        from onnxcast.targets.step import validate_on_target

        try:
            target(str(self.target))
        except UnknownTargetError as exc:
            raise AirflowFailException(str(exc)) from None
        statuses = {}
        with self.workspace(context, self.run_dir) as work:
            cfg = load_config(work)
            self.link_mlflow_run(context, cfg.model_name)
            for validation in sorted(cfg.layout.models.glob("*/validation.json")):
                family = validation.parent.name
                evidence = validate_on_target(cfg, family, self.target)
                statuses[family] = {v: r["status"] for v, r in evidence["variants"].items()}
                self.log.info("%s on %s: %s", family, self.target,
                              ", ".join(f"{v} {s}" for v, s in statuses[family].items()) or "no eligible variant")
        return {"target": self.target, "statuses": statuses}
