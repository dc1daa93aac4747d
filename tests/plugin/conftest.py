"""A real Airflow API server (``airflow api-server``, the simple auth manager, SQLite) with the
onnxcast plugin loaded from its ``airflow.plugins`` entry point, over a rollout store made by
the real promote/rollback functions and a real MLflow registry (SQLite), once per session.

The entry point comes from the installed onnxcast distribution (``pip install -e .``, as
``make install`` does). A development venv installed before the plugin existed lacks it: then
a throwaway distribution holding exactly the entry points of pyproject.toml's
``airflow.plugins`` table is put on the server's PYTHONPATH, so what is declared is what loads.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = "onnxcast.airflow.plugin:OnnxcastPlugin"
HOSTILE_REASON = '<script>alert("owned")</script> rollback after a bad week'
START_TIMEOUT_S = 90


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plugin_entry_points(site: Path) -> str | None:
    """A PYTHONPATH entry with the ``airflow.plugins`` entry points of pyproject.toml when the
    installed distribution does not declare the plugin; None when it does."""
    if any(ep.value == PLUGIN for ep in entry_points(group="airflow.plugins")):
        return None
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["airflow.plugins"]
    info = site / "onnxcast_plugin_entry_points-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxcast-plugin-entry-points\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text("[airflow.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    return str(site)


@pytest.fixture(scope="session")
def rollout_store(tmp_path_factory, release_key, tiny_onnx) -> str:
    """m: edge promoted to 1 then 2 and rolled back to 1 (a hostile reason); cloud at 2; canary a
    planted, unsigned pointer. Both
    versions registered in MLflow, version 1 with the rollout tag of part A and the monitor tag
    of part B on edge."""
    import onnx
    from mlflow import MlflowClient

    from onnxcast.base.files import sha256_bytes
    from onnxcast.rollout.promote import promote, rollback

    home = tmp_path_factory.mktemp("rollout-page")
    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("m")
    env = {"ONNXCAST_SIGNING_KEY": str(release_key["private"]), "ONNXCAST_TRUST": str(release_key["root"])}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        for tag, version in (("a", "1"), ("b", "2")):
            client.create_model_version("m", source=str(home / "artifacts"))
            run = home / f"run-{tag}"
            variants = []
            for name in ("fp32", "fp32-opt"):
                proto = onnx.load(tiny_onnx)
                for prop in proto.metadata_props:
                    if prop.key == "onnxcast.trained_until":
                        prop.value = f"2026-01-01T00:00:00Z/{tag}"
                path = run / "models" / "lstm" / "onnx" / f"{name}.onnx"
                path.parent.mkdir(parents=True, exist_ok=True)
                onnx.save(proto, path)
                variants.append({"name": name, "onnx_path": str(path.relative_to(run)),
                                 "sha256": sha256_bytes(path.read_bytes()), "size_bytes": path.stat().st_size,
                                 "opset": 18, "parity_max_abs_diff": 1e-6, "eligible": True, "reasons": [],
                                 "holdout": {"mae": 1.0, "rmse": 1.5, "smape": 2.0, "mase": 0.9}})
            report = {"onnxcast_version": "0.1.0", "created": "2026-11-29T00:00:00Z", "status": "passed",
                      "dataset": {"uri": "example.csv", "freq": "h", "target": "y", "features": ["x1"]},
                      "models": [{"family": "lstm", "gates_passed": True, "variants": variants}],
                      "selected": {"edge": {"family": "lstm", "variant": "fp32-opt"},
                                   "cloud": {"family": "lstm", "variant": "fp32"}},
                      "mlflow": {"model": "m", "version": version, "run_id": f"run{tag}"}}
            (run / "report.json").write_text(json.dumps(report))
            promote(run / "report.json", str(home / "store"), "m", ["edge", "cloud"], version=version,
                    actor=f"airflow:onnxcast_promote/manual_{tag} (admin)", reason=f"release {version}")
        rollback(str(home / "store"), "m", "edge", actor="airflow:onnxcast_rollback/manual (admin)",
                 reason=HOSTILE_REASON)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    # a pointer planted by someone who can write the store but holds no key: version 1 claimed
    # for channel canary with cloud's signatures
    planted = json.loads((home / "store" / "m" / "channels" / "cloud.json").read_bytes())
    planted["signed"].update(channel="canary", version="1")
    (home / "store" / "m" / "channels" / "canary.json").write_text(json.dumps(planted))
    client.set_model_version_tag("m", "1", "onnxcast.rollout.edge", json.dumps(
        {"state": "deployed", "at": "2026-12-01T10:00:00Z", "reason": "rolled back by onnxcast_rollback"}))
    client.set_model_version_tag("m", "1", "onnxcast.monitor.edge", json.dumps(
        {"at": "2026-12-01T11:00:00Z", "mase": 0.97, "holdout_mase": 0.9, "holdout_ci": [0.8, 1.0],
         "p_value": 0.21, "degraded": False, "drift": [], "origins": 12, "from": "2026-11-01", "to": "2026-11-30"}))
    return str(home)


@pytest.fixture(scope="session")
def airflow_api(tmp_path_factory, rollout_store, release_key):
    """``airflow api-server`` on a free loopback port; yields {"url", "user", "password"}."""
    home = tmp_path_factory.mktemp("airflow-ui")
    airflow_home = home / "airflow"
    airflow_home.mkdir()
    password = secrets.token_urlsafe(16)
    passwords = airflow_home / "passwords.json"
    passwords.write_text(json.dumps({"admin": password}))
    passwords.chmod(0o600)
    port = _free_port()
    site = _plugin_entry_points(home / "site")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AIRFLOW", "ONNXCAST_"))}
    env.update({
        "AIRFLOW_HOME": str(airflow_home), "AIRFLOW_CONFIG": str(REPO / "airflow.cfg"),
        "ONNXCAST_HOME": str(home / "onnxcast"), "ONNXCAST_REPO": str(REPO),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32), "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "SCARF_ANALYTICS": "false", "DO_NOT_TRACK": "true",
        "ONNXCAST_STORE_URI": f"{rollout_store}/store", "ONNXCAST_TRUST": str(release_key["root"]),
        "AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps({"conn_type": "mlflow", "extra": {
            "tracking_uri": f"sqlite:///{rollout_store}/mlflow.db", "ui_url": "http://mlflow.example:5000"}}),
        "PYTHONPATH": os.pathsep.join(p for p in (site, str(REPO), os.environ.get("PYTHONPATH")) if p),
    })
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=120)
    log = (home / "api-server.log").open("wb")
    server = subprocess.Popen([airflow, "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"airflow api-server did not start: {(home / 'api-server.log').read_text()[-3000:]}") from None
                time.sleep(0.5)
        yield {"url": url, "user": "admin", "password": password, "log": home / "api-server.log"}
    finally:
        import signal

        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.fixture(scope="session")
def api_token(airflow_api) -> str:
    """A JWT from the simple auth manager's ``POST /auth/token`` (what API clients use)."""
    request = urllib.request.Request(f"{airflow_api['url']}/auth/token", method="POST",
                                     data=json.dumps({"username": airflow_api["user"],
                                                      "password": airflow_api["password"]}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["access_token"]
