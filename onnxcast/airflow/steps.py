"""Operators for the pipeline steps: check data, train or fetch, export, optimize, validate.

Tasks of one DAG run may run on different hosts; they hand files to each other through
the run store (onnxcast.runstore): the run directory ``<run_root>/<dag_id>/<run_id>`` on
S3 (or a local folder in the embedded mode), which the data check creates and announces
through XCom; the steps after it take it as the templated ``run_dir``. Each task stages
the committed files it needs into local scratch, works there, and publishes its outputs
with a commit marker last (:meth:`TrackedOperator.workspace`), so a retry, or a second
attempt on another host, never sees half a step. XComs stay small.

A fleet run (``series_column`` set: many series) adds steps mapped over
SHARDS of series, so that the per-series work runs on every worker (docs/design/fleet.md
section 5): ``check_series[shard]`` after the table check, ``merge_data`` (the run's
verdict on the excluded series), ``reference[shard]`` in parallel with training and
``evaluate[shard]`` after it. A shard task stages only its own shard's files. A one-series
run has one shard, whose tasks commit an empty step: mapping over an empty list would skip
every task downstream.

A failed or killed task marks its MLflow runs FAILED or KILLED (its retry takes them over
again), so no run is left RUNNING.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from onnxcast.airflow.hooks import MlflowHook, MlflowLoginScope, S3SettingsHook
from onnxcast.airflow.links import MlflowRunLink, persist_mlflow_run_url
from onnxcast.base.errors import ConfigError, DataError
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.layout import RunLayout

if TYPE_CHECKING:
    from airflow.sdk import Context

    from onnxcast.runstore import RunDir

RUN_DIR_KEY = "run_dir"
SUMMARY_KEY = "summary"
FAMILIES_KEY = "families"
SHARD_INDEX_PREFIX = "shard-"  # the shard tasks' map_index_template: "shard-{{ task.shard }}"


def default_run_root() -> str:
    """The run store root from the deployment settings (onnxcast.airflow.settings)."""
    from onnxcast.airflow.settings import run_root

    return run_root()


def run_key(context: Context) -> str:
    """What identifies this pipeline run in MLflow and the registry: ``dag_id/run_id``."""
    return f"{context['dag_run'].dag_id}/{context['run_id']}"


def load_config(work: str | Path) -> PipelineConfig:
    """The run's settings from a staged run directory, pointed at that folder."""
    path = Path(work) / "config.json"
    if not path.exists():
        raise AirflowFailException(f"{path.name}: not in the run store (nothing committed it); did the data "
                                   "check of this run succeed?")
    return replace(PipelineConfig.load(path), out_dir=str(work))


def end_mlflow_runs(context: Context) -> None:
    """Failure and retry callback: the task's MLflow runs become FAILED (KILLED when the task
    was killed from outside: no exception in the context), never left RUNNING. Runs in the
    task process after a failure, or in the DAG processor when the worker died. A terminal
    failure also ends the pipeline run; the retry of a task takes its runs over again."""
    task = context.get("task")
    try:
        from onnxcast.registry.tracking import end_open_runs

        exception = context.get("exception")
        status = "KILLED" if exception is None or type(exception).__name__ in (
            "AirflowTaskTerminated", "AirflowTaskTimeout") else "FAILED"
        ti = context["ti"]
        family = getattr(task, "family", None)
        family = family if isinstance(family, str) and "{{" not in family else getattr(ti, "rendered_map_index", None)
        if isinstance(family, str) and family.startswith(SHARD_INDEX_PREFIX):  # a shard task: no family runs
            family = None
        terminal = str(getattr(ti, "state", "")) != "up_for_retry"
        params = context.get("params") or {}
        hook = MlflowHook(mlflow_conn_id=getattr(task, "mlflow_conn_id", "mlflow_default"))
        with hook.login():
            ended = end_open_runs(run_key(context), status, family=family or None, parent=terminal or not family,
                                  model_name=params.get("model_name"), tracking_uri=hook.tracking_uri)
        if ended:
            (task.log if task is not None else _log()).info("MLflow run(s) %s marked %s", readable(ended), status)
    except Exception as exc:  # noqa: BLE001 - a callback must not fail the callback runner
        _log().warning("could not mark the MLflow runs of %s: %s", context.get("run_id"), exc)


