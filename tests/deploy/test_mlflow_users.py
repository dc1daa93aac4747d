"""docker/bin/mlflow-users against a real MLflow tracking server with its basic-auth app (the
Compose file's `mlflow-init` job): the pipeline and release users move `champion`, the reader
cannot, anonymous requests get 401. Compose itself cannot start here (no container registry),
so the script is run as the job runs it, over HTTP."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from mlflow_http import move_champion, register_version
from serve_support import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlflow_auth_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mlflow-auth")
    admin_password = secrets.token_urlsafe(18)
    (folder / "basic_auth.ini").write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{folder / 'auth.db'}\nadmin_username = admin\n"
        f"admin_password = {admin_password}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    port = free_port()
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(folder / "basic_auth.ini"),
           "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16)}
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--app-name", "basic-auth",
                               "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1"],
                              env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=(folder / "server.log").open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, admin_password, folder
    finally:
        server.terminate()
        server.wait(timeout=30)


def run_mlflow_users(url: str, admin_password: str, folder: Path, users: dict) -> subprocess.CompletedProcess:
    (folder / "admin-password").write_text(admin_password)
    (folder / "users.json").write_text(json.dumps(users))
    return subprocess.run([sys.executable, str(REPO / "docker" / "bin" / "mlflow-users"), "--url", url,
                           "--admin-password", str(folder / "admin-password"), "--users", str(folder / "users.json"),
                           "--timeout", "120"], capture_output=True, text=True, timeout=300)


def test_pipeline_and_release_move_the_champion_the_reader_cannot(mlflow_auth_server):
    url, admin_password, folder = mlflow_auth_server
    users = {name: secrets.token_urlsafe(18) for name in ("pipeline", "release", "reader")}
    first = run_mlflow_users(url, admin_password, folder, users)
    assert first.returncode == 0, first.stderr
    again = run_mlflow_users(url, admin_password, folder, users)  # the job runs on every `up`
    assert again.returncode == 0, again.stderr

    base = f"{url}/api/2.0/mlflow"
    pipeline, release, reader = ((n, users[n]) for n in ("pipeline", "release", "reader"))
    assert requests.get(f"{base}/experiments/search", params={"max_results": 1}, timeout=30).status_code == 401
    name, version = register_version(base, pipeline, "compose")
    for user, expected in ((reader, 403), (release, 200), (pipeline, 200)):
        assert move_champion(base, user, name, version) == expected, user[0]


def test_a_wrong_admin_password_fails_the_job_with_one_line(mlflow_auth_server):
    url, _, folder = mlflow_auth_server
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the server is up (the test above may not have run)
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(1)
    failed = run_mlflow_users(url, "not-the-password", folder, {"pipeline": secrets.token_urlsafe(18)})
    assert failed.returncode == 1
    assert "error: MLflow user 'pipeline': HTTP 401" in failed.stderr
