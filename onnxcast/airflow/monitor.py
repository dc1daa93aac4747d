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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from onnxcast.airflow.links import persist_mlflow_run_url
from onnxcast.airflow.retraining import RETRAIN
from onnxcast.airflow.steps import TrackedOperator, readable
from onnxcast.base.errors import OnnxcastError
from onnxcast.registry.monitor_verdict import (
    ChannelFailed,
    NoRetraining,
    NothingJudged,
    judge_channels,
    number,
    retraining_request,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["RETRAIN", "MonitorChannelsOperator", "RetrainSignalOperator"]


class MonitorChannelsOperator(TrackedOperator):
    """Judge the model each of ``channels`` serves on the data since it was trained.

    A channel with no pointer in the rollout store is skipped (``skipped: "serves nothing"``),
    one that cannot be judged carries ``error``; the task fails only when no channel is served
    or every served one failed.

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
        try:
            return judge_channels(channels, self._served, lambda channel: self._monitor(context, channel),
                                  model=self.model_name, log=self.log)
        except NothingJudged as exc:
            raise AirflowFailException(str(exc)) from None

    def _served(self, channel: str) -> bool:
        """Whether the store holds a pointer for ``channel`` (a model promoted to only one
        channel leaves the other unserved: nothing to judge there, not a failure)."""
        from onnxcast.airflow.settings import store_uri
        from onnxcast.rollout.store import MAX_POINTER_BYTES, open_store

        store = store_uri(self.store_uri)
        settings = self.s3_hook.settings_for(store) if store.startswith("s3://") else None
        key_store = open_store(store, settings)
        return key_store.read(key_store.channel_key(self.model_name, channel), MAX_POINTER_BYTES) is not None

    def _monitor(self, context: Context, channel: str) -> dict:
        from onnxcast.airflow.settings import store_uri
        from onnxcast.registry.monitoring import monitor_channel

        store = store_uri(self.store_uri)
        dataset = None if self.dataset_uri in (None, "", "None") else str(self.dataset_uri)
        try:
            summary = monitor_channel(self.model_name, channel, store, trust=self._trust_root(store), data_uri=dataset,
                                      tracking_uri=self.mlflow_hook.tracking_uri, ui_url=self.mlflow_hook.ui_url,
                                      run_key=f"{context['dag_run'].dag_id}/{context['run_id']}",
                                      s3_settings_for=self.s3_hook.settings_for)
        except OnnxcastError as exc:  # refused pull, unreadable data, no report: the same next try
            raise ChannelFailed(f"{self.model_name} channel {channel}: {' '.join(str(exc).split())}") from None
        if not getattr(self, "_linked", False):  # the task's "MLflow run" button: the first channel's run
            persist_mlflow_run_url(context, summary["url"])
            self._linked = True
        self.log.info("%s v%s on %s: realised MASE %s vs holdout %.4g [%.4g, %.4g], p=%s, degraded %s, drift %s "
                      "(%s new rows, %d origins; %.1fs, MLflow run %s)", self.model_name, summary["version"], channel,
                      number(summary["mase"]), summary["holdout_mase"], *summary["holdout_ci"], number(summary["p_value"]),
                      summary["degraded"], readable(summary["drift"]) or "none", summary["new_rows"],
                      summary["origins"], summary["seconds"], summary["url"])
        return summary

    def _trust_root(self, store: str) -> str | None:
        """``trust``, else ``$ONNXCAST_TRUST``, else (embedded mode, local store) the development
        key's root; None lets the pull name what is missing."""
        from onnxcast.airflow.rollout import development_keys_dir
        from onnxcast.airflow.settings import trust_root

        return trust_root(self.trust, development_keys_dir(), self.store_uri)


class RetrainSignalOperator(BaseOperator):
    """Emit the retraining event (its outlet: :data:`RETRAIN`) when a channel degraded or
    drifted; skip otherwise (a skipped task emits no asset event)."""

    template_fields: Sequence[str] = ("results",)

    def __init__(self, *, results: Any, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", [RETRAIN])
        super().__init__(**kwargs)
        self.results = results

    def execute(self, context: Context) -> dict:
        try:
            extra = retraining_request(self.results)
        except NoRetraining as exc:
            raise AirflowSkipException(str(exc)) from None
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = extra
        self.log.info("Retraining asked for %s: %s", extra["model"], "; ".join(extra["reasons"]))
        return extra
