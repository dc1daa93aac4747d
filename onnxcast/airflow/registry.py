"""Operators for MLflow: log the run and register the challenger; decide champion/challenger."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from onnxcast.airflow.links import persist_mlflow_run_url
from onnxcast.airflow.steps import TrackedOperator, load_config, run_key
from onnxcast.base.errors import GateError

if TYPE_CHECKING:
    from airflow.sdk import Context


class RegisterModelOperator(TrackedOperator):
    """Assemble report.json, log the run to MLflow and register the winning family.

    The registered version gets the alias ``challenger``; a retry finds the version it
    registered before (tagged with the DAG run) instead of adding another. When a required
    gate fails, the failed report is still logged (run status FAILED) and the task fails.
    XCom: ``{name, version, run_id, model_uri, family, created, parent_run_id}``.
    """

    template_fields: Sequence[str] = ("run_dir",)

    def __init__(self, *, run_dir: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir

    def execute(self, context: Context) -> dict:
        with self.workspace(context, self.run_dir) as work:
            return self._register(context, work)

    def _register(self, context: Context, work) -> dict:
        from onnxcast.base.files import read_json, write_json
        from onnxcast.pipeline.run import assemble_report
        from onnxcast.registry.plan import challengers, champion_entry
        from onnxcast.registry.tracking import log_pipeline_run, register_model, run_url

        cfg = load_config(work)
        families = challengers(work)
        champion = champion_entry(work)
        extra = [champion["family"]] if champion else []
        key = run_key(context)
        tags = {"airflow.dag_id": context["dag_run"].dag_id, "airflow.run_id": context["run_id"]}
        try:
            assemble_report(cfg, families)
        except GateError as exc:
            tracked = log_pipeline_run(work, model_name=cfg.model_name, run_key=key, families=families,
                                       extra_families=extra, tracking_uri=self.mlflow_hook.tracking_uri, tags=tags)
            persist_mlflow_run_url(context, run_url(self.mlflow_hook.tracking_uri, tracked.experiment_id,
                                                    tracked.parent_run_id, self.mlflow_hook.ui_url))
            raise AirflowFailException(str(exc)) from None
        tracked = log_pipeline_run(work, model_name=cfg.model_name, run_key=key, families=families,
                                   extra_families=extra, tracking_uri=self.mlflow_hook.tracking_uri, tags=tags)
        persist_mlflow_run_url(context, run_url(self.mlflow_hook.tracking_uri, tracked.experiment_id,
                                                tracked.parent_run_id, self.mlflow_hook.ui_url))
        version = register_model(work, tracked, model_name=cfg.model_name, run_key=key,
                                 tracking_uri=self.mlflow_hook.tracking_uri)
        # promotion names the registry version in the rollout manifest (report["mlflow"])
        report_path = cfg.layout.report
        report = read_json(report_path)
        report["mlflow"] = {"tracking_uri": _public(self.mlflow_hook.tracking_uri), "model": cfg.model_name,
                            "version": version.version, "run_id": version.run_id,
                            "parent_run_id": tracked.parent_run_id, "experiment_id": tracked.experiment_id}
        write_json(report_path, report)
        self.log.info("Registered %s version %s (%s)%s", cfg.model_name, version.version, version.family,
                      "" if version.created else " (found from an earlier try)")
        return {**version.as_xcom(), "parent_run_id": tracked.parent_run_id}


class ChampionChallengerOperator(TrackedOperator):
    """Decide whether the registered challenger replaces the champion (both measured in this run).

    Records the comparison as tags on the model version and metrics on the parent run.
    XCom: the decision (``promote``, ``reason``, both MAEs, versions).
    """

    template_fields: Sequence[str] = ("run_dir", "version", "min_improvement")

    def __init__(self, *, run_dir: str, version: str, min_improvement: float | str = 0.0,
                 require_beats_champion: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir
        self.version = version
        self.min_improvement = min_improvement
        self.require_beats_champion = require_beats_champion

    def execute(self, context: Context) -> dict:
        with self.workspace(context, self.run_dir) as work:
            return self._decide(context, work)

    def _decide(self, context: Context, work) -> dict:
        from onnxcast.base.files import read_json
        from onnxcast.registry.champion import decide
        from onnxcast.registry.tracking import record_decision

        cfg = load_config(work)
        decision = decide(work, min_improvement=float(self.min_improvement or 0.0),
                          require_beats_champion=self.require_beats_champion,
                          tracking_uri=self.mlflow_hook.tracking_uri)
        decision["challenger_version"] = str(self.version)
        parent = (read_json(cfg.layout.report).get("mlflow") or {}).get("parent_run_id")
        record_decision(cfg.model_name, str(self.version), decision, parent_run_id=parent,
                        tracking_uri=self.mlflow_hook.tracking_uri)
        self.link_mlflow_run(context, cfg.model_name)
        self.log.info("%s: %s", "Promote" if decision["promote"] else "Keep the champion", decision["reason"])
        return decision


def _public(uri: str) -> str:
    from onnxcast.registry.tracking import redact_uri

    return redact_uri(uri)
