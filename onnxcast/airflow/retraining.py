"""The retraining asset and what a run it triggered takes from its event. Light (airflow.sdk
and the settings declaration only): both DAG files import it.

``onnxcast_monitor``'s ``retrain_signal`` emits an event of :data:`RETRAIN` with the extra
``{"model", "channel", "version", "reasons", "conf"}``; ``onnxcast_training`` is scheduled on
it (as well as weekly) and its ``check_data`` applies ``conf`` over the param defaults
(:func:`retrain_settings`) and records the reasons.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset

from onnxcast.base.errors import ConfigError

RETRAIN = Asset(name="onnxcast_retrain", uri="x-onnxcast://retrain")
# what a retraining never takes over from the deployed version: its output folder and its end
# (the same list as onnxcast.registry.monitoring.NOT_CARRIED, which this light module cannot import)
NOT_CARRIED = ("out_dir", "trained_until")


RETRAIN_SOURCE = ("onnxcast_monitor", "retrain_signal")  # the only producer whose events are taken


def retrain_events(context: Any) -> list[dict]:
    """The extras of the :data:`RETRAIN` events that triggered this run (empty: a scheduled or
    manual run). Only events of ``onnxcast_monitor.retrain_signal`` are taken: one posted
    through the REST API (``POST /api/v2/assets/events`` needs asset permissions only; Airflow
    marks its extra ``from_rest_api``) or from another task is refused. ConfigError naming
    the refused event when no event is taken, so a forged event trains nothing."""
    events = context.get("triggering_asset_events") or {}
    found, refused = [], []
    for asset in list(events):
        if getattr(asset, "name", None) == RETRAIN.name and getattr(asset, "uri", None) == RETRAIN.uri:
            for event in events[asset]:
                extra = getattr(event, "extra", None) or {}
                source = (getattr(event, "source_dag_id", None), getattr(event, "source_task_id", None))
                if not isinstance(extra, dict) or extra.get("from_rest_api"):
                    refused.append("posted through the REST API")
                elif source != RETRAIN_SOURCE:
                    refused.append(f"from {source[0]}.{source[1]}, not {'.'.join(RETRAIN_SOURCE)}")
                else:
                    found.append(dict(extra))
    if refused and not found:
        raise ConfigError(f"refused the {RETRAIN.name} event that triggered this run ({refused[0]}): only "
                          f"{'.'.join(RETRAIN_SOURCE)} asks for a retraining")
    return found


def retrain_settings(conf: Any) -> tuple[dict, list[str]]:
    """The settings of an event's ``conf`` a training run may take, each checked as the trigger
    form checks its input (the setting's Param: type, range, choices, pattern); settings the
    pipeline does not know, and those never carried over, are left out and named. ConfigError,
    naming the setting and value, when one fails its check."""
    from airflow.sdk.definitions.param import ParamValidationError

    from onnxcast.airflow.params import setting_param
    from onnxcast.pipeline.config import PipelineConfig, settings

    if conf in (None, ""):
        return {}, []
    if not isinstance(conf, dict):
        raise ConfigError(f"retrain event conf must be a mapping of settings, got {type(conf).__name__}")
    declared = {s.name: s for s in settings(PipelineConfig)}
    known = set(PipelineConfig.__dataclass_fields__)
    taken, left_out = {}, []
    for key, value in conf.items():
        if key not in known or key in NOT_CARRIED:
            left_out.append(key)
            continue
        if key in declared and value is not None:
            param = setting_param(declared[key])
            try:
                param.resolve(value=list(value) if isinstance(value, tuple) else value, suppress_exception=False)
            except ParamValidationError as exc:
                first = str(exc).splitlines()[0][:200]
                raise ConfigError(f"retrain event conf: {key}={value!r} is not a valid setting ({first})") from None
        taken[key] = value
    return taken, sorted(left_out)
