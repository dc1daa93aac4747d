"""MLflow tracking and registry for pipeline runs (docs/architecture.md#mlflow-conventions).

One experiment per model name; a parent run per pipeline run and a child run per model
family; the winning family registered as one model version (ONNX flavor, with its other
variants, the PyTorch state dict, model.json and report.json as files of that version)
under the alias ``challenger``. ``champion`` moves only after a promotion, and every
alias move is also written as a tag, because MLflow keeps no history (mlflow#2169).

A run over several series logs aggregates, never one metric per series: ``fleet.*`` on the
parent, ``<variant>.fleet_mase_mean`` and the paired tests across series on each child, the
per-series tables as Parquet artifacts (``per_series/``) and one compact table for the UI.

Every write is keyed on a *run key* (the DAG run: ``dag_id/run_id``) and looked up before
it is made, so a retried task reuses the runs and the model version of its first try.
mlflow is imported inside functions: Airflow operators import this module at run time.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from onnxcast.base import environment
from onnxcast.base.contract import QUANTILES_NAME, format_quantile_levels
from onnxcast.base.errors import DataError, OnnxcastError
from onnxcast.base.files import onnxcast_home, read_json, sha256_file
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.judging import ACROSS_SERIES, report_judging
from onnxcast.pipeline.layout import RunLayout
from onnxcast.registry import interval_figures

log = logging.getLogger(__name__)

CHALLENGER = "challenger"
CHAMPION = "champion"
RUN_KEY_TAG = "onnxcast.run_key"
ROLE_TAG = "onnxcast.role"
FAMILY_TAG = "onnxcast.family"
REPORT_SHA_TAG = "onnxcast.report_sha256"
MODEL_ARTIFACT = "model"
PYTORCH_FILES = ("model.pt", "model.json")
DEFAULT_UI_URL = environment.default("ONNXCAST_MLFLOW_UI_URL")
BANDS = ((0.95, 0.15), (0.8, 0.3))  # the forecast plot's intervals (nominal, opacity), widest first
SERIES = "series"  # the id column of every per-series table
MAX_TABLE_ROWS = 50_000  # above this, the UI table is skipped and only the Parquet files are logged
TABLE_ARTIFACT = "per_series.json"
# the numbers of a paired test worth a metric (the rest: alpha, min_origins, the test's name)
TEST_KEYS = ("p_value", "robust_p", "mean_diff", "statistic", "significant", "origins", "series")
# ONNX metadata of a global model (onnxcast.pipeline.export) and the version tags made from it
GLOBAL_META = ("onnxcast.global", "onnxcast.n_series", "onnxcast.series_column")


class TrackingError(OnnxcastError):
    """MLflow refused an operation, or holds no run, model version or alias asked for."""


@dataclass(frozen=True)
class TrackedRun:
    """The MLflow runs of one pipeline run."""

    experiment_id: str
    parent_run_id: str
    family_run_ids: dict[str, str]


@dataclass(frozen=True)
class RegisteredVersion:
    """A registered model version; ``created`` is False when a retry found it already there."""

    name: str
    version: str
    run_id: str
    model_uri: str
    family: str
    created: bool

    def as_xcom(self) -> dict:
        return asdict(self)


# --- where MLflow is ----------------------------------------------------------------------

def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else the embedded SQLite store under ``ONNXCAST_HOME``."""
    return environment.get("MLFLOW_TRACKING_URI") or f"sqlite:///{onnxcast_home() / 'mlflow' / 'mlflow.db'}"


def bound_requests() -> None:
    """MLflow retries a failed request 7 times with a backoff factor of 2 (minutes when the
    server is down): bound it, so a task or a command fails within about a minute (Airflow's
    retry takes over in a task). The ``MLFLOW_HTTP_REQUEST_*`` variables a deployment sets win.
    MLflow reads them from its environment only (its REST store takes no such argument): set as
    this process's defaults."""
    for name, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                        ("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0.5"), ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")):
        environment.set_default(name, value)


