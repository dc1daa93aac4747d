"""Operators for the pipeline steps: check data, train or fetch, export, optimize, validate.

Tasks of one DAG run may run on different hosts; they hand files to each other through
the run store (onnxcast.runstore): the run directory ``<run_root>/<dag_id>/<run_id>`` on
S3 (or a local folder in the embedded mode), which the data check creates and announces
through XCom; the steps after it take it as the templated ``run_dir``. Each task stages
the committed files it needs into local scratch, works there, and publishes its outputs
with a commit marker last (:meth:`_TrackedOperator.workspace`), so a retry, or a second
attempt on another host, never sees half a step. XComs stay small.

A failed or killed task marks its MLflow runs FAILED or KILLED (its retry takes them over
again), so no run is left RUNNING.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from onnxcast.airflow.hooks import MlflowHook, S3SettingsHook
from onnxcast.airflow.links import MlflowRunLink, persist_mlflow_run_url
from onnxcast.base.errors import ConfigError, DataError
from onnxcast.pipeline.config import PipelineConfig, data_source

if TYPE_CHECKING:
    from airflow.sdk import Context

    from onnxcast.runstore import RunDir

RUN_DIR_KEY = "run_dir"
SUMMARY_KEY = "summary"


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
        terminal = str(getattr(ti, "state", "")) != "up_for_retry"
        params = context.get("params") or {}
        hook = MlflowHook(mlflow_conn_id=getattr(task, "mlflow_conn_id", "mlflow_default"))
        ended = end_open_runs(run_key(context), status, family=family or None, parent=terminal or not family,
                              model_name=params.get("model_name"), tracking_uri=hook.tracking_uri)
        if ended:
            (task.log if task is not None else _log()).info("MLflow run(s) %s marked %s", readable(ended), status)
    except Exception as exc:  # noqa: BLE001 - a callback must not fail the callback runner
        _log().warning("could not mark the MLflow runs of %s: %s", context.get("run_id"), exc)


def _log():
    import logging

    return logging.getLogger(__name__)


class _TrackedOperator(BaseOperator):
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
                  ) -> Iterator[Path]:
        """A local scratch folder holding the run's committed files (``families`` only, when
        given); on success what the block changed is published as this task's step. The
        folder is removed either way: nothing of a failed try is ever published."""
        from onnxcast.runstore import RunStoreError

        run = self.open_run(run_dir)
        scratch = Path(tempfile.mkdtemp(prefix=f"onnxcast-{self.task_id}-"))
        try:
            staged = run.stage(scratch, families=families, require=require) if stage else None
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


class CheckDataOperator(_TrackedOperator):
    """Check and split the data into a fresh run directory; plan the families to evaluate.

    The training window ends at ``trained_until`` when given, else at the run's data
    interval end, so a rerun of a past run sees the same rows. When ``fetch_from`` is set
    the run evaluates that model instead of training; when ``compare_with_champion`` is on
    and the registry has a ``champion`` that forecasts the same horizon from the same
    features, it is evaluated alongside as the family ``champion``.

    XCom: the family names (return value: the mapping input of the family steps), and
    under the keys ``run_dir`` and ``summary`` the run directory and data facts.
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

    def execute(self, context: Context) -> list[str]:
        from onnxcast.airflow.settings import run_root
        from onnxcast.runstore import RunStore

        store = RunStore(run_root(self.run_root))
        run_url = store.run_url(context["dag_run"].dag_id, context["run_id"])
        with self.workspace(context, run_url, stage=False, require=()) as work:
            families, summary = self._check(context, work, run_url)
        context["ti"].xcom_push(key=RUN_DIR_KEY, value=run_url)
        context["ti"].xcom_push(key=SUMMARY_KEY, value=summary)
        return families

    def _check(self, context: Context, run_dir: Path, run_url: str) -> tuple[list[str], dict]:
        from onnxcast.pipeline.run import prepare_data
        from onnxcast.registry.champion import CHAMPION_FAMILY, write_plan

        extra = _extra_settings(self.extra_settings)
        values = {k: v for k, v in {**extra, **dict(self.settings)}.items() if v not in (None, "", "None")}
        if "data_uri" in values:
            values["data_uri"] = data_source(values["data_uri"])
        values["out_dir"] = str(run_dir)
        values["trained_until"] = self.trained_until or values.get("trained_until") or _interval_end(context)
        try:
            cfg = PipelineConfig.from_dict(values)
        except ConfigError as exc:  # bad settings: retrying cannot help
            raise AirflowFailException(str(exc)) from None
        s3_settings = self.s3_hook.settings_for(str(cfg.data_uri))
        try:
            summary = prepare_data(cfg, s3_settings=s3_settings)
        except (ConfigError, DataError) as exc:  # the same bytes fail the same way: no retry
            self._record_failed_check(context, cfg, exc)
            raise AirflowFailException(" ".join(str(exc).split())) from None
        self.link_mlflow_run(context, cfg.model_name)

        entries, notes, incomparable = self._challengers(cfg), [], {}
        compare = as_bool(self.compare_with_champion)
        champion = self._champion(cfg, notes, incomparable) if compare else None
        if champion:
            entries.append({"family": CHAMPION_FAMILY, "source": champion["source"], "role": "champion",
                            "version": champion["version"]})
        elif not compare:
            notes.append("comparison with the champion is off")
        write_plan(run_dir, entries, notes, incomparable or None)
        families = [e["family"] for e in entries]
        summary = {"run_dir": run_url, "rows": summary["dataset"]["rows"], "end": summary["dataset"]["end"],
                   "dataset_sha256": summary["dataset"]["sha256"], "trained_until": cfg.trained_until,
                   "champion_version": champion["version"] if champion else None, "notes": notes}
        self.log.info("Run %s: %d rows up to %s; families %s; %s", run_url, summary["rows"], summary["end"],
                      readable(families), "; ".join(notes) or "champion included")
        return families, summary

    def _record_failed_check(self, context: Context, cfg: PipelineConfig, exc: Exception) -> None:
        """Log the GX report of a failed check to the run's MLflow run and link the task to it."""
        from onnxcast.registry.tracking import log_failed_data_check

        failures = getattr(exc, "failures", [str(exc)])
        self.log.error("data check failed for %s:\n  - %s", cfg.data_uri, "\n  - ".join(failures))
        run = log_failed_data_check(Path(cfg.out_dir) / "quality", model_name=cfg.model_name,
                                    run_key=run_key(context), error=str(exc),
                                    tracking_uri=self.mlflow_hook.tracking_uri, ui_url=self.mlflow_hook.ui_url)
        persist_mlflow_run_url(context, run["url"])

    def _challengers(self, cfg: PipelineConfig) -> list[dict]:
        if self.fetch_from in (None, "", "None"):
            return [{"family": f, "source": None, "role": "challenger"} for f in cfg.models]
        from onnxcast.registry.fetch import FetchError, read_source_spec

        try:
            spec = read_source_spec(self.fetch_from, tracking_uri=self.mlflow_hook.tracking_uri,
                                    s3_settings=self.s3_hook.get_settings())
        except FetchError as exc:
            raise AirflowFailException(str(exc)) from None
        return [{"family": spec["family"], "source": self.fetch_from, "role": "challenger"}]

    def _champion(self, cfg: PipelineConfig, notes: list[str], incomparable: dict) -> dict | None:
        from onnxcast.registry.fetch import read_source_spec
        from onnxcast.registry.tracking import CHAMPION, alias_version

        version = alias_version(cfg.model_name, CHAMPION, self.mlflow_hook.tracking_uri)
        if version is None:
            notes.append(f"no {CHAMPION} registered for {cfg.model_name}")
            return None
        source = f"models:/{cfg.model_name}/{version}"
        spec = read_source_spec(source, tracking_uri=self.mlflow_hook.tracking_uri)
        wanted = {"horizon": cfg.horizon, "n_features": cfg.n_features}
        different = {k: spec.get(k) for k, v in wanted.items() if spec.get(k) != v}
        if different:
            notes.append(f"{CHAMPION} v{version} is not comparable ({different} vs {wanted})")
            incomparable.update(version=version, differences={k: [v, wanted[k]] for k, v in different.items()})
            return None
        return {"version": version, "source": source}


