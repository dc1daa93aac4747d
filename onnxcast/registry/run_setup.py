"""What a training run starts from: its settings (the trigger form's, extra settings, a
retraining event's), the retraining it answers (``trigger.json``) and, once its data is
checked, its plan (``plan.json``: the families it trains or fetches, and the
registry's champion when the run can evaluate it).

A champion is evaluated alongside the challengers only when it is comparable: the same
horizon from the same features as this run (else its consumers would get other shapes);
an incomparable one is recorded in the plan, and champion.decide then refuses to replace it
automatically. The data check operator (onnxcast.airflow.steps.CheckDataOperator) calls these.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxcast.base.errors import ConfigError
from onnxcast.base.files import write_json
from onnxcast.base.s3 import S3Settings
from onnxcast.pipeline.config import PipelineConfig, data_source
from onnxcast.pipeline.ensemble import ENSEMBLE, ensemble_last
from onnxcast.pipeline.layout import RunLayout
from onnxcast.registry.fetch import FetchError, read_source_spec
from onnxcast.registry.plan import CHAMPION_FAMILY, COMBINES, write_plan
from onnxcast.registry.tracking import CHAMPION, alias_version

RETRAIN_ASSET = "onnxcast_retrain"
RETRAIN_SOURCE = ("onnxcast_monitor", "retrain_signal")  # the only producer whose events are taken


class ChallengerSourceError(FetchError):
    """The model the run was asked to fetch (``fetch_from``) cannot be read: the same next try."""


@dataclass(frozen=True)
class RunPlan:
    """The plan written: the family names in order, the champion evaluated (``{version,
    source}``, None when none is) and the notes on why a champion is not."""

    families: list[str]
    champion: dict | None = None
    notes: list[str] = field(default_factory=list)


def run_config(settings: Mapping[str, Any], *, extra_settings: Any = None, retrain: Mapping[str, Any] | None = None,
               run_dir: str | Path, trained_until: str | None = None, default_end: str | None = None) -> PipelineConfig:
    """The run's settings: ``extra_settings`` (a mapping or JSON text of one: the settings the
    form has no field for) under ``settings`` (the form's), empty values left out, then the
    settings a retraining event carries (``retrain``), the data in ``run_dir`` until
    ``trained_until``, else the settings' own ``trained_until``, else ``default_end`` (the run's
    data interval end). ConfigError naming the setting at fault."""
    extra = parse_extra_settings(extra_settings)
    values = {k: v for k, v in {**extra, **dict(settings)}.items() if v not in (None, "", "None")}
    values.update(retrain or {})
    if "data_uri" in values:
        values["data_uri"] = data_source(values["data_uri"])
    values["out_dir"] = str(run_dir)
    values["trained_until"] = trained_until or values.get("trained_until") or default_end
    return PipelineConfig.from_dict(values)


def parse_extra_settings(value: Any) -> dict:
    """The ``extra_settings`` param: a mapping, JSON text of one, or nothing; ConfigError for
    anything else (ignoring it silently would train with settings the user did not ask for)."""
    if value in (None, "", "None"):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError(f"extra_settings must be a JSON object, got {value[:80]!r}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"extra_settings must be a mapping of setting to value, got {type(value).__name__}")
    return value


def plan_run(cfg: Any, *, fetch_from: str | None = None, compare_with_champion: bool = True,
             tracking_uri: str | None = None,
             s3_settings: S3Settings | Callable[[], S3Settings | None] | None = None) -> RunPlan:
    """Write ``plan.json`` in ``cfg``'s run folder: the families of ``cfg.models`` trained here
    (the ensemble last, with ``combines``: the families it is made from once they trained), or
    the one model ``fetch_from`` names (ChallengerSourceError when it cannot be read), and,
    with ``compare_with_champion``, the registry's ``champion`` as the family ``champion`` when
    it forecasts the same horizon from the same features. ``s3_settings`` (for an ``s3://``
    ``fetch_from``) may be a function, called only when there is a model to fetch."""
    entries = _challengers(cfg, fetch_from, tracking_uri, s3_settings)
    notes: list[str] = []
    incomparable: dict = {}
    champion = comparable_champion(cfg, notes, incomparable, tracking_uri) if compare_with_champion else None
    if champion:
        entries.append({"family": CHAMPION_FAMILY, "source": champion["source"], "role": "champion",
                        "version": champion["version"]})
    elif not compare_with_champion:
        notes.append("comparison with the champion is off")
    write_plan(cfg.run_dir, entries, notes, incomparable or None)
    return RunPlan([e["family"] for e in entries], champion, notes)


def comparable_champion(cfg: Any, notes: list[str], incomparable: dict, tracking_uri: str | None) -> dict | None:
    """The registry's champion of ``cfg.model_name`` (``{version, source}``) when this run can
    evaluate it; else None, with why appended to ``notes`` (and, when it forecasts another
    horizon or from other features, ``{version, differences}`` put in ``incomparable``)."""
    version = alias_version(cfg.model_name, CHAMPION, tracking_uri)
    if version is None:
        notes.append(f"no {CHAMPION} registered for {cfg.model_name}")
        return None
    source = f"models:/{cfg.model_name}/{version}"
    spec = read_source_spec(source, tracking_uri=tracking_uri)
    wanted = {"horizon": cfg.horizon, "n_features": cfg.n_features}
    different = {k: spec.get(k) for k, v in wanted.items() if spec.get(k) != v}
    if different:
        notes.append(f"{CHAMPION} v{version} is not comparable ({different} vs {wanted})")
        incomparable.update(version=version, differences={k: [v, wanted[k]] for k, v in different.items()})
        return None
    return {"version": version, "source": source}


def retraining_events(events: Iterable[Any]) -> list[dict]:
    """The extras of the retraining asset's events (``extra``, ``source_dag_id``,
    ``source_task_id``) that :data:`RETRAIN_SOURCE` emitted. One posted through the REST API
    (``POST /api/v2/assets/events`` needs asset permissions only; Airflow marks its extra
    ``from_rest_api``) or from another task is refused: ConfigError naming it when no event is
    taken, so a forged event trains nothing."""
    found, refused = [], []
    for event in events:
        extra = getattr(event, "extra", None) or {}
        source = (getattr(event, "source_dag_id", None), getattr(event, "source_task_id", None))
        if not isinstance(extra, dict) or extra.get("from_rest_api"):
            refused.append("posted through the REST API")
        elif source != RETRAIN_SOURCE:
            refused.append(f"from {source[0]}.{source[1]}, not {'.'.join(RETRAIN_SOURCE)}")
        else:
            found.append(dict(extra))
    if refused and not found:
        raise ConfigError(f"refused the {RETRAIN_ASSET} event that triggered this run ({refused[0]}): only "
                          f"{'.'.join(RETRAIN_SOURCE)} asks for a retraining")
    return found


def record_retraining(run_dir: str | Path, events: list[dict], taken: dict, left_out: list[str]) -> dict:
    """``trigger.json`` (the report's ``trigger``) of a run retraining events asked for: the
    newest event's model, channel and version, every event's reasons, the settings taken from
    the newest event's ``conf`` and those left out."""
    event = events[-1]  # several events queued up: the newest one's settings
    reasons = [str(r) for e in events for r in (e.get("reasons") or [])]
    trigger = {"kind": "retrain", "asset": RETRAIN_ASSET, "model": event.get("model"),
               "channel": event.get("channel"), "version": event.get("version"), "reasons": reasons,
               "settings": sorted(taken), "left_out": left_out, "events": len(events)}
    write_json(RunLayout(run_dir).trigger, trigger)
    return trigger


def _challengers(cfg: Any, fetch_from: str | None, tracking_uri: str | None, s3_settings: Any) -> list[dict]:
    if fetch_from in (None, "", "None"):
        # the ensemble last: the DAG's ensemble task combines the others once they trained in parallel
        members = [f for f in cfg.models if f != ENSEMBLE]
        return [{"family": f, "source": None, "role": "challenger", **({COMBINES: members} if f == ENSEMBLE else {})}
                for f in ensemble_last(cfg.models)]
    s3_settings = s3_settings() if callable(s3_settings) else s3_settings
    try:
        spec = read_source_spec(fetch_from, tracking_uri=tracking_uri, s3_settings=s3_settings)
    except FetchError as exc:
        raise ChallengerSourceError(str(exc)) from None
    return [{"family": spec["family"], "source": fetch_from, "role": "challenger"}]