def client_for(tracking_uri: str | None = None):
    """An MlflowClient on ``tracking_uri`` (registry on the same URI), set as the fluent default too."""
    import mlflow

    uri = tracking_uri or default_tracking_uri()
    environment.set_default("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # read from the environment only
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    # mlflow also exports the URIs as MLFLOW_TRACKING_URI and MLFLOW_REGISTRY_URI (for
    # subprocesses); the user's own settings are put back, or the next default_tracking_uri()
    # (and every subprocess started later) would talk to this server
    with environment.restoring("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
    return mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_experiment(client, name: str) -> str:
    """The id of experiment ``name``, created on first use (local artifacts beside a SQLite store)."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    uri = client.tracking_uri
    location = None
    if uri.startswith("sqlite:///"):  # no server to manage artifacts: keep them next to the DB
        location = (Path(uri[len("sqlite:///"):]).parent / "artifacts").as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException:  # a concurrent task created it first
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def run_url(tracking_uri: str | None, experiment_id: str, run_id: str, ui_url: str | None = None) -> str:
    """The MLflow UI page of a run: the server itself over HTTP, else ``ui_url`` (``mlflow ui``)."""
    uri = tracking_uri or default_tracking_uri()
    base = ui_url or (uri if uri.startswith(("http://", "https://")) else
                      environment.value("ONNXCAST_MLFLOW_UI_URL"))
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


# --- logging a pipeline run ---------------------------------------------------------------

def ensure_run(*, model_name: str, run_key: str, family: str | None = None, role: str | None = None,
               tracking_uri: str | None = None, ui_url: str | None = None,
               tags: dict[str, str] | None = None) -> dict:
    """The MLflow run of ``run_key`` (the parent run, or the child run of ``family``),
    created on first use: ``{"experiment_id", "run_id", "url"}``. Tasks call it to link to
    their run before there is anything to log."""
    client = client_for(tracking_uri)
    experiment_id = ensure_experiment(client, model_name)
    base = {RUN_KEY_TAG: run_key, **(tags or {})}
    parent = _find_or_create_run(client, experiment_id, run_key, "pipeline", None,
                                 {**base, ROLE_TAG: "pipeline"}, f"pipeline {run_key}")
    run_id = parent
    if family:
        role = role or "family"
        run_id = _find_or_create_run(client, experiment_id, run_key, role, family,
                                     {**base, ROLE_TAG: role, FAMILY_TAG: family, "mlflow.parentRunId": parent},
                                     family)
    return {"experiment_id": experiment_id, "run_id": run_id, "parent_run_id": parent,
            "url": run_url(client.tracking_uri, experiment_id, run_id, ui_url)}


def end_open_runs(run_key: str, status: str, *, family: str | None = None, parent: bool = True,
                  model_name: str | None = None, tracking_uri: str | None = None) -> list[str]:
    """Mark the RUNNING runs of ``run_key`` ``status`` (FAILED or KILLED): the child run of
    ``family`` and, with ``parent``, the pipeline run. A failed or killed task calls it so
    that no run is left RUNNING; a retry takes its run over again (ensure_run). Returns the
    run ids it ended."""
    if status not in ("FAILED", "KILLED"):
        raise ValueError(f"status must be FAILED or KILLED, got {status!r}")
    client = client_for(tracking_uri)
    if model_name:
        experiment = client.get_experiment_by_name(model_name)
        experiments = [experiment.experiment_id] if experiment is not None else []
    else:
        experiments = [e.experiment_id for e in client.search_experiments(max_results=1000)]
    if not experiments:
        return []
    roles = []
    if family:
        roles.append(f"tags.`{FAMILY_TAG}` = '{_quote(family)}'")
    if parent:
        roles.append(f"tags.`{ROLE_TAG}` = 'pipeline'")
    ended = []
    for role in roles:
        query = f"tags.`{RUN_KEY_TAG}` = '{_quote(run_key)}' and attributes.status = 'RUNNING' and {role}"
        for run in client.search_runs(experiments, filter_string=query, max_results=100):
            client.set_terminated(run.info.run_id, status)
            ended.append(run.info.run_id)
    return ended


def log_failed_data_check(quality_dir: str | Path, *, model_name: str, run_key: str, error: str,
                          tracking_uri: str | None = None, ui_url: str | None = None) -> dict:
    """Record a run stopped by the data-quality gate: the GX report (HTML + JSON) as artifacts
    of the pipeline run, the error as a tag, the run marked FAILED. Nothing is registered."""
    run = ensure_run(model_name=model_name, run_key=run_key, tracking_uri=tracking_uri, ui_url=ui_url)
    client = client_for(tracking_uri)
    quality_dir = Path(quality_dir)
    if quality_dir.is_dir():
        client.log_artifacts(run["run_id"], str(quality_dir), "quality")
    client.set_tag(run["run_id"], "onnxcast.status", "data-check-failed")
    client.set_tag(run["run_id"], "onnxcast.error", error[:4900])
    client.set_terminated(run["run_id"], "FAILED")
    return run


def log_pipeline_run(run_dir: str | Path, *, model_name: str, run_key: str, families: list[str],
                     tracking_uri: str | None = None, tags: dict[str, str] | None = None,
                     extra_families: list[str] = ()) -> TrackedRun:
    """Log a finished run directory: parent run (params, report, plot, quality report) and a
    child run per family (per-variant metrics, validation.json, ONNX files, state dict).

    ``extra_families`` are evaluated but not candidates (the fetched champion); they are
    logged as child runs too so the comparison is visible. Reuses the runs of ``run_key``.

    A fleet run (docs/design/fleet.md 4.5) logs aggregates, never one metric per series:
    ``fleet.*`` on the parent (series kept/excluded/padded, the best naive's and the
    reference's mean MASE with intervals), ``<variant>.fleet_mase_mean`` and the paired
    tests on each child; the per-series tables as Parquet artifacts (``per_series/``) and one
    compact table for the UI (``per_series.json``); no forecast plot (there is no one series).
    """
    layout = RunLayout(run_dir)
    cfg = PipelineConfig.load(layout.config)
    report_path = layout.report if layout.report.exists() else layout.failed_report
    report = read_json(report_path)
    client = client_for(tracking_uri)
    experiment_id = ensure_experiment(client, model_name)
    parent = ensure_run(model_name=model_name, run_key=run_key, tracking_uri=tracking_uri, tags=tags)["run_id"]
    client.log_batch(parent, params=_params(_flatten(cfg.to_dict())))
    _log_batch(client, parent, metrics=pipeline_metrics(report), tags=pipeline_tags(report, cfg))
    _log_pipeline_artifacts(client, parent, layout, report, report_path, [*families, *extra_families])
    children = {}
    for family in [*families, *extra_families]:
        role = "champion-evaluation" if family in extra_families else "family"
        child = _find_or_create_run(client, experiment_id, run_key, role, family,
                                    {RUN_KEY_TAG: run_key, **(tags or {}), ROLE_TAG: role, FAMILY_TAG: family,
                                     "mlflow.parentRunId": parent}, f"{family}")
        _log_family(client, child, layout, family, report if is_fleet_report(report) else None, report=report)
        client.set_terminated(child, "FINISHED")
        children[family] = child
    client.set_terminated(parent, "FINISHED" if report.get("status", "passed") == "passed" else "FAILED")
    log.info("logged run %s to MLflow experiment %s (parent run %s)", run_key, model_name, parent)
    return TrackedRun(experiment_id, parent, children)


def pipeline_metrics(report: dict) -> dict[str, float]:
    """The pipeline run's metrics: every baseline's and the reference's figures and intervals,
    the families' paired tests; over several series, the ``fleet.*`` aggregates (never one
    metric per series: those go in the per-series Parquet artifacts)."""
    baselines = report["baselines"]
    metrics = {f"baseline.seasonal_naive.{k}": v for k, v in _scalars(baselines["seasonal_naive"]).items()}
    for name, row in (baselines.get("candidates") or {}).items():  # naive and each seasonal naive
        metrics.update({f"baseline.{name}.{k}": v for k, v in _scalars(row).items()})
    if report.get("reference"):  # the statistical reference on the same origins
        metrics.update({f"reference.{k}": v for k, v in _scalars(report["reference"]).items()})
    # the intervals of the best baseline and the reference (absent from reports before forecast distributions)
    metrics.update({f"baseline.seasonal_naive.{k}": v
                    for k, v in interval_figures.numbers(baselines["seasonal_naive"].get("intervals") or {}).items()})
    metrics.update({f"reference.{k}": v
                    for k, v in interval_figures.numbers((report.get("reference") or {}).get("intervals") or {}).items()})
    for model in report.get("models", []):
        for name, test in (model.get("fp32_vs") or {}).items():
            metrics.update({f"{model['family']}.fp32_vs_{name}.{k}": v for k, v in _scalars(test).items()})
    if is_fleet_report(report):
        metrics.update(_fleet_parent_metrics(report))
    return metrics


def pipeline_tags(report: dict, cfg: PipelineConfig) -> dict[str, str]:
    """The pipeline run's tags: best baseline, reference, dataset (with its series column and
    count over several series), status and the selected variants."""
    tags = {}
    if report["baselines"].get("best"):
        tags["onnxcast.baseline"] = report["baselines"]["best"]
    if report.get("reference"):
        tags["onnxcast.reference"] = report["reference"]["model"]
    for key in ("rows", "sha256", "start", "end", "freq"):
        tags[f"onnxcast.dataset.{key}"] = str(report["dataset"].get(key))
    if is_fleet_report(report):
        tags["onnxcast.dataset.series_column"] = str(cfg.series_column)
        tags["onnxcast.dataset.n_series"] = str(report["dataset"].get("n_series"))
    tags["onnxcast.status"] = report.get("status", "passed")
    for channel, choice in (report.get("selected") or {}).items():
        tags[f"onnxcast.selected.{channel}"] = f"{choice['family']}/{choice['variant']}"
    return tags


def _log_pipeline_artifacts(client, run_id: str, layout: RunLayout, report: dict, report_path: Path,
                            families: list[str]) -> None:
    """The report, the ranking table and the quality report; the selected family's holdout
    as a picture for one series, the per-series tables for several (there is no one series)."""
    client.log_artifact(run_id, str(report_path))
    if report.get("ranking"):  # every candidate with its goal figures, as a table in the MLflow UI
        client.log_table(run_id, data=_ranking_table(report["ranking"]), artifact_file="ranking.json")
    if layout.quality.is_dir():
        client.log_artifacts(run_id, str(layout.quality), "quality")
    selected = (report.get("selected") or {}).get("edge", {}).get("family")
    if is_fleet_report(report):
        _log_fleet_tables(client, run_id, layout, families, selected)
    elif selected:
        plot = plot_forecast(layout.root, selected, layout.plots / "forecast_vs_actual.png")
        client.log_artifact(run_id, str(plot), "plots")


def register_model(run_dir: str | Path, tracked: TrackedRun, *, model_name: str, run_key: str,
                   tracking_uri: str | None = None) -> RegisteredVersion:
    """Register the report's selected family as one model version with alias ``challenger``.

    A version already registered for ``run_key`` is returned instead of a new one, so a
    retried task never adds a duplicate version.
    """
    import mlflow

    layout = RunLayout(run_dir)
    report = read_json(layout.report)
    family = report["selected"]["edge"]["family"]
    client = client_for(tracking_uri)
    existing = find_version(client, model_name, run_key)
    if existing is not None:
        log.info("model version %s of %s already registered for %s: nothing to do", existing.version,
                 model_name, run_key)
        client.set_registered_model_alias(model_name, CHALLENGER, existing.version)
        return RegisteredVersion(model_name, str(existing.version), existing.run_id, f"models:/{model_name}/{existing.version}",
                                 family, created=False)
    child = tracked.family_run_ids[family]
    info, levels = _log_model(client, layout, report, tracked.experiment_id, child, family, run_key)
    client.set_terminated(child, "FINISHED")
    tags = {RUN_KEY_TAG: run_key, FAMILY_TAG: family, REPORT_SHA_TAG: sha256_file(layout.report),
            "onnxcast.parent_run_id": tracked.parent_run_id,
            "onnxcast.fp32_holdout_mae": str(_family_entry(report, family)["fp32_holdout_mae"]),
            "onnxcast.selected": json.dumps(report["selected"], sort_keys=True)}
    if is_fleet_report(report):  # what a later run checks before it compares with this version (champion.decide)
        tags.update(global_version_tags(layout, report, family))
    tags.update(interval_tags(report, family, levels))
    _ensure_registered_model(client, model_name)
    version = mlflow.register_model(info.model_uri, model_name, tags=tags)
    client.set_registered_model_alias(model_name, CHALLENGER, version.version)
    client.set_tag(tracked.parent_run_id, "onnxcast.model_version", version.version)
    log.info("registered %s version %s (%s) with alias %s", model_name, version.version, family, CHALLENGER)
    return RegisteredVersion(model_name, str(version.version), child, f"models:/{model_name}/{version.version}",
                             family, created=True)


def _log_model(client, layout: RunLayout, report: dict, experiment_id: str, child: str, family: str,
               run_key: str):
    """(the logged ONNX model's info, its quantile levels): every variant, the PyTorch files,
    validation and report as its files, linked to the family's child run and its metrics."""
    import mlflow
    import numpy as np
    import onnx
    from mlflow.entities import LoggedModelOutput

    example = _input_example(layout, report)
    signature, levels = _signature(layout.onnx(family), example)
    # every variant (fp32 too, byte for byte: the flavor re-serializes its own copy)
    extra_files = [str(p) for p in sorted(layout.onnx_dir(family).glob("*.onnx"))]
    extra_files += [str(layout.family(family) / name) for name in PYTORCH_FILES]
    extra_files += [str(layout.validation(family)), str(layout.report)]
    # The logged model is made here and linked to the child run and its metrics in two calls.
    # mlflow.onnx.log_model inside the run would read the history of every metric of the run
    # (one request each: 109 of the 305 a registration cost on the stack, issue 30 item 4).
    params = {k: str(v)[:6000] for k, v in family_params(layout, family).items()}
    logged = client.create_logged_model(experiment_id, name=MODEL_ARTIFACT, source_run_id=child, params=params)
    # the requirements MLflow would infer (mlflow, numpy, onnx, onnxruntime) named here: inferring
    # them loads the model in a subprocess, 14 of the 17 s of a registration measured over HTTP
    requirements = [f"mlflow=={mlflow.__version__}", f"numpy=={np.__version__}",
                    *mlflow.onnx.get_default_pip_requirements()]
    info = mlflow.onnx.log_model(
        onnx.load(str(layout.onnx(family))), name=MODEL_ARTIFACT, signature=signature,
        input_example={"history": example}, save_as_external_data=False, model_id=logged.model_id,
        onnx_execution_providers=["CPUExecutionProvider"], extra_files=extra_files, pip_requirements=requirements,
        metadata={"onnxcast_family": family, "onnxcast_run_key": run_key})
    client.log_outputs(child, [LoggedModelOutput(logged.model_id, step=0)])
    fleet_report = report if is_fleet_report(report) else None
    _log_batch(client, child, metrics=family_metrics(layout, family, fleet_report), model_id=logged.model_id)
    return info, levels


def _input_example(layout: RunLayout, report: dict):
    """Two real histories for the signature: the holdout's of one series, else of the checked fleet."""
    if is_fleet_report(report):
        return _fleet_input_example(layout, PipelineConfig.load(layout.config).lookback)
    return _holdout_example(layout)


def _signature(onnx_path: Path, example):
    """(the model's signature, its quantile levels). The contract: batch and time are dynamic
    (infer_signature fixes time at the example's); a model with forecast distributions also has
    quantiles [batch, horizon, Q]."""
    import numpy as np
    from mlflow.models import infer_signature
    from mlflow.types import Schema, TensorSpec

    output, quantiles, levels = interval_figures.forecast_and_quantiles(onnx_path, example)
    inferred = infer_signature({"history": example}, {"forecast": output})
    outputs = [TensorSpec(np.dtype("float32"), (-1, output.shape[1]), "forecast")]
    if quantiles is not None:
        outputs.append(TensorSpec(np.dtype("float32"), (-1, *quantiles.shape[1:]), QUANTILES_NAME))
    signature = type(inferred)(
        inputs=Schema([TensorSpec(np.dtype("float32"), (-1, -1, example.shape[2]), "history")]),
        outputs=Schema(outputs), params=inferred.params)
    return signature, levels


def interval_tags(report: dict, family: str, levels: tuple[float, ...] | None) -> dict[str, str]:
    """Tags of the version's forecast distribution: the quantile levels of its ONNX model and
    fp32's holdout coverage of the 80% and 95% intervals and 95% MSIS (a fleet: means over
    series), what a later champion/challenger on ``msis`` reads when the champion is not
    evaluated again. None of them for a model without quantiles or a report without the figures."""
    tags = {}
    if levels:
        tags["onnxcast.quantile_levels"] = format_quantile_levels(levels)
    figures = interval_figures.family_intervals(report, family)
    for key in ("coverage_80", "coverage_95", "msis_95"):
        value = interval_figures.numbers(figures).get(key)
        if value is not None and value == value:
            tags[f"onnxcast.fp32_{key}"] = repr(value)
    # calibrated, not_judged, recalibrated, uncalibrated (pipeline.validate.interval_verdict): what
    # the version's intervals may be relied on for, beside the figures
    status = ((_family_entry(report, family) or {}).get("intervals") or {}).get("status")
    if status:
        tags["onnxcast.intervals_status"] = str(status)
    return tags


def find_version(client, model_name: str, run_key: str):
    """The model version registered for ``run_key``, or None."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_model_versions(
            f"name = '{_quote(model_name)}' and tags.`{RUN_KEY_TAG}` = '{_quote(run_key)}'")
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    return min(found, key=lambda v: int(v.version)) if found else None


def resolve_version(model_name: str, ref: str, tracking_uri: str | None = None):
    """The ModelVersion for ``ref``: a version number or an alias; TrackingError naming what is missing."""
    from mlflow.exceptions import MlflowException

    client = client_for(tracking_uri)
    ref = str(ref).strip()
    try:
        if ref.isdigit():
            return client.get_model_version(model_name, ref)
        return client.get_model_version_by_alias(model_name, ref)
    except MlflowException as exc:
        what = f"version {ref}" if ref.isdigit() else f"alias {ref!r}"
        raise TrackingError(f"models:/{model_name}: no {what} in the registry at "
                            f"{redact_uri(client.tracking_uri)} ({exc.error_code})") from None


def alias_version(model_name: str, alias: str, tracking_uri: str | None = None) -> str | None:
    """The version ``alias`` points to, or None when the model or the alias does not exist."""
    try:
        return str(resolve_version(model_name, alias, tracking_uri).version)
    except TrackingError:
        return None


def record_decision(model_name: str, version: str, decision: dict, *, parent_run_id: str | None,
                    tracking_uri: str | None = None) -> None:
    """Write the champion/challenger comparison on the version (tags) and the parent run."""
    client = client_for(tracking_uri)
    for key, value in _flatten(decision, "onnxcast.decision").items():
        client.set_model_version_tag(model_name, version, key, "" if value is None else str(value))
    if parent_run_id:
        metrics = {f"decision.{k}": float(v) for k, v in decision.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)}
        _log_metrics(client, parent_run_id, metrics)
        client.set_tag(parent_run_id, "onnxcast.decision.promote", str(bool(decision.get("promote"))))
        client.log_dict(parent_run_id, decision, "champion_challenger.json")


def set_champion(model_name: str, version: str, *, record: dict, tracking_uri: str | None = None) -> str | None:
    """Move alias ``champion`` to ``version`` and record the move; returns the previous champion."""
    client = client_for(tracking_uri)
    previous = alias_version(model_name, CHAMPION, tracking_uri)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    entry = json.dumps({"version": str(version), "from_version": previous, **record}, sort_keys=True)
    if previous != str(version):
        client.set_registered_model_alias(model_name, CHAMPION, str(version))
        # the registered model's tags are the alias history MLflow does not keep
        client.set_registered_model_tag(model_name, f"onnxcast.champion.{stamp}", entry[:5000])
    client.set_model_version_tag(model_name, str(version), "onnxcast.promoted", entry[:5000])
    if previous and previous != str(version):
        client.set_model_version_tag(model_name, previous, "onnxcast.replaced_by", str(version))
    return previous


def download_version_files(model_name: str, version: str, dest: str | Path,
                           tracking_uri: str | None = None) -> Path:
    """Download the files of a model version into ``dest``; returns the folder holding MLmodel."""
    import mlflow

    client_for(tracking_uri)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{model_name}/{version}",
                                                     dst_path=str(dest)))
    return local


# --- the plot -----------------------------------------------------------------------------

def plot_forecast(run_dir: str | Path, family: str, path: str | Path, variant: str = "fp32") -> Path:
    """Forecast (ONNX ``variant``) vs actual over the holdout, with the seasonal-naive baseline,
    and the model's 80% and 95% intervals as bands when it has a quantiles output (from the
    same ONNX run as the forecast, at the same origins)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from onnxcast.pipeline.fleet_data import load_split
    from onnxcast.pipeline.metrics import seasonal_naive
    from onnxcast.pipeline.validate import holdout_windows

    layout = RunLayout(run_dir)
    cfg = PipelineConfig.load(layout.config)
    series, split = load_split(layout.fleet, cfg)
    holdout = holdout_windows(cfg, series, split)

    # origins overlap (a stride below the horizon): plot back-to-back windows only
    keep, end = [], -1
    for i, origin in enumerate(holdout.origins):
        if origin >= end:
            keep.append(i)
            end = origin + cfg.horizon
    holdout = replace(holdout, history=holdout.history[keep], actual=holdout.actual[keep],
                      origins=holdout.origins[keep])
    predicted, quantiles, levels = interval_figures.forecast_and_quantiles(layout.onnx(family, variant),
                                                                           holdout.history)
    naive_name = read_json(layout.report)["baselines"].get("best", "seasonal_naive") \
        if layout.report.exists() else "seasonal_naive"
    season = int(naive_name.rsplit("_", 1)[1]) if naive_name.startswith("seasonal_naive_") else (
        1 if naive_name == "naive" else series.season)
    naive = seasonal_naive(series.target(0), holdout.origins, cfg.horizon, season)
    steps = (holdout.origins[:, None] + np.arange(cfg.horizon)[None, :]).ravel()
    times = series.timestamps(0)[steps]
    figure, axis = plt.subplots(figsize=(12, 4))
    axis.plot(times, holdout.actual.ravel(), label="actual", color="black", linewidth=1)
    axis.plot(times, naive.ravel(), label=naive_name.replace("_", " "), color="grey", linewidth=0.8, alpha=0.7)
    for nominal, alpha in BANDS:
        interval = interval_figures.band(quantiles, levels, nominal) if quantiles is not None else None
        if interval is not None:
            axis.fill_between(times, interval[0].ravel(), interval[1].ravel(), color="tab:blue", alpha=alpha,
                              linewidth=0, label=f"{family} {variant} {round(100 * nominal)}% interval")
    axis.plot(times, predicted.ravel(), label=f"{family} {variant}", color="tab:blue", linewidth=1)
    axis.set_title(f"{cfg.target_column}: holdout forecast vs actual (horizon {cfg.horizon})")
    axis.legend(loc="upper right")
    figure.autofmt_xdate()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


# --- several series: aggregates and per-series tables (docs/design/fleet.md section 4.5) ------
# A fleet is judged on thousands of series; MLflow gets the *aggregates* as metrics (tens of
# them, never one per series) and the per-series tables as Parquet artifacts, plus one compact
# table for the UI. Every input is optional: a run from an older layout (no per-series table,
# no reference, no ``fleet`` block in validation.json) logs what it has.

def is_fleet_report(report: dict) -> bool:
    """A report judged across series: its ``judging`` says so (``judging.report_judging``,
    which reads a report from before the field by its ``fleet`` block). A long table that kept
    one series is judged as one series (issue 31: its config's series column says nothing)."""
    return report_judging(report) == ACROSS_SERIES


def _count(value) -> int | None:
    """A count from a report field that holds either the count or the list of what it counts."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, list | tuple | dict):
        return len(value)
    return None


def _fleet_parent_metrics(report: dict) -> dict[str, float]:
    """``fleet.*`` metrics of the pipeline run: series kept, excluded and padded, the best
    naive's and each reference model's aggregates (mean MASE with its interval, sMAPE, MAPE)."""
    fleet = report.get("fleet") or {}
    gate = (report.get("quality") or {}).get("series") or {}  # dataset.json's quality.series
    metrics: dict[str, float] = {}
    for key, fallback in (("series", "n_series"), ("excluded", "excluded"), ("padded", "padded"),
                          ("shards", "shards")):
        value = _count(fleet.get(fallback if key == "series" else key))
        if value is None:
            value = _count(gate.get("kept" if key == "series" else key))
        if value is not None:
            metrics[f"fleet.{key}"] = value
    if isinstance(gate.get("excluded_share"), int | float):
        metrics["fleet.excluded_share"] = gate["excluded_share"]
    best = (fleet.get("baselines") or {}).get("best_naive")
    if best:
        metrics.update({f"fleet.best_naive.{k}": v for k, v in _scalars(_aggregate_numbers(best)).items()})
        metrics.update({f"fleet.best_naive.{k}": v for k, v in interval_figures.numbers(best.get("intervals") or {}).items()})
    reference = fleet.get("reference") or {}
    for model, aggregate in (reference.get("aggregates") or {}).items():
        metrics.update({f"fleet.reference.{model}.{k}": v for k, v in _scalars(_aggregate_numbers(aggregate)).items()})
        # its own level=[80, 95] intervals, means over series (absent before forecast distributions)
        metrics.update({f"fleet.reference.{model}.{k}": v for k, v in interval_figures.numbers(aggregate.get("intervals") or {}).items()})
    if isinstance(reference.get("sample_size"), int | float):
        metrics["fleet.reference.sample_size"] = reference["sample_size"]
    return metrics


def _fleet_family_metrics(validation: dict, report: dict, family: str) -> dict[str, float]:
    """The child run's fleet metrics: per variant ``<variant>.fleet_mase_mean`` (+ interval),
    ``fleet_smape_mean``, ``fleet_mape_mean``, ``loses_share``, and the fp32 paired tests
    across series (``fp32_vs_best_naive.p_value``, ``fp32_vs_<reference>.p_value``)."""
    judged = validation.get("fleet") or {}
    variants = judged.get("variants") or ((report.get("fleet") or {}).get("families") or {}).get(family) or {}
    metrics: dict[str, float] = {}
    for variant, aggregate in variants.items():
        for key, value in _scalars(_aggregate_numbers(aggregate)).items():
            name = key if key in ("loses_share", "losers_count") else f"fleet_{key}"
            metrics[f"{variant}.{name}"] = value
    tests = ((report.get("fleet") or {}).get("tests") or {}).get(family) or {}
    vs_naive = judged.get("vs_best_naive") or tests.get("vs_best_naive")
    if vs_naive:
        metrics.update({f"fp32_vs_best_naive.{k}": v for k, v in _test_numbers(vs_naive).items()})
    for model, test in (judged.get("vs_reference") or tests.get("vs_reference") or {}).items():
        metrics.update({f"fp32_vs_{model}.{k}": v for k, v in _test_numbers(test).items()})
    if tests.get("vs_best_family"):
        metrics.update({f"fp32_vs_best_family.{k}": v
                        for k, v in _test_numbers(tests["vs_best_family"]).items()})
    return metrics


def _losers_text(validation: dict, report: dict, family: str, limit: int = 20) -> str | None:
    """The first ``limit`` series where the family's fp32 loses to the best naive (a tag: a JSON
    list of ids, unambiguous whatever characters an id holds)."""
    judged = (validation.get("fleet") or {}).get("variants") or (
        ((report.get("fleet") or {}).get("families") or {}).get(family) or {})
    losers = (judged.get("fp32") or {}).get("losers")
    ids = [str(loser["series"] if isinstance(loser, dict) else loser) for loser in losers[:limit]] if losers else []
    return json.dumps(ids) if ids else None


@contextmanager
def per_series_artifacts(layout: RunLayout, families: list[str]) -> Iterator[dict[str, Path]]:
    """``{family: path}`` of the families' per-series tables that exist, plus ``reference``,
    each copied as ``<name>.parquet`` into a scratch folder (every family's file is called
    per_series.parquet, and MLflow names an artifact by its file name)."""
    with tempfile.TemporaryDirectory(prefix="onnxcast-per-series-") as scratch:
        out = {}
        sources = {family: layout.per_series(family) for family in families}
        sources["reference"] = layout.reference_table
        for name, source in sources.items():
            if source.is_file():
                target = Path(scratch) / f"{name}.parquet"
                shutil.copyfile(source, target)
                out[name] = target
        yield out


def compact_table(layout: RunLayout, families: list[str], selected: str | None):
    """One row per series for the MLflow UI: the id, the best naive's and each reference
    model's MASE, each family's fp32 MASE, and ``loses`` (the selected family's fp32 MASE
    above the best naive's); with forecast distributions, the reference's and each family's
    fp32 95% MSIS after them. None when there is no per-series table, or more than
    :data:`MAX_TABLE_ROWS` series (the Parquet artifacts hold them)."""
    import pandas as pd

    columns, intervals = [], []
    if layout.reference_table.is_file():
        reference = read_per_series(layout.reference_table)
        keep = [c for c in reference.columns if c.endswith(".mase") and c.split(".")[0] in
                ("best_naive", "AutoETS", "AutoTheta", "MSTL")]
        columns.append(reference[[SERIES, *keep]].set_index(SERIES))
        msis = [c.replace(".mase", ".msis_95") for c in keep if c.replace(".mase", ".msis_95") in reference]
        intervals.append(reference[[SERIES, *msis]].set_index(SERIES))
    for family in families:
        path = layout.per_series(family)
        if path.is_file():
            table = read_per_series(path, ["fp32.mase"]).set_index(SERIES)
            columns.append(table[["fp32.mase"]].rename(columns={"fp32.mase": f"{family}.fp32.mase"}))
            if "fp32.msis_95" in table:
                intervals.append(table[["fp32.msis_95"]].rename(columns={"fp32.msis_95": f"{family}.fp32.msis_95"}))
    if not columns:
        return None
    table = pd.concat(columns, axis=1, join="outer")
    if len(table) > MAX_TABLE_ROWS:
        return None
    edge = f"{selected}.fp32.mase"
    if edge in table and "best_naive.mase" in table:
        table["loses"] = (table[edge] > table["best_naive.mase"]).where(
            table[edge].notna() & table["best_naive.mase"].notna())
    if any(len(part.columns) for part in intervals):  # after ``loses``: the MASE columns keep their places
        table = pd.concat([table, *[p for p in intervals if len(p.columns)]], axis=1, join="outer")
    table = table.reset_index().rename(columns={"index": SERIES})
    # JSON has no NaN: a series outside the reference sample gets null
    return table.astype(object).where(table.notna(), None)


def read_per_series(path: str | Path, columns: list[str] | None = None):
    """A per-series table (Parquet) with its ``series`` ids as text; ``columns`` must exist.
    A one-line DataError names the file and what it lacks."""
    import pandas as pd

    try:
        table = pd.read_parquet(path)
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not a per-series table ({' '.join(str(error).split())})") from None
    missing = [c for c in [SERIES, *(columns or [])] if c not in table.columns]
    if missing:
        raise DataError(f"{path}: no column {', '.join(map(repr, missing))} (has {list(table.columns)[:8]})")
    table[SERIES] = table[SERIES].astype(str)
    return table


def global_version_tags(layout: RunLayout, report: dict, family: str) -> dict[str, str]:
    """Tags of a fleet model version: global, over how many series, which series column,
    horizon and frequency (what a later run checks before comparing), and the metric its
    ``onnxcast.fp32_holdout_mae`` holds (mean MASE). From the ONNX metadata when present."""
    import onnx

    config = report.get("config") or {}
    tags = {"onnxcast.global": "true",
            "onnxcast.n_series": str((report.get("fleet") or {}).get("n_series") or
                                     (report.get("dataset") or {}).get("n_series") or ""),
            "onnxcast.series_column": str(config.get("series_column") or ""),
            "onnxcast.horizon": str(config.get("horizon", "")),
            "onnxcast.freq": str((report.get("dataset") or {}).get("freq") or config.get("freq") or ""),
            "onnxcast.metric": "mase"}
    path = layout.onnx(family)
    if path.is_file():
        meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        tags.update({key: str(meta[key]) for key in GLOBAL_META if key in meta})
    entry = next((m for m in report.get("models", []) if m["family"] == family), {})
    fp32 = (((report.get("fleet") or {}).get("families") or {}).get(family) or {}).get("fp32") or {}
    mase = fp32.get("mase_mean", entry.get("fp32_holdout_mase", entry.get("fp32_holdout_mae")))
    if mase is not None:
        tags["onnxcast.fp32_holdout_mase"] = str(mase)
    if fp32.get("mase_ci95"):
        tags["onnxcast.fp32_mase_ci95"] = json.dumps(fp32["mase_ci95"])
    return tags


def _fleet_input_example(layout: RunLayout, lookback: int):
    """Two real histories ``[2, lookback, features]`` from the checked fleet (data/fleet, else
    the first shard), edge-padded when a series is shorter than the lookback."""
    import numpy as np

    from onnxcast.pipeline.fleet_data import FLEET_JSON, FleetData

    candidates = [layout.fleet, *sorted((layout.data / "shards").glob("*/"))]
    folder = next((c for c in candidates if (c / FLEET_JSON).is_file()), None)
    if folder is None:
        raise DataError(f"{layout.fleet}: no checked fleet in the run directory (needed for the signature example)")
    fleet = FleetData.load(folder, mmap=True)
    rows = []
    for i in range(min(2, fleet.n_series)):
        history = np.asarray(fleet.series(i)[-lookback:], dtype=np.float32)
        if len(history) < lookback:
            history = np.concatenate([np.repeat(history[:1], lookback - len(history), axis=0), history])
        rows.append(history)
    while len(rows) < 2:  # a fleet of one series: batch 2 all the same (see docs: batch >= 2)
        rows.append(rows[0])
    return np.ascontiguousarray(np.stack(rows), dtype=np.float32)


def _aggregate_numbers(aggregate: dict) -> dict:
    """An aggregate without its list of losers (ids are not metrics)."""
    return {k: v for k, v in aggregate.items() if k != "losers"}


def _test_numbers(test: dict) -> dict[str, float]:
    return {k: v for k, v in _scalars(test).items() if k in TEST_KEYS}


# --- helpers ------------------------------------------------------------------------------

def _find_or_create_run(client, experiment_id: str, run_key: str, role: str, family: str | None,
                        tags: dict[str, str], name: str) -> str:
    query = f"tags.`{RUN_KEY_TAG}` = '{_quote(run_key)}' and tags.`{ROLE_TAG}` = '{role}'"
    if family:
        query += f" and tags.`{FAMILY_TAG}` = '{_quote(family)}'"
    found = client.search_runs([experiment_id], filter_string=query, max_results=1,
                               order_by=["attributes.start_time ASC"])
    if found:
        if found[0].info.status in ("FAILED", "KILLED"):  # a retry takes its run over again
            client.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    return client.create_run(experiment_id, tags=tags, run_name=name).info.run_id


def _ranking_table(ranking: list[dict]) -> dict[str, list]:
    """Column-wise table of the ranking rows (nested values as JSON text)."""
    columns = list(dict.fromkeys(key for row in ranking for key in row))
    return {c: [row.get(c) if isinstance(row.get(c), str | int | float | bool | type(None))
                else json.dumps(row.get(c)) for row in ranking] for c in columns}


def _log_fleet_tables(client, run_id: str, layout: RunLayout, families: list[str], selected: str | None) -> None:
    """The reference's per-series table (Parquet) and one compact table for the UI on the
    pipeline run; the families' own tables go to their child runs (_log_family)."""
    with per_series_artifacts(layout, []) as files:
        if "reference" in files:
            client.log_artifact(run_id, str(files["reference"]), "per_series")
    table = compact_table(layout, families, selected)
    if table is not None:
        client.log_table(run_id, data=table, artifact_file=TABLE_ARTIFACT)
    elif layout.reference_table.is_file() or any(layout.per_series(f).is_file() for f in families):
        client.set_tag(run_id, "onnxcast.per_series_table",
                       f"over {MAX_TABLE_ROWS} series: see the per_series/*.parquet artifacts")


def _log_family(client, run_id: str, layout: RunLayout, family: str, fleet_report: dict | None = None, *,
                report: dict | None = None) -> None:
    """A family's child run; ``fleet_report`` (the report of a fleet run) adds the fleet
    aggregates and tests as metrics and the family's per-series table as an artifact; ``report``
    its variants' deployment-target figures and statuses (:func:`target_figures`). Params,
    metrics and tags go in one batch (each MLflow call is a request the server authenticates)."""
    family_dir = layout.family(family)
    entry = read_json(layout.validation(family))
    target_metrics, tags = target_figures(report or {}, family)
    tags["onnxcast.gates_passed"] = str(entry["gates_passed"])
    tags.update({f"onnxcast.{k}": v for k, v in ensemble_params(read_json(layout.model_json(family))).items()
                 if k.startswith("ensemble.")})
    if fleet_report is not None:
        losers = _losers_text(entry, fleet_report, family)
        if losers:
            tags["onnxcast.fleet.fp32_losers"] = losers[:4900]
        with per_series_artifacts(layout, [family]) as files:
            if family in files:
                client.log_artifact(run_id, str(files[family]), "per_series")
    _log_batch(client, run_id, params=family_params(layout, family),
               metrics={**family_metrics(layout, family, fleet_report), **target_metrics}, tags=tags)
    client.log_artifact(run_id, str(layout.validation(family)))
    client.log_artifacts(run_id, str(layout.onnx_dir(family)), "onnx")
    for name in PYTORCH_FILES:
        client.log_artifact(run_id, str(family_dir / name), "pytorch")


def target_figures(report: dict, family: str) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, tags) of a family's deployment targets (report.json's ``targets`` per variant,
    docs/targets.md): per variant and target ``<variant>.target.<name>.validated`` (1 or 0), the
    parity with x86 and PyTorch (tolerance ratio, max diff in units of the forecast level), the
    holdout MAE, the batch-1/64 p50 latency and the size; the tag ``onnxcast.target.<name>.<variant>``
    holds the status (and why, and "emulated, not a timing" where the latency is no timing)."""
    metrics, tags = {}, {}
    model = next((m for m in report.get("models", []) if m.get("family") == family), None) or {}
    for variant in model.get("variants", []):
        for name, record in (variant.get("targets") or {}).items():
            prefix = f"{variant['name']}.target.{name}"
            metrics[f"{prefix}.validated"] = float(record.get("status") == "validated")
            values = {f"{prefix}.size_bytes": record.get("size_bytes"),
                      f"{prefix}.holdout_mae": (record.get("holdout") or {}).get("mae")}
            for against, parity in ((record.get("parity") or {}).items()):
                values[f"{prefix}.{against}.tolerance_ratio"] = (parity or {}).get("worst_tolerance_ratio")
                values[f"{prefix}.{against}.max_diff_in_levels"] = (parity or {}).get("max_diff_in_levels")
            for key in ("batch1_p50", "batch64_p50"):
                values[f"{prefix}.latency_{key}_ms"] = (record.get("latency_ms") or {}).get(key)
            metrics.update({k: float(v) for k, v in values.items()
                            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)})
            text = " ".join(filter(None, [record.get("status"), record.get("reason") and f"({record['reason']})",
                                          record.get("latency_note") and f"[latency: {record['latency_note']}]"]))
            tags[f"onnxcast.target.{name}.{variant['name']}"] = text[:4900]
    return metrics, tags


def family_params(layout: RunLayout, family: str) -> dict[str, Any]:
    """The params of a family's child run (and of its logged model): the model spec and its source."""
    model_json = read_json(layout.model_json(family))
    params = {f"spec.{k}": v for k, v in model_json["spec"].items()}
    params.update(ensemble_params(model_json))
    params["source"] = json.dumps(model_json.get("source", "trained")) if not isinstance(
        model_json.get("source"), str) else model_json["source"]
    return params