def _log():
    import logging

    return logging.getLogger(__name__)


class TrackedOperator(MlflowLoginScope, BaseOperator):
    """Shared: the MLflow hook, the link to the task's MLflow run, and the run store
    workspace (stage, work in local scratch, publish with a commit marker)."""

    operator_extra_links = (MlflowRunLink(),)

    def __init__(self, *, mlflow_conn_id: str | None = "mlflow_default", aws_conn_id: str | None = "aws_default",
                 **kwargs: Any) -> None:
        for callback in ("on_failure_callback", "on_retry_callback"):
            given = kwargs.get(callback)
            given = [] if given is None else list(given) if isinstance(given, list | tuple) else [given]
            kwargs[callback] = [end_mlflow_runs, *(c for c in given if c is not end_mlflow_runs)]
        super().__init__(**kwargs)
        self.mlflow_conn_id = mlflow_conn_id
        self.aws_conn_id = aws_conn_id

    @cached_property
    def mlflow_hook(self) -> MlflowHook:
        return MlflowHook(mlflow_conn_id=self.mlflow_conn_id)

    @cached_property
    def s3_hook(self) -> S3SettingsHook:
        return S3SettingsHook(aws_conn_id=self.aws_conn_id)

    def open_run(self, url: str) -> RunDir:
        """The run directory at ``url`` in the run store (S3 through ``aws_conn_id``)."""
        from onnxcast.airflow.runstore import object_storage_backend
        from onnxcast.runstore import RunDir, backend_for

        return RunDir(url, backend_for(url, s3_settings=self.s3_hook.settings_for(url),
                                       other=lambda other: object_storage_backend(other, self.aws_conn_id)))

    @contextmanager
    def workspace(self, context: Context, run_dir: str, *, families: Sequence[str] | None = None,
                  require: Sequence[str] = (), stage: bool = True, step: str | None = None,
                  paths: Sequence[str] | Callable[[RunDir], Sequence[str] | None] | None = None,
                  ) -> Iterator[Path]:
        """A local scratch folder holding the run's committed files (``families`` only, when
        given; only those under ``paths`` when given, or under what ``paths(run)`` chooses
        from the committed files); on success what the block changed is published as this
        task's step. The folder is removed either way: nothing of a failed try is ever
        published."""
        from onnxcast.runstore import RunStoreError

        run = self.open_run(run_dir)
        scratch = Path(tempfile.mkdtemp(prefix=f"onnxcast-{self.task_id}-"))
        try:
            if callable(paths):
                paths = paths(run)
            staged = run.stage(scratch, families=families, require=require, paths=paths) if stage else None
            yield scratch
            ti = context["ti"]
            run.publish(step or self.step_name(), scratch, staged,
                        meta={"task_id": self.task_id, "try_number": getattr(ti, "try_number", None)})
        except RunStoreError as exc:  # a store that is down or a step being rewritten: retry
            raise RuntimeError(str(exc)) from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def step_name(self) -> str:
        family = getattr(self, "family", None)
        return f"{self.task_id}.{family}" if isinstance(family, str) and family else self.task_id

    def link_mlflow_run(self, context: Context, model_name: str, family: str | None = None,
                        role: str | None = None) -> dict:
        from onnxcast.registry.tracking import ensure_run

        run = ensure_run(model_name=model_name, run_key=run_key(context), family=family, role=role,
                         tracking_uri=self.mlflow_hook.tracking_uri, ui_url=self.mlflow_hook.ui_url)
        persist_mlflow_run_url(context, run["url"])
        return run

    def fail_data_check(self, context: Context, cfg: PipelineConfig, exc: Exception) -> AirflowFailException:
        """Log the GX report of a failed data check to the run's MLflow run, link the task to
        it, and return the error that fails the task without a retry (the same bytes fail the
        same way)."""
        from onnxcast.registry.tracking import log_failed_data_check

        failures = getattr(exc, "failures", [str(exc)])
        self.log.error("data check failed for %s:\n  - %s", cfg.data_uri, "\n  - ".join(failures))
        run = log_failed_data_check(Path(cfg.out_dir) / "quality", model_name=cfg.model_name,
                                    run_key=run_key(context), error=str(exc),
                                    tracking_uri=self.mlflow_hook.tracking_uri, ui_url=self.mlflow_hook.ui_url)
        persist_mlflow_run_url(context, run["url"])
        return AirflowFailException(" ".join(str(exc).split()))


