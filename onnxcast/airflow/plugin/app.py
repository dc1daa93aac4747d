"""The rollout page's FastAPI app, mounted by Airflow's API server under ``/onnxcast``.

- ``GET /onnxcast/rollout``: the HTML page (jinja2, autoescaped; no script, a strict
  Content-Security-Policy that lets only the Airflow UI frame it);
- ``GET /onnxcast/api/rollout``: the same data as JSON.

Both authenticate as Airflow's own API does (:func:`airflow.api_fastapi.core_api.security.get_user`:
the JWT as a bearer token, else the UI's ``_token`` cookie) and need the auth manager's
read access to the installation's views (``AccessView.PLUGINS``). Without a valid token the
JSON endpoint answers 401 and the page redirects to the auth manager's login; a user without
that access gets 403.

The data (:mod:`onnxcast.airflow.plugin.data`) is gathered per request, in a worker thread,
from the rollout store the operators use (``onnxcast.airflow.settings.store_uri``, the
``aws_default`` connection for S3) and the MLflow registry of ``mlflow_default``.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

TEMPLATES = Path(__file__).resolve().parent / "templates"
SECURITY_HEADERS = {
    # no script at all; inline styles only; only the Airflow UI (same origin) may frame it
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "frame-ancestors 'self'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class _NotLoggedIn(Exception):
    def __init__(self, status_code: int, detail: str):
        self.status_code, self.detail = status_code, detail


async def _user(request: Request):
    """The Airflow user of the request (bearer JWT or the UI's cookie), authorized to read views."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    try:
        user = await get_user(request, None, await bearer_scheme(request))
    except HTTPException as exc:
        raise _NotLoggedIn(exc.status_code, str(exc.detail)) from None
    if not get_auth_manager().is_authorized_view(access_view=AccessView.PLUGINS, user=user):
        raise HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail="Forbidden")
    return user


def page_data() -> dict[str, Any]:
    """The page's data from the deployment's store, trust root and registry."""
    from onnxcast.airflow.hooks import MlflowHook, S3SettingsHook
    from onnxcast.airflow.plugin.data import Registry, gather, text
    from onnxcast.airflow.rollout import development_keys_dir
    from onnxcast.airflow.settings import store_uri, trust_root

    try:
        uri = store_uri()
        store = S3SettingsHook().open_store(uri)
    except Exception as exc:  # AirflowFailException (not configured), ConfigError (bad URI)
        return {"store": None, "trust_root": None, "generated_at": None, "models": [], "truncated": False,
                "listing": None, "error": text(exc, 1000)}
    try:
        hook = MlflowHook()  # the API server lives on: the login for this page only
        registry = Registry(hook.tracking_uri, hook.ui_url)
        registry_error = None
    except Exception as exc:  # no mlflow_default connection in the deployed mode
        hook, registry, registry_error = None, None, text(exc, 1000)
    with hook.login() if hook is not None else nullcontext():
        data = gather(store, trust_file=trust_root(None, development_keys_dir()), registry=registry)
    data["registry_error"] = registry_error
    return data


def create_app() -> FastAPI:
    import jinja2

    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                                     undefined=jinja2.StrictUndefined)
    app = FastAPI(title="onnxcast rollout", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(_NotLoggedIn)
    async def not_logged_in(request: Request, exc: _NotLoggedIn) -> Response:
        if request.url.path.rstrip("/").endswith("/api/rollout"):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code,
                                headers={"WWW-Authenticate": "Bearer", **SECURITY_HEADERS})
        from airflow.api_fastapi.app import get_auth_manager

        login = get_auth_manager().get_url_login(next_url=str(request.url.path))
        return RedirectResponse(login, status_code=status.HTTP_303_SEE_OTHER, headers=SECURITY_HEADERS)

    @app.get("/rollout", response_class=HTMLResponse)
    def rollout_page(user: Annotated[Any, Depends(_user)]) -> HTMLResponse:
        html = environment.get_template("rollout.html").render(data=page_data())
        return HTMLResponse(html, headers=SECURITY_HEADERS)

    @app.get("/api/rollout")
    def rollout_json(user: Annotated[Any, Depends(_user)]) -> JSONResponse:
        return JSONResponse(page_data(), headers=SECURITY_HEADERS)

    return app
