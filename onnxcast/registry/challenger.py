"""The challenger of a training run, in the registry: log the run and register its winning
family (alias ``challenger``), then judge it against the champion and record the decision.

Both read and write the run folder the pipeline steps left (report.json, plan.json) and the
MLflow server at ``tracking_uri``; the operators of onnxcast.airflow.registry call them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from onnxcast.base.errors import GateError
from onnxcast.base.files import read_json, write_json
from onnxcast.registry.champion import decide
from onnxcast.registry.plan import challengers, champion_entry
from onnxcast.registry.tracking import (
    RegisteredVersion,
    TrackedRun,
    log_pipeline_run,
    record_decision,
    redact_uri,
    register_model,
    run_url,
)


@dataclass(frozen=True)
class Registration:
    """A registered challenger: the version, the logged runs and the MLflow page of the run."""

    version: RegisteredVersion
    tracked: TrackedRun
    url: str

    def as_xcom(self) -> dict:
        return {**self.version.as_xcom(), "parent_run_id": self.tracked.parent_run_id}


def register_challenger(cfg: Any, *, run_key: str, tags: dict[str, str], tracking_uri: str,
                        ui_url: str | None = None, on_logged: Callable[[str], None] | None = None) -> Registration:
    """Assemble report.json from the run's validation, log the run and register the winning
    family as ``cfg.model_name`` with alias ``challenger`` (a retry finds the version registered
    for ``run_key`` before). The report then names the registered version (``report["mlflow"]``:
    what a promotion writes in the manifest). ``on_logged(url)`` is called as soon as the run is
    logged, with its MLflow page. GateError, after logging the failed report (run status
    FAILED), when a required gate fails: nothing is registered then."""
    # numpy, which this module's callers do not load
    from onnxcast.pipeline.run import assemble_report

    work = cfg.run_dir
    families = challengers(work)
    champion = champion_entry(work)

    def log_run() -> tuple[TrackedRun, str]:
        tracked = log_pipeline_run(work, model_name=cfg.model_name, run_key=run_key, families=families,
                                   extra_families=[champion["family"]] if champion else [],
                                   tracking_uri=tracking_uri, tags=tags)
        url = run_url(tracking_uri, tracked.experiment_id, tracked.parent_run_id, ui_url)
        if on_logged is not None:
            on_logged(url)
        return tracked, url

    try:
        assemble_report(cfg, families)
    except GateError:
        log_run()  # the failed report, for the MLflow page the task links to
        raise
    tracked, url = log_run()
    version = register_model(work, tracked, model_name=cfg.model_name, run_key=run_key, tracking_uri=tracking_uri)
    report = read_json(cfg.layout.report)
    report["mlflow"] = {"tracking_uri": redact_uri(tracking_uri), "model": cfg.model_name,
                        "version": version.version, "run_id": version.run_id,
                        "parent_run_id": tracked.parent_run_id, "experiment_id": tracked.experiment_id}
    write_json(cfg.layout.report, report)
    return Registration(version, tracked, url)


def judge_challenger(cfg: Any, version: str, *, min_improvement: float | str | None = 0.0,
                     require_beats_champion: bool = True, tracking_uri: str | None = None) -> dict:
    """Whether registered ``version`` replaces the champion (onnxcast.registry.champion.decide
    on the run folder, both measured in this run), recorded as tags on the version and metrics
    on the run's parent run. The decision, with ``challenger_version``."""
    decision = decide(cfg.run_dir, min_improvement=float(min_improvement or 0.0),
                      require_beats_champion=require_beats_champion, tracking_uri=tracking_uri)
    decision["challenger_version"] = str(version)
    parent = (read_json(cfg.layout.report).get("mlflow") or {}).get("parent_run_id")
    record_decision(cfg.model_name, str(version), decision, parent_run_id=parent, tracking_uri=tracking_uri)
    return decision