def ensemble_params(model_json: dict) -> dict[str, str]:
    """An ensemble's members (as the graph holds them), combination and weights as params and tags
    (``spec.members``: the member families, not their specs); empty for another family."""
    spec, choice = model_json.get("spec") or {}, model_json.get("ensemble")
    if not spec.get("members") or not isinstance(choice, dict):
        return {}
    return {"spec.members": ",".join(m["family"] for m in spec["members"]),
            "ensemble.members": ",".join(choice.get("members", [])),
            "ensemble.combination": str(choice.get("combination")),
            "ensemble.weights": ",".join(f"{w:.6g}" for w in choice.get("weights") or []) or "median"}


def family_metrics(layout: RunLayout, family: str, fleet_report: dict | None = None) -> dict[str, float]:
    """The metrics of a family's child run: torch's, each variant's holdout, intervals, latency,
    size, eligibility and parity, the training's; a fleet's aggregates and tests."""
    entry = read_json(layout.validation(family))
    model_json = read_json(layout.model_json(family))
    metrics = {}
    for key, value in _flatten(entry.get("torch") or {}, "torch").items():
        if isinstance(value, int | float):
            metrics[key] = value
    for variant in entry["variants"]:
        name = variant["name"]
        for key, value in _scalars(variant.get("holdout") or {}).items():
            metrics[f"{name}.holdout_{key}"] = value
        intervals = interval_figures.variant_intervals(entry, name)
        if not intervals and fleet_report is not None:
            intervals = interval_figures.family_intervals(fleet_report, family, name)
        metrics.update({f"{name}.{key}": value for key, value in interval_figures.numbers(intervals).items()})
        for key, value in variant.get("latency_ms", {}).items():
            metrics[f"{name}.latency_{key}_ms"] = value
        metrics[f"{name}.size_bytes"] = variant["size_bytes"]
        metrics[f"{name}.eligible"] = float(bool(variant.get("eligible")))
        if variant.get("parity_max_abs_diff") == variant.get("parity_max_abs_diff"):  # not NaN
            metrics[f"{name}.parity_max_abs_diff"] = variant["parity_max_abs_diff"]
    training = model_json.get("training") or {}
    for key in ("epochs", "best_epoch", "best_validation_loss", "seconds"):
        if isinstance(training.get(key), int | float):
            metrics[f"training.{key}"] = training[key]
    if fleet_report is not None:
        metrics.update(_fleet_family_metrics(entry, fleet_report, family))
    return metrics