class _FamilyStepOperator(_TrackedOperator):
    """A step for one model family in the run directory (mapped over the families)."""

    template_fields: Sequence[str] = ("run_dir", "family")

    def __init__(self, *, run_dir: str, family: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir
        self.family = family

    def execute(self, context: Context) -> dict:
        from onnxcast.registry.champion import plan_entry

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
        from onnxcast.pipeline.run import family_dir, train_family

        if not entry.get("source"):
            result = train_family(cfg, self.family)
            self.log.info("Trained %s: %s epochs, best validation loss %.4g", self.family, result["epochs"],
                          result["best_validation_loss"])
            return {"family": self.family, "source": "trained", "epochs": result["epochs"],
                    "best_validation_loss": result["best_validation_loss"]}
        from onnxcast.registry.fetch import FetchError, fetch_model

        try:
            fetched = fetch_model(entry["source"], family_dir(cfg, self.family),
                                  tracking_uri=self.mlflow_hook.tracking_uri,
                                  s3_settings=self.s3_hook.get_settings(),
                                  expect={"horizon": cfg.horizon, "n_features": cfg.n_features})
        except FetchError as exc:
            raise AirflowFailException(str(exc)) from None
        self.log.info("Fetched %s (%s) from %s", self.family, fetched.family, entry["source"])
        return {"family": self.family, "source": entry["source"], "spec_family": fetched.family}


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
        from onnxcast.pipeline.run import validate_family

        result = validate_family(cfg, self.family)
        eligible = [v["name"] for v in result["variants"] if v.get("eligible")]
        self.log.info("Validated %s: fp32 holdout MAE %.4g, gates passed %s, eligible %s", self.family,
                      result["fp32_holdout_mae"], result["gates_passed"], readable(eligible))
        return {"family": self.family, "fp32_holdout_mae": result["fp32_holdout_mae"],
                "gates_passed": result["gates_passed"], "eligible": eligible, "failures": result["failures"]}


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


def _extra_settings(value: Any) -> dict:
    """The ``extra_settings`` param: a mapping, JSON text of one, or nothing; anything else fails
    the task (ignoring it silently would train with settings the user did not ask for)."""
    if value in (None, "", "None"):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise AirflowFailException(f"extra_settings must be a JSON object, got {value[:80]!r}") from None
    if not isinstance(value, dict):
        raise AirflowFailException(f"extra_settings must be a mapping of setting to value, got {type(value).__name__}")
    return value