class CheckDataOperator(TrackedOperator):
    """Check the data into a fresh run directory; plan the families to evaluate.

    The table-level checks of the one data gate, for any number of series (a file without
    ``series_column`` is one series), and the series assigned to shards; the per-series checks
    are the mapped ``check_series`` tasks (:class:`CheckSeriesOperator`), the verdict
    :class:`MergeDataOperator`'s.

    The training window ends at ``trained_until`` when given, else at the run's data
    interval end, so a rerun of a past run sees the same rows. When ``fetch_from`` is set
    the run evaluates that model instead of training; when ``compare_with_champion`` is on
    and the registry has a ``champion`` that forecasts the same horizon from the same
    features, it is evaluated alongside as the family ``champion``.

    In a run an ``onnxcast_retrain`` asset event triggered (onnxcast.airflow.retraining), the
    event's ``conf`` (the deployed version's settings) applies over the param defaults, each
    value checked as trigger-form input, and the reasons are recorded: ``trigger.json`` (the
    report's ``trigger``), the summary's ``trigger`` and the MLflow tag ``onnxcast.retrain_reason``.

    XCom: the shard numbers (return value: the mapping input of the shard steps; ``[0]``
    for one series, never empty), and under the keys ``run_dir``, ``summary`` and
    ``families`` the run directory, data facts and the planned families
    (:class:`MergeDataOperator` returns those, the mapping input of the family steps).
    """

    template_fields: Sequence[str] = ("settings", "extra_settings", "run_root", "fetch_from", "trained_until",
                                      "compare_with_champion")
    template_fields_renderers = {"settings": "json", "extra_settings": "json"}

    def __init__(self, *, settings: dict[str, Any], extra_settings: dict[str, Any] | str | None = None,
                 run_root: str | None = None, fetch_from: str | None = None, trained_until: str | None = None,
                 compare_with_champion: bool | str = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.extra_settings = extra_settings
        self.run_root = run_root
        self.fetch_from = fetch_from
        self.trained_until = trained_until
        self.compare_with_champion = compare_with_champion
        self._trigger: dict | None = None  # a retraining the monitor asked for (_retrain_settings)

    def execute(self, context: Context) -> list[int]:
        from onnxcast.airflow.settings import run_root
        from onnxcast.runstore import RunStore

        store = RunStore(run_root(self.run_root))
        run_url = store.run_url(context["dag_run"].dag_id, context["run_id"])
        with self.workspace(context, run_url, stage=False, require=()) as work:
            shards, families, summary = self._check(context, work, run_url)
        context["ti"].xcom_push(key=RUN_DIR_KEY, value=run_url)
        context["ti"].xcom_push(key=SUMMARY_KEY, value=summary)
        context["ti"].xcom_push(key=FAMILIES_KEY, value=families)
        return shards

    def _check(self, context: Context, run_dir: Path, run_url: str) -> tuple[list[int], list[str], dict]:
        cfg = self._settings(context, run_dir)
        try:  # the same bytes fail the same way: no retry
            shards, facts = self._gate(cfg)
        except (ConfigError, DataError) as exc:
            raise self.fail_data_check(context, cfg, exc) from None
        run = self.link_mlflow_run(context, cfg.model_name)
        trigger = self._trigger
        if trigger:
            from onnxcast.registry.monitoring import record_retrain_reason

            record_retrain_reason(run["parent_run_id"], trigger, self.mlflow_hook.tracking_uri)
        plan = self._plan(cfg)
        summary = {"run_dir": run_url, **facts, "trained_until": cfg.trained_until,
                   "champion_version": plan.champion["version"] if plan.champion else None, "notes": plan.notes,
                   "trigger": trigger}
        self.log.info("Run %s: %s; families %s; %s", run_url, readable(facts), readable(plan.families),
                      "; ".join(plan.notes) or "champion included")
        return shards, plan.families, summary

    def _settings(self, context: Context, run_dir: Path) -> PipelineConfig:
        from onnxcast.registry.run_setup import run_config

        retrain = self._retrain_settings(context, run_dir)
        try:  # bad settings: retrying cannot help
            return run_config(self.settings, extra_settings=self.extra_settings, retrain=retrain, run_dir=run_dir,
                              trained_until=self.trained_until, default_end=_interval_end(context))
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None

    def _retrain_settings(self, context: Context, run_dir: Path) -> dict:
        """In a run the monitor's retraining event triggered: the event's settings (the deployed
        version's, checked as trigger-form input) over the param defaults, and the reasons
        recorded (``trigger.json``: the report's ``trigger``). Nothing in other runs."""
        from onnxcast.airflow.retraining import retrain_events, retrain_settings
        from onnxcast.registry.run_setup import record_retraining

        try:
            events = retrain_events(context)  # a forged event (REST API, another task) fails here
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        if not events:
            return {}
        try:
            taken, left_out = retrain_settings(events[-1].get("conf"))  # the newest event's settings
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        self._trigger = trigger = record_retraining(run_dir, events, taken, left_out)
        self.log.info("Retraining asked for by the monitor (%s v%s, %s): %s; settings taken from the event: %s%s",
                      trigger["model"], trigger["version"], trigger["channel"],
                      "; ".join(trigger["reasons"]) or "no reason", readable(sorted(taken)),
                      f"; left out: {readable(left_out)}" if left_out else "")
        return taken

    def _gate(self, cfg: PipelineConfig) -> tuple[list[int], dict]:
        """The table checks and the shards of series, for any number of series (config.json
        too, so that the shard tasks can load the settings)."""
        from onnxcast.pipeline.fleet_quality import check_fleet_table

        shards = [int(k) for k in check_fleet_table(cfg, s3_settings=self.s3_hook.settings_for(str(cfg.data_uri)))]
        if not shards:  # mapping over [] would skip the rest of the run without a word
            raise DataError(f"{cfg.data_uri}: no series to check (the table check assigned no shard)")
        if not cfg.layout.config.exists():
            cfg.save(cfg.layout.config)
        return shards, {"series_column": cfg.series_column, "shards": len(shards), **_shard_facts(cfg)}

    def _plan(self, cfg: PipelineConfig):
        """plan.json: the families to train or fetch, and the champion when it is comparable."""
        from onnxcast.registry.run_setup import ChallengerSourceError, plan_run

        try:
            return plan_run(cfg, fetch_from=self.fetch_from, compare_with_champion=as_bool(self.compare_with_champion),
                            tracking_uri=self.mlflow_hook.tracking_uri, s3_settings=self.s3_hook.get_settings)
        except ChallengerSourceError as exc:
            raise AirflowFailException(str(exc)) from None


class MergeDataOperator(TrackedOperator):
    """The run's verdict on its data, once every shard is checked; returns the families to train.

    Any number of series (onnxcast.pipeline.run.merge_data): every shard's excluded series
    merged; more than ``max_excluded_share`` of the series excluded (one series excluded: all)
    fails the run without a retry (as a failed data check does), with the GX pages in MLflow.
    The kept series become ``data/fleet/`` and ``data/dataset.json``; one series judged over
    its origins also gets its baselines and statistical reference.

    XCom: the family names of the plan each trained or fetched on its own (return value: the
    mapping input of ``train_or_fetch``; the ensemble, made from them afterwards, is
    :class:`EnsembleOperator`'s) and ``summary``, the series kept and excluded.
    """

    template_fields: Sequence[str] = ("run_dir", "shards")

    def __init__(self, *, run_dir: str, shards: Sequence[int] | str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir
        self.shards = shards

    def execute(self, context: Context) -> list[str]:
        from onnxcast.registry.plan import combined, read_plan, trained_apart

        require = [shard_step("check_series", k) for k in _shard_numbers(self.shards)]
        with self.workspace(context, self.run_dir, require=require) as work:
            cfg = load_config(work)
            self.link_mlflow_run(context, cfg.model_name)
            self._merge(context, cfg)
            plan = read_plan(work)
        families, after = trained_apart(plan), combined(plan)
        self.log.info("Data of %s merged from %d shard(s); families %s%s", self.run_dir, len(require),
                      readable(families), f", then {readable(after)} made from them" if after else "")
        return families

    def _merge(self, context: Context, cfg: PipelineConfig) -> None:
        from onnxcast.pipeline.run import merge_data

        try:
            merged = merge_data(cfg)
        except (ConfigError, DataError) as exc:  # too many series excluded: the same data fails the same way
            raise self.fail_data_check(context, cfg, exc) from None
        series = (merged.get("quality") or {}).get("series") or {}
        dataset = merged.get("dataset") or {}
        summary = {"series": series, "rows": dataset.get("rows"), "end": dataset.get("end"),
                   "dataset_sha256": dataset.get("sha256")}
        context["ti"].xcom_push(key=SUMMARY_KEY, value=summary)
        self.log.info("Fleet data: %s", readable(series) if series else readable(dataset))


class _ShardStepOperator(TrackedOperator):
    """A step for one shard of the run's series (mapped over the shards check_data returns).

    It stages only its own shard's files (plus the run's shared files), so that a task's
    download does not grow with the fleet."""

    template_fields: Sequence[str] = ("run_dir", "shard")
    #: whether the step reads the shard's raw rows (the checks do; later steps read the checked series)
    reads_raw_rows: bool = False

    def __init__(self, *, run_dir: str, shard: int | str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir
        self.shard = shard

    def step_name(self) -> str:
        return shard_step(self.task_id, self.shard)

    def execute(self, context: Context) -> dict:
        shard = int(self.shard)
        with self.workspace(context, self.run_dir, require=self.requires(shard), paths=self.stage_paths) as work:
            cfg = load_config(work)
            self.link_mlflow_run(context, cfg.model_name)
            return {"shard": shard, **self.run_step(context, cfg, shard)}

    def stage_paths(self, run: RunDir) -> list[str]:
        """The committed files this shard's step reads: the run's shared files and its own
        shard's, never another shard's nor the whole fleet (``data/fleet/``, merge_data's);
        models only as :meth:`reads_model_file` says."""
        from onnxcast.runstore import under_prefix

        files = run.files()
        shard, layout = int(self.shard), RunLayout("")
        raw = None if self.reads_raw_rows else layout.shard_rows(shard).as_posix()
        return [path for path in files if shard_of(path) in (None, shard) and path != raw
                and not under_prefix(path, layout.fleet.as_posix())
                and (layout.family_of(path) is None or self.reads_model_file(layout, path))]

    def reads_model_file(self, layout: RunLayout, path: str) -> bool:
        """Whether the step reads this file of ``models/`` (the checks and the reference: none)."""
        return False

    def requires(self, shard: int) -> list[str]:
        """The steps that must have committed before this one (its producers)."""
        raise NotImplementedError

    def run_step(self, context: Context, cfg: PipelineConfig, shard: int) -> dict:
        raise NotImplementedError


class CheckSeriesOperator(_ShardStepOperator):
    """The per-series data checks of one shard: a bad series (too short, gaps, constant,
    duplicated times, ...) is excluded with its reason; the kept ones are repaired and laid
    on the fleet's grid. The run's verdict is :class:`MergeDataOperator`'s."""

    reads_raw_rows = True

    def requires(self, shard: int) -> list[str]:
        return ["check_data"]

    def run_step(self, context: Context, cfg: PipelineConfig, shard: int) -> dict:
        from onnxcast.pipeline.fleet_quality import check_fleet_shard

        try:
            result = check_fleet_shard(cfg, shard)
        except (ConfigError, DataError) as exc:  # the shard's rows fail the same way on a retry
            raise self.fail_data_check(context, cfg, exc) from None
        self.log.info("Shard %d: %s", shard, readable(result))
        return {key: value for key, value in result.items() if key != "shard"}


class ReferenceShardOperator(_ShardStepOperator):
    """The baselines and the statistical reference (statsforecast) on one shard's series,
    in parallel with training (it keeps the other workers busy)."""

    def requires(self, shard: int) -> list[str]:
        return ["merge_data"]

    def run_step(self, context: Context, cfg: PipelineConfig, shard: int) -> dict:
        from onnxcast.pipeline.run import reference_step

        paths = reference_step(cfg, shard)
        self.log.info("Shard %d: reference forecasts in %s", shard, readable([p.name for p in paths]) or
                      "no file (judged over the origins of one series: merge_data measured the reference)")
        return {"files": [_relative(cfg, p) for p in paths]}


class EvaluateShardOperator(_ShardStepOperator):
    """Every variant of every family of the plan on one shard's series, at the same origins
    as the reference; the families' ``validate`` tasks merge the shards."""

    def requires(self, shard: int) -> list[str]:
        return [shard_step("reference", shard)]

    def reads_model_file(self, layout: RunLayout, path: str) -> bool:
        """The ONNX variants (with variants.json), model.json (the lookback) and skipped.json
        (a family the run did not make) of each family; not the weights, nor the other shards'
        results."""
        from onnxcast.runstore import under_prefix

        family = layout.family_of(path)
        return (path in (layout.model_json(family).as_posix(), layout.skipped(family).as_posix())
                or under_prefix(path, layout.onnx_dir(family).as_posix()))

    def run_step(self, context: Context, cfg: PipelineConfig, shard: int) -> dict:
        from onnxcast.pipeline.run import evaluate_step
        from onnxcast.registry.plan import made_families

        families = made_families(cfg.run_dir)  # not an ensemble the run skipped
        paths = evaluate_step(cfg, shard, families)
        self.log.info("Shard %d: evaluated %s (%d file(s))", shard, readable(families), len(paths))
        return {"families": families, "files": [_relative(cfg, p) for p in paths]}


class _FamilyStepOperator(TrackedOperator):
    """A step for one model family in the run directory (mapped over the families)."""

    template_fields: Sequence[str] = ("run_dir", "family")

    def __init__(self, *, run_dir: str, family: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir
        self.family = family

    def execute(self, context: Context) -> dict:
        from onnxcast.registry.plan import plan_entry

        with self.workspace(context, self.run_dir, families=[self.family]) as work:
            cfg = load_config(work)
            entry = plan_entry(work, self.family)
            role = "champion-evaluation" if entry.get("role") == "champion" else "family"
            self.link_mlflow_run(context, cfg.model_name, self.family, role)
            return self.run_step(context, cfg, entry)

    def run_step(self, context: Context, cfg: PipelineConfig, entry: dict) -> dict:
        raise NotImplementedError


class TrainOrFetchModelOperator(_FamilyStepOperator):
    """Train the family, or fetch it (MLflow ``models:/`` or ``s3://``) when the plan names a source."""

    def run_step(self, context: Context, cfg: PipelineConfig, entry: dict) -> dict:
        from onnxcast.pipeline.run import train_family

        if not entry.get("source"):
            result = train_family(cfg, self.family)
            self.log.info("Trained %s: %s epochs, best validation loss %.4g", self.family, result["epochs"],
                          result["best_validation_loss"])
            return {"family": self.family, "source": "trained", "epochs": result["epochs"],
                    "best_validation_loss": result["best_validation_loss"]}
        from onnxcast.registry.fetch import FetchError, fetch_model

        try:
            fetched = fetch_model(entry["source"], cfg.layout.family(self.family),
                                  tracking_uri=self.mlflow_hook.tracking_uri,
                                  s3_settings=self.s3_hook.get_settings(),
                                  expect={"horizon": cfg.horizon, "n_features": cfg.n_features})
        except FetchError as exc:
            raise AirflowFailException(str(exc)) from None
        self.log.info("Fetched %s (%s) from %s", self.family, fetched.family, entry["source"])
        return {"family": self.family, "source": entry["source"], "spec_family": fetched.family}


class EnsembleOperator(TrackedOperator):
    """The ensemble, once every ``train_or_fetch`` task is done: when the plan has it (``combines``),
    the families the run trained combined into one model (onnxcast.pipeline.ensemble.train_ensemble,
    as ``onnxcast pipeline`` makes it), then exported, optimized and validated like any family.
    With fewer than two trained members it is skipped, the reason in ``models/ensemble/skipped.json``
    (the report's ``skipped``). A run without one stages only its plan and passes it on.

    XCom: the families the run made, in the plan's order (return value: the mapping input of
    ``export``, ``optimize`` and ``validate``): the plan's, less an ensemble it skipped.
    """

    template_fields: Sequence[str] = ("run_dir",)
    family = "ensemble"  # the family it makes: end_mlflow_runs ends its MLflow run with a failed task's

    def __init__(self, *, run_dir: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir

    def step_name(self) -> str:
        return self.task_id

    def execute(self, context: Context) -> list[str]:
        from onnxcast.registry.plan import made_families

        with self.workspace(context, self.run_dir, paths=self._stage_paths) as work:
            cfg = load_config(work)
            made = self._combine(context, cfg)
            families = made_families(work)
            if not made:  # nothing combined: the task's button is the run's MLflow run
                self.link_mlflow_run(context, cfg.model_name)
        self.log.info("%s; families to export, optimize and validate: %s",
                      f"Combined {readable(made)}" if made else "No family to combine in this run's plan",
                      readable(families))
        return families

    def _stage_paths(self, run: RunDir) -> list[str] | None:
        """Every committed file when the plan combines families (the members' models, the data, as
        ``train_or_fetch`` stages); else the plan and the settings only."""
        from onnxcast.registry.plan import combined, read_plan

        layout = RunLayout("")
        with tempfile.TemporaryDirectory(prefix=f"onnxcast-{self.task_id}-plan-") as folder:
            run.stage(folder, paths=[layout.plan.as_posix()])
            plan = read_plan(folder)
        return None if combined(plan) else [layout.plan.as_posix(), layout.config.as_posix()]

    def _combine(self, context: Context, cfg: PipelineConfig) -> list[str]:
        """Make every family the plan combines from the others; returns those it planned."""
        from onnxcast.pipeline.ensemble import member_families
        from onnxcast.pipeline.run import train_family
        from onnxcast.registry.plan import combined, read_plan

        planned = combined(read_plan(cfg.run_dir))
        for family in planned:
            members = member_families(cfg)
            # made: its own MLflow run, as any family's; skipped: the run's (no family run left open)
            self.link_mlflow_run(context, cfg.model_name, family if len(members) >= 2 else None)
            result = train_family(cfg, family)
            if "skipped" in result:
                self.log.warning("%s skipped: %s", family, result["skipped"])
            else:
                self.log.info("%s of %s: %s%s", family, readable(members), result["combination"],
                              f", weights {readable(result['weights'])}" if result["weights"] else "")
        return planned


class ExportModelOperator(_FamilyStepOperator):
    """Export the family's model to ``onnx/fp32.onnx``."""

    def run_step(self, context: Context, cfg: PipelineConfig, entry: dict) -> dict:
        from onnxcast.pipeline.run import export_family

        path = export_family(cfg, self.family)
        self.log.info("Exported %s to %s", self.family, path)
        return {"family": self.family, "onnx_path": str(Path(path).relative_to(cfg.run_dir))}


class OptimizeModelOperator(_FamilyStepOperator):
    """Build the fp32-opt, int8 and fp16 variants from fp32.onnx."""

    def run_step(self, context: Context, cfg: PipelineConfig, entry: dict) -> dict:
        from onnxcast.pipeline.run import optimize_family

        variants = optimize_family(cfg, self.family)
        self.log.info("Optimized %s: %s", self.family, readable(variants))
        return {"family": self.family, "variants": variants}


class ValidateModelOperator(_FamilyStepOperator):
    """Validate every variant on the holdout; XCom: the family's fp32 MAE and eligible variants."""

    def run_step(self, context: Context, cfg: PipelineConfig, entry: dict) -> dict:
        from onnxcast.pipeline.fleet_data import ACROSS_SERIES
        from onnxcast.pipeline.run import judging, validate_family

        result = validate_family(cfg, self.family)
        eligible = [v["name"] for v in result["variants"] if v.get("eligible")]
        # judged across series: fp32_holdout_mae holds the mean MASE over the series (fleet_eval)
        self.log.info("Validated %s: fp32 holdout %s %.4g, gates passed %s, eligible %s", self.family,
                      "mean MASE" if judging(cfg) == ACROSS_SERIES else "MAE", result["fp32_holdout_mae"],
                      result["gates_passed"], readable(eligible))
        return {"family": self.family, "fp32_holdout_mae": result["fp32_holdout_mae"],
                "gates_passed": result["gates_passed"], "eligible": eligible, "failures": result["failures"]}


def shard_step(task_id: str, shard: int | str) -> str:
    """The run store step of a shard task: ``check_series.shard-003``."""
    return f"{task_id}.shard-{int(shard):03d}"


def shard_of(relative: str) -> int | None:
    """The shard a run-relative file belongs to, else None (a file of the whole run).

    Per-shard files are those under a ``shards`` folder of the layout (RunLayout.shard,
    quality_shard, reference_shard, family_shard): ``data/shards/003/rows.parquet``,
    ``models/nhits/shards/003.parquet`` -> 3; ``data/shards.json`` -> None."""
    parts = relative.split("/")
    for folder, name in zip(parts[:-1], parts[1:], strict=False):
        number = name.removesuffix(".parquet")
        if folder == "shards" and number.isdigit():
            return int(number)
    return None


def _shard_numbers(value: Any) -> list[int]:
    """check_data's shard numbers as given to a task: the XCom list, or JSON text of one."""
    if isinstance(value, str):
        value = json.loads(value)
    return [int(k) for k in value]


def _shard_facts(cfg: PipelineConfig) -> dict:
    """Series and rows over the shards, from data/shards.json (check_fleet_table wrote it)."""
    from onnxcast.base.files import read_json

    try:
        shards = read_json(cfg.layout.shards)
    except (OSError, ValueError):
        return {}
    facts = {}
    if isinstance(shards.get("shards"), list):
        facts["series"] = sum(len(members) for members in shards["shards"])
    if isinstance(shards.get("rows"), list):
        facts["rows"] = int(sum(shards["rows"]))
    facts.update({key: shards[name] for key, name in (("end", "end"), ("dataset_sha256", "sha256")) if name in shards})
    return facts


def _relative(cfg: PipelineConfig, path: Path) -> str:
    """A path the step wrote, relative to the run directory (for XCom)."""
    try:
        return Path(path).resolve().relative_to(cfg.run_dir.resolve()).as_posix()
    except ValueError:
        return str(path)


def as_bool(value: Any) -> bool:
    """A templated flag: rendered natively (bool) or as text ("True", "false", "0")."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off", "none")
    return bool(value)


def readable(value: Any) -> str:
    """A value for a task log line: ``key=value, ...`` for a mapping, ``a, b`` for a list,
    never a Python repr (``{'edge': 'moved'}`` in the log read as a leaked dict)."""
    if isinstance(value, dict):
        return ", ".join(f"{key}={readable(item)}" for key, item in value.items()) or "none"
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return ", ".join(readable(item) for item in items) or "none"
    return str(value)


def _interval_end(context: Context) -> str | None:
    """The run's data interval end (manual runs in Airflow 3 may have none: then run_after)."""
    end = context.get("data_interval_end") or getattr(context.get("dag_run"), "run_after", None)
    return end.isoformat() if end is not None else None


def _safe(run_id: str) -> str:
    """A run id as one path segment (run ids may hold ``:`` and ``+``)."""
    from onnxcast.runstore import safe_segment

    return safe_segment(run_id)
