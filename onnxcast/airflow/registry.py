"""Operators for MLflow: log the run and register the challenger; decide champion/challenger
(onnxcast.registry.challenger)."""

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
        from onnxcast.registry.challenger import register_challenger

        if not self.run_dir:  # the DAG's trigger rule keeps it from running after check_data failed; by hand it can
            raise AirflowFailException("no run directory: check_data did not succeed; nothing to register")
        tags = {"airflow.dag_id": context["dag_run"].dag_id, "airflow.run_id": context["run_id"]}
        with self.workspace(context, self.run_dir) as work:
            cfg = load_config(work)
            _require_validations(work)
            try:
                registered = register_challenger(cfg, run_key=run_key(context), tags=tags,
                                                 tracking_uri=self.mlflow_hook.tracking_uri,
                                                 ui_url=self.mlflow_hook.ui_url,
                                                 on_logged=lambda url: persist_mlflow_run_url(context, url))
            except GateError as exc:
                raise AirflowFailException(str(exc)) from None
        version = registered.version
        self.log.info("Registered %s version %s (%s)%s", cfg.model_name, version.version, version.family,
                      "" if version.created else " (found from an earlier try)")
        return registered.as_xcom()


def _require_validations(work) -> None:
    """Refuse, without a retry, a run where a family it made was never validated: register runs once
    ``validate`` succeeded for some family (a failed target must not stop it), so another family's
    ``validate`` may have failed; its missing validation.json is a fact, not a transient fault."""
    from onnxcast.pipeline.layout import RunLayout
    from onnxcast.registry.plan import made_families

    layout = RunLayout(work)
    missing = [family for family in made_families(work) if not layout.validation(family).is_file()]
    if missing:
        raise AirflowFailException(f"no validation of {', '.join(missing)} (its validate task did not succeed): "
                                   "nothing registered")


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
        from onnxcast.registry.challenger import judge_challenger

        with self.workspace(context, self.run_dir) as work:
            cfg = load_config(work)
            decision = judge_challenger(cfg, str(self.version), min_improvement=self.min_improvement,
                                        require_beats_champion=self.require_beats_champion,
                                        tracking_uri=self.mlflow_hook.tracking_uri)
            self.link_mlflow_run(context, cfg.model_name)
        self.log.info("%s: %s", "Promote" if decision["promote"] else "Keep the champion", decision["reason"])
        return decision
