"""The rollout page on a real Airflow API server (tests/plugin/conftest.py): the plugin is
loaded from its entry point and mounted under /onnxcast, listed in the UI's navigation, and
answers only requests that carry Airflow's JWT (bearer or the UI's ``_token`` cookie)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from .conftest import HOSTILE_REASON

pytestmark = pytest.mark.slow


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_unauthenticated_requests_are_refused(airflow_api):
    url = airflow_api["url"]
    status, headers, body = get(f"{url}/onnxcast/api/rollout")
    assert status == 401, body
    assert json.loads(body) == {"detail": "Not authenticated"}
    status, headers, _ = get(f"{url}/onnxcast/rollout")
    assert status == 303 and headers["location"].startswith("/auth/login?next="), headers
    for bad in ({"Authorization": "Bearer not-a-jwt"}, {"Cookie": "_token=not-a-jwt"}):
        status, _, body = get(f"{url}/onnxcast/api/rollout", bad)
        assert status in (401, 403) and b"m" not in body.replace(b"Token", b""), (bad, status, body)


def test_bearer_token_gets_the_data(airflow_api, api_token):
    status, headers, body = get(f"{airflow_api['url']}/onnxcast/api/rollout", {"Authorization": f"Bearer {api_token}"})
    assert status == 200, body
    data = json.loads(body)
    [model] = data["models"]
    channels = {c["channel"]: c for c in model["channels"]}
    assert channels["edge"]["pointer"]["version"] == "1" and channels["cloud"]["pointer"]["version"] == "2"
    assert channels["edge"]["device"]["accepted"] and channels["cloud"]["device"]["accepted"]
    canary = channels["canary"]  # planted without a key: shown, refused
    assert canary["device"]["accepted"] is False and "release key(s) required" in canary["device"]["reason"]
    assert canary["pointer"]["verified"] is False and canary["pointer"]["version"] == "1"
    assert [h["action"] for h in channels["edge"]["history"]] == ["rollback", "promote", "promote"]
    assert channels["edge"]["history"][0]["reason"] == HOSTILE_REASON
    # the registry through the mlflow_default connection of the API server
    assert channels["edge"]["registry"]["url"] == "http://mlflow.example:5000/#/models/m/versions/1"
    assert channels["edge"]["registry"]["rollout"]["state"] == "deployed"
    assert channels["edge"]["registry"]["monitor"]["mase"] == 0.97
    assert channels["cloud"]["registry"]["monitor"] is None
    assert "frame-ancestors 'self'" in headers["content-security-policy"]


def test_cookie_gets_the_page(airflow_api, api_token):
    status, headers, body = get(f"{airflow_api['url']}/onnxcast/rollout", {"Cookie": f"_token={api_token}"})
    assert status == 200, body
    html = body.decode()
    assert headers["content-type"].startswith("text/html")
    assert 'data-channel="edge" data-version="1"' in html and 'data-channel="cloud" data-version="2"' in html
    assert 'class="box channel refused"\n     data-channel="canary"' in html
    assert "<script>" not in html and "&lt;script&gt;alert(&#34;owned&#34;)&lt;/script&gt;" in html
    assert "not monitored yet" in html and "MASE 0.97" in html


def test_plugin_is_listed_for_the_ui(airflow_api, api_token):
    status, _, body = get(f"{airflow_api['url']}/api/v2/plugins", {"Authorization": f"Bearer {api_token}"})
    assert status == 200, body
    [plugin] = [p for p in json.loads(body)["plugins"] if p["name"] == "onnxcast"]
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/onnxcast"
    [view] = plugin["external_views"]
    assert view["href"] == "/onnxcast/rollout" and view["url_route"] == "onnxcast-rollout"


def test_invalid_names_hide_no_model_and_truncation_is_told(airflow_api, api_token, rollout_store):
    """Issue 30, item 14, over HTTP: 150 folders with invalid names at the top of the store
    took the places of a listing cut at 101 before filtering (the real model missing, ``truncated:
    false``); then 101 valid models are one more than the page shows, and it says so."""
    import re
    import shutil
    from pathlib import Path

    store = Path(rollout_store) / "store"
    planted = [store / f"#bad-{i:03d}" for i in range(150)] + [store / f"z{i:03d}" for i in range(100)]
    auth = {"Authorization": f"Bearer {api_token}"}
    try:
        for folder in planted[:150]:
            folder.mkdir()
        status, _, body = get(f"{airflow_api['url']}/onnxcast/api/rollout", auth)
        assert status == 200, body
        first = json.loads(body)
        assert [m["name"] for m in first["models"]] == ["m"] and first["truncated"] is False
        for folder in planted[150:]:
            folder.mkdir()
        status, _, body = get(f"{airflow_api['url']}/onnxcast/api/rollout", auth)
        data = json.loads(body)
        names = [m["name"] for m in data["models"]]
        assert status == 200 and len(names) == 100 and names[0] == "m" and data["truncated"] is True
        assert first["listing"]["skipped"] == 150 and first["listing"]["truncated_because"] is None
        assert data["listing"]["truncated_because"] == "only the first 100 models are shown"
        status, _, body = get(f"{airflow_api['url']}/onnxcast/rollout", {"Cookie": f"_token={api_token}"})
        html = body.decode()
        assert status == 200 and "Not every model is shown: only the first 100 models are shown." in html
        assert re.search(r"150 of the \d+ entries read at the top of the store are not model names", html)
    finally:
        for folder in planted:
            shutil.rmtree(folder, ignore_errors=True)
