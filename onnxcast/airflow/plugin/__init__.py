"""The onnxcast Airflow plugin: the rollout page in the Airflow UI.

Registered through the ``airflow.plugins`` entry point (pyproject.toml), so installing
onnxcast is all it takes. A FastAPI app mounted on the API server under ``/onnxcast``
(:mod:`onnxcast.airflow.plugin.app`: ``/onnxcast/rollout``, the HTML page, and
``/onnxcast/api/rollout``, the same data as JSON), and an entry "Rollout" in the UI's
navigation (Browse) that shows the page inside the UI.

Airflow loads plugins in every component (scheduler, DAG processor, workers): this module
imports only the plugin base class; the app (FastAPI, jinja2, the rollout and registry
code) is built the first time the API server asks for ``fastapi_apps``.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/onnxcast"
PAGE_PATH = "/rollout"
API_PATH = "/api/rollout"
NAV_NAME = "Rollout"
NAV_ROUTE = "onnxcast-rollout"

_apps: list[dict] = []


class OnnxcastPlugin(AirflowPlugin):
    """The rollout page (FastAPI app) and its navigation entry."""

    name = "onnxcast"
    external_views = [{
        "name": NAV_NAME,
        "href": f"{URL_PREFIX}{PAGE_PATH}",
        "url_route": NAV_ROUTE,  # shown inside the UI at /plugin/onnxcast-rollout
        "destination": "nav",
        "category": "browse",
    }]

    @property
    def fastapi_apps(self) -> list[dict]:  # type: ignore[override]
        if not _apps:
            from onnxcast.airflow.plugin.app import create_app

            _apps.append({"name": "onnxcast rollout", "app": create_app(), "url_prefix": URL_PREFIX})
        return _apps
