"""onnxcast as an Airflow provider: operators, hooks, the "MLflow run" extra link and the
``mlflow`` connection type, registered through the ``apache_airflow_provider`` entry point
(pyproject.toml), so ``pip install onnxcast`` is all a deployment needs: no PYTHONPATH, no
plugins folder. DAG files import the operators from :mod:`onnxcast.airflow.operators`, the
params of the pipeline settings from :mod:`onnxcast.airflow.params`. The rollout page in the
UI is a plugin of the same package (:mod:`onnxcast.airflow.plugin`, entry point ``airflow.plugins``).

This module stays import-light: Airflow's providers manager imports it to read
:func:`get_provider_info` in every component.
"""

from __future__ import annotations

from onnxcast import __version__


def get_provider_info() -> dict:
    """What Airflow's providers manager reads (schema: airflow/provider_info.schema.json)."""
    return {
        "package-name": "onnxcast",
        "name": "onnxcast",
        "description": "Time-series forecasters from training to ONNX on edge and cloud: data check, "
                       "training, export, validation, MLflow registry and signed rollout.",
        "versions": [__version__],
        "integrations": [
            {"integration-name": "onnxcast", "external-doc-url": "https://github.com/onnxcast/onnxcast",
             "tags": ["software"]},
        ],
        "operators": [
            {"integration-name": "onnxcast",
             "python-modules": ["onnxcast.airflow.steps", "onnxcast.airflow.registry",
                                "onnxcast.airflow.rollout", "onnxcast.airflow.monitor"]},
        ],
        "sensors": [{"integration-name": "onnxcast", "python-modules": ["onnxcast.airflow.serving"]}],
        "triggers": [{"integration-name": "onnxcast",
                      "python-modules": ["onnxcast.airflow.serving", "onnxcast.airflow.triggers"]}],
        "hooks": [{"integration-name": "onnxcast", "python-modules": ["onnxcast.airflow.hooks"]}],
        "extra-links": ["onnxcast.airflow.links.MlflowRunLink"],
        "connection-types": [
            {
                "connection-type": "mlflow",
                "hook-class-name": "onnxcast.airflow.hooks.MlflowHook",
                "hook-name": "MLflow tracking server",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema"],
                    "relabeling": {"host": "Tracking URI", "login": "Username"},
                    "placeholders": {"host": "https://mlflow.example.com", "login": "pipeline user",
                                     "port": "(in the URI)"},
                },
                "conn-fields": {
                    "tracking_uri": {"label": "Tracking URI (overrides host)",
                                     "description": "Full tracking URI when it is not host and port",
                                     "schema": {"type": ["string", "null"]}},
                    "ui_url": {"label": "UI URL", "description": "Where the task's 'MLflow run' link points "
                                                                 "(default: the tracking URI)",
                               "schema": {"type": ["string", "null"]}},
                },
            },
        ],
    }
