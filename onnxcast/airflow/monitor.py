"""Operators of the production monitor (dags/onnxcast_monitor.py) and the retraining signal.

:class:`MonitorChannelsOperator`: for each channel, pull the version the channel serves from
the rollout store as a device does (``onnxcast.rollout.edge.pull`` into scratch, verified
against the trust root), fetch its report from the registry, judge it on the data after its
``trained_until`` (onnxcast.pipeline.monitor) and record the result in MLflow (a monitor run
and the version tag ``onnxcast.monitor.<channel>``, onnxcast.registry.monitoring).

:class:`RetrainSignalOperator`: skips when no channel degraded or drifted, so no event is
emitted; otherwise sets the extra of its :data:`RETRAIN` outlet's event, on which
``onnxcast_training`` is scheduled: ``{model, channel, version, reasons, conf}`` where ``conf``
are the deployed version's training settings (``trained_until`` empty: newer data).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from onnxcast.airflow.links import persist_mlflow_run_url
from onnxcast.airflow.retraining import NOT_CARRIED, RETRAIN
from onnxcast.airflow.steps import _TrackedOperator, readable
from onnxcast.base.errors import OnnxcastError

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["RETRAIN", "MonitorChannelsOperator", "RetrainSignalOperator", "retrain_conf"]


class MonitorChannelsOperator(_TrackedOperator):
    """Judge the model each of ``channels`` serves on the data since it was trained.

    XCom: one summary per channel (``channel``, ``version``, ``mase``, ``holdout_mase``,
    ``holdout_ci``, ``p_value``, ``degraded``, ``drift``, ``reasons``, ``run_id``, ``seconds``,
    ``conf``: the version's training settings).
    """

    template_fields: Sequence[str] = ("model_name", "channels", "dataset_uri", "store_uri", "trust")

    def __init__(self, *, model_name: str, channels: Sequence[str] | str, dataset_uri: str | None = None,
                 store_uri: str | None = None, trust: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.channels = channels
        self.dataset_uri = dataset_uri
        self.store_uri = store_uri
        self.trust = trust

    def execute(self, context: Context) -> list[dict]:
        channels = [self.channels] if isinstance(self.channels, str) else list(self.channels or [])
        if not channels:
            raise AirflowFailException("channels: name at least one channel to monitor")
        summaries = [self._monitor(context, channel) for channel in channels]
        return summaries

    def _monitor(self, context: Context, channel: str) -> dict:
        import time

        from onnxcast.airflow.settings import store_uri
        from onnxcast.pipeline.monitor import MonitorInput, monitor, reasons
        from onnxcast.registry.monitoring import deployed_report, log_monitor_run, set_monitor_tag
        from onnxcast.rollout.edge import installed, pull

        started = time.monotonic()
        store = store_uri(self.store_uri)
        dataset = None if self.dataset_uri in (None, "", "None") else str(self.dataset_uri)
        tracking = self.mlflow_hook.tracking_uri
        with tempfile.TemporaryDirectory(prefix="onnxcast-monitor-") as scratch:
            work = Path(scratch)
            try:
                pulled = pull(store, self.model_name, channel, work / "device", trust=self._trust_root(store),
                              s3_settings=self.s3_hook.settings_for(store) if store.startswith("s3://") else None)
                model_path, _info = installed(work / "device")
                version = _registered_version(model_path.parent / "manifest.json", pulled.version)
                report = deployed_report(self.model_name, version, work / "registry", tracking)
                data = dataset or report["config"]["data_uri"]
                result = monitor(MonitorInput(model_path, report, channel, data), work / "monitor",
                                 s3_settings=self.s3_hook.settings_for(data) if data.startswith("s3://") else None)
            except OnnxcastError as exc:
                raise AirflowFailException(f"{self.model_name} channel {channel}: {' '.join(str(exc).split())}") \
                    from None
            run = log_monitor_run(result, model_name=self.model_name, version=version, channel=channel,
                                  work_dir=work / "mlflow", run_key=f"{context['dag_run'].dag_id}/{context['run_id']}",
                                  tracking_uri=tracking, ui_url=self.mlflow_hook.ui_url)
            set_monitor_tag(self.model_name, version, channel, result, run["run_id"], tracking)
        if not getattr(self, "_linked", False):  # the task's "MLflow run" button: the first channel's run
            persist_mlflow_run_url(context, run["url"])
            self._linked = True
        why = reasons(result)
        seconds = round(time.monotonic() - started, 2)
        self.log.info("%s v%s on %s: realised MASE %s vs holdout %.4g [%.4g, %.4g], p=%s, degraded %s, drift %s "
                      "(%s new rows, %d origins; %.1fs, MLflow run %s)", self.model_name, version, channel,
                      _fmt(result["mase"]), result["holdout_mase"], *result["holdout_ci"], _fmt(result["p_value"]),
                      result["degraded"], readable(result["drift"]) or "none", result["new_rows"],
                      result["origins"], seconds, run["url"])
        return {"model": self.model_name, "channel": channel, "version": str(version), "store_version": pulled.version,
                "mase": result["mase"], "holdout_mase": result["holdout_mase"], "holdout_ci": result["holdout_ci"],
                "p_value": result["p_value"], "degraded": result["degraded"], "drift": result["drift"],
                "origins": result["origins"], "from": result["from"], "to": result["to"], "reasons": why,
                "run_id": run["run_id"], "seconds": seconds, "conf": retrain_conf(report)}

    def _trust_root(self, store: str) -> str | None:
        """``trust``, else ``$ONNXCAST_TRUST``, else (embedded mode, local store) the development
        key's root; None lets the pull name what is missing."""
        from onnxcast.airflow.rollout import development_keys_dir
        from onnxcast.airflow.settings import embedded, store_configured
        from onnxcast.rollout.signing import TRUST_ENV

        given = None if self.trust in (None, "", "None") else str(self.trust)
        given = given or os.environ.get(TRUST_ENV)
        if given is None and embedded() and not store_configured(self.store_uri):
            root = development_keys_dir() / "root.json"
            return str(root) if root.exists() else None
        return given


class RetrainSignalOperator(BaseOperator):
    """Emit the retraining event (its outlet: :data:`RETRAIN`) when a channel degraded or
    drifted; skip otherwise (a skipped task emits no asset event)."""

    template_fields: Sequence[str] = ("results",)

    def __init__(self, *, results: Any, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", [RETRAIN])
        super().__init__(**kwargs)
        self.results = results

    def execute(self, context: Context) -> dict:
        results = [r for r in (self.results or []) if isinstance(r, dict)]
        flagged = [r for r in results if r.get("reasons")]
        if not flagged:
            raise AirflowSkipException("no channel degraded or drifted: "
                                       + "; ".join(f"{r['channel']} v{r['version']} p={_fmt(r['p_value'])}"
                                                   for r in results))
        first = flagged[0]
        extra = {"model": first["model"], "channel": first["channel"], "version": first["version"],
                 "channels": [r["channel"] for r in flagged],
                 "reasons": [line for r in flagged for line in r["reasons"]], "conf": first["conf"]}
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = extra
        self.log.info("Retraining asked for %s: %s", first["model"], "; ".join(extra["reasons"]))
        return extra


def retrain_conf(report: dict) -> dict:
    """The training settings of the run that made the version, for a retraining on newer data."""
    from onnxcast.pipeline.config import PipelineConfig

    known = set(PipelineConfig.__dataclass_fields__)
    return {k: v for k, v in (report.get("config") or {}).items() if k in known and k not in NOT_CARRIED}


def _registered_version(manifest: Path, store_version: str) -> str:
    """The MLflow model version the rollout manifest names (the device verified it), else the
    store's version id (the training DAG promotes under the registry's number)."""
    import json

    try:
        named = (json.loads(manifest.read_text()).get("mlflow") or {}).get("version")
    except (OSError, ValueError):
        named = None
    return str(named or store_version)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"
