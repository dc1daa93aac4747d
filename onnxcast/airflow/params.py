"""The training DAG's trigger-form params of the pipeline settings, generated from their
declaration (onnxcast.pipeline.config.setting): type, range, choices, default, description.

Light: Airflow's Param and the settings dataclass only, so DAG files that import it parse fast.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from onnxcast.airflow.settings import retry_delay
from onnxcast.pipeline.config import PipelineConfig, Setting, settings

__all__ = ["pipeline_param", "pipeline_params", "pipeline_templates", "retry_delay", "setting_param"]

_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", tuple: "array"}


def pipeline_params(cls: type = PipelineConfig) -> dict[str, Param]:
    """param name: Param, for every setting of ``cls`` declared with ``dag``, in declaration order."""
    return {s.dag: setting_param(s) for s in _dag_settings(cls)}


def pipeline_param(name: str, cls: type = PipelineConfig, **override: Any) -> Param:
    """The param of the setting ``name`` (for a DAG other than the training DAG), with
    ``override`` (``description=...``) applied."""
    found = [s for s in settings(cls) if s.name == name]
    if not found:
        raise KeyError(f"no setting {name!r} in {cls.__name__}")
    return setting_param(found[0]._replace(**override))


def pipeline_templates(cls: type = PipelineConfig) -> dict[str, str]:
    """setting name: the Jinja template of its param, the ``settings`` of CheckDataOperator."""
    return {s.name: f"{{{{ params.{s.dag} }}}}" for s in _dag_settings(cls)}


def setting_param(s: Setting) -> Param:
    """The Param of one setting: the form's default; its JSON schema type ("null" too when the
    default is empty, so the form does not require it); its range, choices or pattern."""
    kind = _TYPES[s.kind]
    default = list(s.dag_default) if isinstance(s.dag_default, tuple) else s.dag_default
    schema: dict[str, Any] = {"type": ["null", kind] if default in (None, [], "") else kind}
    if s.kind is str and s.required:
        schema["minLength"] = 1
    if s.pattern:
        schema["pattern"] = s.pattern
    if s.low is not None:
        schema["exclusiveMinimum" if s.low_open else "minimum"] = s.low
    if s.high is not None:
        schema["exclusiveMaximum" if s.high_open else "maximum"] = s.high
    if s.kind is tuple:
        schema["items"] = {"type": "string"}
    if s.kind is tuple and s.choices:  # a non-empty subset: a multi-select of the choices in the form
        # (examples make the form show a multi-select, so a typo cannot be typed; items.enum is
        # what the API validates)
        shown = list(s.labels or s.choices)
        schema.update(minItems=1, uniqueItems=True, items={"type": "string", "enum": shown}, examples=shown)
        if s.labels:
            schema["values_display"] = dict(s.labels)
    return Param(default, description=s.description, **schema)


def _dag_settings(cls: type) -> list[Setting]:
    chosen = [s for s in settings(cls) if s.dag]
    nested = [s.name for s in chosen if "." in s.name]
    if nested:
        raise TypeError(f"{', '.join(nested)}: a nested setting reaches the DAG through extra_settings only")
    return chosen
