"""MLflow's REST API as the tests meet it: a real `mlflow server` (with or without its basic-auth
app) whose access log counts the requests, a proxy that fails chosen calls, and REST helpers
(register a version as one user, move `champion` as others, read the aliases the UI shows)."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


def register_version(base: str, auth: tuple[str, str], prefix: str) -> tuple[str, str]:
    """Create a registered model, an experiment, a run and one version of the model, all as
    ``auth`` (a pipeline user). ``base`` ends in ``/api/2.0/mlflow``. Returns (name, version)."""
    import requests

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    created = requests.post(f"{base}/registered-models/create", json={"name": name}, auth=auth, timeout=30)
    assert created.status_code == 200, created.text
    experiment = requests.post(f"{base}/experiments/create", json={"name": name}, auth=auth, timeout=30)
    assert experiment.status_code == 200, experiment.text
    run = requests.post(f"{base}/runs/create", json={"experiment_id": experiment.json()["experiment_id"]},
                        auth=auth, timeout=30)
    assert run.status_code == 200, run.text
    info = run.json()["run"]["info"]
    version = requests.post(f"{base}/model-versions/create", auth=auth, timeout=30,
                            json={"name": name, "source": f"{info['artifact_uri']}/model", "run_id": info["run_id"]})
    assert version.status_code == 200, version.text
    return name, version.json()["model_version"]["version"]


def move_champion(base: str, auth: tuple[str, str], name: str, version: str) -> int:
    """Point `champion` of ``name`` at ``version`` as ``auth``; the HTTP status."""
    import requests

    return requests.post(f"{base}/registered-models/alias", auth=auth, timeout=30,
                         json={"name": name, "alias": "champion", "version": version}).status_code


def add_version(base: str, auth: tuple[str, str] | None, name: str, like: str) -> str:
    """Another version of ``name`` with the source and run of version ``like``; its number."""
    import requests

    source = requests.get(f"{base}/model-versions/get", params={"name": name, "version": like}, auth=auth,
                          timeout=30).json()["model_version"]
    created = requests.post(f"{base}/model-versions/create", auth=auth, timeout=30,
                            json={"name": name, "source": source["source"], "run_id": source["run_id"]})
    assert created.status_code == 200, created.text
    return created.json()["model_version"]["version"]


def aliases(base: str, auth: tuple[str, str] | None, name: str) -> dict[str, str]:
    """The registered model's aliases as the MLflow UI shows them (alias -> version)."""
    import requests

    model = requests.get(f"{base}/registered-models/get", params={"name": name}, auth=auth,
                         timeout=30).json()["registered_model"]
    return {a["alias"]: a["version"] for a in model.get("aliases", [])}


@dataclass
class MlflowServer:
    """A running `mlflow server`: its URL, its log (uvicorn writes one access-log line per
    request) and, with basic auth, the users' logins."""

    url: str
    log: Path
    users: dict[str, str] = field(default_factory=dict)

    def auth(self, user: str) -> tuple[str, str]:
        return user, self.users[user]

    def mark(self) -> int:
        """Where the access log is now (for :meth:`requests_since`)."""
        return len(self.log.read_bytes().splitlines())

    def requests_since(self, mark: int) -> list[str]:
        """``"METHOD /path"`` of every request answered since ``mark`` (query strings cut)."""
        lines = self.log.read_bytes().decode(errors="replace").splitlines()[mark:]
        found = (ACCESS.search(line) for line in lines)
        return [f"{m.group(1)} {m.group(2)}" for m in found if m]


ACCESS = re.compile(r'"(GET|POST|PUT|PATCH|DELETE|HEAD) ([^ ?"]+)[^"]* HTTP/1\.[01]" \d{3}')


@contextmanager
def mlflow_server(folder: Path, *, users: dict[str, str] | None = None, auth_cache_seconds: int = 0,
                  workers: int = 1) -> Iterator[MlflowServer]:
    """`mlflow server` on a free loopback port: SQLite backend, artifacts proxied into ``folder``.
    With ``users`` ({name: password}) it runs MLflow's basic-auth app (default permission READ,
    an admin made on the first start) and creates them; ``auth_cache_seconds`` is the auth app's
    ``auth_cache_ttl_seconds`` (0: a password hash per request, MLflow's default)."""
    import secrets
    import socket
    import subprocess
    import sys
    import urllib.request

    import requests

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AIRFLOW"))}
    command = [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port),
               "--workers", str(workers), "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
               "--serve-artifacts", "--artifacts-destination", str(folder / "artifacts")]
    admin = None
    if users is not None:
        admin = ("admin", secrets.token_urlsafe(18))
        (folder / "basic_auth.ini").write_text(
            f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{folder / 'auth.db'}\n"
            f"admin_username = admin\nadmin_password = {admin[1]}\nauth_cache_ttl_seconds = {auth_cache_seconds}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
        env.update(MLFLOW_AUTH_CONFIG_PATH=str(folder / "basic_auth.ini"),
                   MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(16))
        command[2:2] = ["--app-name", "basic-auth"]
    log = folder / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=folder)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.5)
        for user, password in (users or {}).items():
            made = requests.post(f"{url}/api/2.0/mlflow/users/create", auth=admin, timeout=60,
                                 json={"username": user, "password": password})
            assert made.status_code == 200, made.text
        yield MlflowServer(url, log, {**dict(users or {}), **({"admin": admin[1]} if admin else {})})
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:  # a loaded machine: workers slow to stop
            process.kill()
            process.wait(timeout=20)


class FaultyProxy:
    """An HTTP proxy in front of a real server that answers ``status`` to the requests
    ``refuse`` names (``{("POST", "/api/2.0/mlflow/registered-models/alias")}``) and forwards
    everything else: a registry that fails one call half-way through a release."""

    def __init__(self, target: str, refuse: set[tuple[str, str]], status: int = 403) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        proxy = self
        self.refuse, self.status, self.refused = set(refuse), status, []
        target_parts = urlsplit(target)

        class Handler(BaseHTTPRequestHandler):
            def _relay(self) -> None:
                import http.client

                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?", 1)[0]
                if (self.command, path) in proxy.refuse:
                    proxy.refused.append(f"{self.command} {path}")
                    text = b"Permission denied"
                    self.send_response(proxy.status)
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                    return
                connection = http.client.HTTPConnection(target_parts.hostname, target_parts.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                connection.close()

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _relay

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