def _ensure_registered_model(client, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        try:
            client.create_registered_model(name, description="onnxcast forecaster (ONNX); aliases: "
                                                             "challenger (last registered), champion (in rollout)")
        except MlflowException:  # created concurrently
            pass


def _holdout_example(layout: RunLayout):
    import numpy as np

    from onnxcast.pipeline.fleet_data import load_split
    from onnxcast.pipeline.validate import holdout_windows

    cfg = PipelineConfig.load(layout.config)
    holdout = holdout_windows(cfg, *load_split(layout.fleet, cfg))
    return np.ascontiguousarray(holdout.history[:2], dtype=np.float32)


def _family_entry(report: dict, family: str) -> dict:
    return next(m for m in report["models"] if m["family"] == family)


def _log_metrics(client, run_id: str, metrics: dict[str, float]) -> None:
    _log_batch(client, run_id, metrics=metrics)


def _log_batch(client, run_id: str, *, metrics: dict[str, float] | None = None, params: dict[str, Any] | None = None,
               tags: dict[str, str] | None = None, model_id: str | None = None) -> None:
    """Metrics (NaN and None left out; linked to the logged model ``model_id`` when given), params
    and tags in one call (MLflow's client sends as few requests as its batch limits allow: 1000
    entities, 100 params and 100 tags each), not one request per value."""
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, 0, model_id=model_id) for k, v in (metrics or {}).items()
             if v is not None and float(v) == float(v)]
    tag_list = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
    if items or params or tag_list:
        client.log_batch(run_id, metrics=items, params=_params(params or {}), tags=tag_list)


def _params(values: dict[str, Any]) -> list:
    from mlflow.entities import Param

    return [Param(k, str(v)[:6000]) for k, v in values.items()]


def _scalars(values: dict) -> dict[str, float]:
    """The numbers of a metrics dict for MLflow: an interval ``[low, high]`` becomes two metrics."""
    out = {}
    for key, value in values.items():
        if isinstance(value, bool):
            out[key] = float(value)
        elif isinstance(value, int | float):
            out[key] = value
        elif key.endswith("_ci95") and isinstance(value, list | tuple) and len(value) == 2:
            out[f"{key}_low"], out[f"{key}_high"] = value
    return out


def _flatten(value: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, item in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(item, dict):
            out.update(_flatten(item, name))
        elif isinstance(item, list | tuple):
            out[name] = ",".join(map(str, item))
        else:
            out[name] = item
    return out


def _quote(value: str) -> str:
    return str(value).replace("'", "\\'")


def redact_uri(uri: str) -> str:
    """A tracking URI without credentials, for error messages."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.password or parts.username:
        parts = parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))
    return urlunsplit(parts)


