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


def retrain_events(context: Any) -> list[dict]:
    """The extras of the :data:`RETRAIN` events that triggered this run (empty: a scheduled or
    manual run), only those of ``onnxcast_monitor.retrain_signal``
    (onnxcast.registry.run_setup.retraining_events: ConfigError naming the refused event when
    none is taken, so a forged event trains nothing)."""
    from onnxcast.registry.run_setup import retraining_events

    events = context.get("triggering_asset_events") or {}
    return retraining_events(event for asset in list(events)
                             if getattr(asset, "name", None) == RETRAIN.name and getattr(asset, "uri", None) == RETRAIN.uri
                             for event in events[asset])


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
